"""Which ZeRO stage, precision and offload combinations exist: the one list of rules.

Pure: every caller asks here and decides what a problem means to it. The config checker
(`check.py`) collects them beside its other problems; the spec (`DSSpec.validate`) and the
memory model (`Setup.validate`) raise the first as a UserError.

    stage              0, 1, 2 or 3
    precision          fp32, bf16 or fp16 (one of them: a config enabling fp16 and bf16 is a conflict)
    optimizer offload  stages 1-3: ZeRO-Offload moves the partitioned optimizer states and
                       their step to the host; stage 0 partitions nothing to move
    parameter offload  stage 3 only: the parameters must be partitioned to be offloaded

`zero_settings` reads the same four out of a DeepSpeed config dict, with the names the
spec and the memory model use (stage, precision, offload_optimizer, offload_param). The
precision is the weights': a "torch_autocast" config keeps fp32 weights (only the ops run in
16 bits), so it reads fp32.

fp16's loss scaling (DeepSpeed's fp16 section; `loss_scaling_problems`, DeepSpeed's defaults):
    loss_scale           0 (dynamic), or a static scale of 1 (none) or more
    initial_scale_power  dynamic scaling starts at 2^this: 0 or more (a scale below 1 shrinks
                         the gradients, so more of them underflow). Only dynamic scaling reads it:
                         with a static loss_scale (1: none) a power below DeepSpeed's default 16
                         asks for something that cannot happen, and is refused (the default, or a
                         larger power, reads as a setting left over from dynamic scaling)
    loss_scale_window, hysteresis, min_loss_scale   whole numbers of at least 1

Which path runs fp16 (`fp16_path`, by device and stage; the host's checks and the ranks ask it):
    DeepSpeed's fp16 section   on GPUs at ZeRO 1-3: fp16 weights, fp32 master copy, its loss scaler
    DeepSpeed's torch_autocast on CPUs (DeepSpeed's CPU accelerator has fp16 only with oneDNN fp16
                               kernels, which laptop CPUs lack: it refuses the fp16 section), and at
                               ZeRO 0 (DeepSpeed 0.19's engine.backward does not scale the loss its
                               fp16 optimizer's step unscales, deepspeedai/DeepSpeed#8393)
A config's sections together (`section_problems`): one of fp16, bf16 and torch_autocast; the
fp16 section's loss scaling; and no fp16 section on a CPU (`fp16_section_problem`).
"""

from plscale.errors import UserError

STAGES = (0, 1, 2, 3)
PRECISIONS = ("fp32", "bf16", "fp16")
AUTOCAST_DTYPES = {"bf16": "torch.bfloat16", "fp16": "torch.float16"}  # DeepSpeed's torch_autocast.dtype
LOSS_SCALING = {"loss_scale": 0, "initial_scale_power": 16, "loss_scale_window": 1000, "hysteresis": 2,
                "min_loss_scale": 1}  # DeepSpeed's fp16 section: its keys and defaults
DEFAULT_POWER = LOSS_SCALING["initial_scale_power"]
AUTOCAST = "fp16 runs as DeepSpeed's torch_autocast: fp32 weights, fp16 ops, torch's GradScaler"


def problems(stage, precision: str = "fp32", offload_optimizer: bool = False,
             offload_param: bool = False) -> list[str]:
    """Each problem one line: what is wrong and the fix. Empty when the combination exists."""
    out = []
    if stage not in STAGES or isinstance(stage, bool):
        out.append(f"ZeRO stage {stage!r} does not exist: use 0, 1, 2 or 3.")
    if precision not in PRECISIONS:
        out.append(f"Precision {precision!r} is not one of {', '.join(PRECISIONS)}.")
    if offload_param and stage != 3:
        out.append(f"Parameter offload needs ZeRO stage 3 (got stage {stage!r}): use stage 3 or turn "
                   f"parameter offload off.")
    if offload_optimizer and stage == 0:
        out.append("Optimizer offload needs ZeRO stage 1, 2 or 3 (got stage 0): raise the stage or turn "
                   "optimizer offload off.")
    return out


def require(stage, precision: str = "fp32", offload_optimizer: bool = False, offload_param: bool = False) -> None:
    """Raise the first problem as a UserError."""
    found = problems(stage, precision, offload_optimizer, offload_param)
    if found:
        raise UserError(found[0])


def loss_scaling_problems(loss_scale=0, initial_scale_power=16, loss_scale_window=1000, hysteresis=2,
                          min_loss_scale=1) -> list[str]:
    """fp16's loss scaling, each problem one line: what is wrong and the fix."""
    out, number = [], lambda v: isinstance(v, (int, float)) and not isinstance(v, bool)
    if not number(loss_scale) or loss_scale < 0:
        out.append(f"loss_scale {loss_scale!r}: use 0 (dynamic loss scaling) or a static scale of 1 (none) or more.")
    elif 0 < loss_scale < 1:
        out.append(f"loss_scale {loss_scale:g} is a static scale below 1: it shrinks the gradients, so more of them "
                   f"underflow fp16; use 0 (dynamic), 1 (no scaling) or more.")
    if not isinstance(initial_scale_power, int) or isinstance(initial_scale_power, bool):
        out.append(f"initial_scale_power {initial_scale_power!r}: use a whole number, the power of 2 dynamic "
                   f"scaling starts at (DeepSpeed's default 16).")
    elif initial_scale_power < DEFAULT_POWER and number(loss_scale) and loss_scale >= 1:
        tiny = initial_scale_power < 0
        out.append(f"initial_scale_power {initial_scale_power} asks for a {'tiny' if tiny else 'small'} starting "
                   f"scale (2^{initial_scale_power}) while loss_scale {loss_scale:g} turns dynamic scaling off (a "
                   f"static scale; 1 = none), and only dynamic scaling starts from initial_scale_power: drop "
                   f"initial_scale_power (or keep DeepSpeed's default {DEFAULT_POWER}), or use loss_scale 0 " +
                   ("with an initial_scale_power of 0 or more." if tiny else
                    f"to scale dynamically from 2^{initial_scale_power}."))
    elif initial_scale_power < 0:
        out.append(f"initial_scale_power {initial_scale_power} starts the loss scale at 2^{initial_scale_power}, "
                   f"below 1: it shrinks the gradients, so more of them underflow fp16; use 0 or more "
                   f"(DeepSpeed's default 16).")
    for name, value in (("loss_scale_window", loss_scale_window), ("hysteresis", hysteresis)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            out.append(f"{name} {value!r}: use a whole number of steps, 1 or more.")
    if not isinstance(min_loss_scale, int) or isinstance(min_loss_scale, bool) or min_loss_scale < 1:
        out.append(f"min_loss_scale {min_loss_scale!r}: use a whole number, 1 or more (DeepSpeed's fp16 section "
                   f"takes an integer floor for the dynamic scale; default 1).")
    return out


def require_loss_scaling(*args, **kwargs) -> None:
    """Raise the first loss-scaling problem as a UserError."""
    found = loss_scaling_problems(*args, **kwargs)
    if found:
        raise UserError(found[0])


def fp16_kernels(device: str) -> bool:
    """Whether DeepSpeed's fp16 section runs on `device` ("cuda" or "cpu"). DeepSpeed's CPU
    accelerator has it only with oneDNN fp16 kernels, which laptop CPUs lack: plscale never
    counts on them, so the host (which cannot ask torch) and the ranks answer alike."""
    return device != "cpu"


def fp16_path(stage, device: str) -> tuple[bool, str]:
    """(native, why): DeepSpeed's fp16 section where the device has fp16 kernels and ZeRO shards
    (stage 1-3), else DeepSpeed's torch_autocast with fp16."""
    if not fp16_kernels(device):
        return False, (f"DeepSpeed's CPU accelerator has fp16 only with oneDNN fp16 kernels, which laptop CPUs lack "
                       f"('Type fp16 is not supported on your device'), so {AUTOCAST}")
    if stage == 0:
        return False, (f"at ZeRO 0 DeepSpeed's fp16 section does not scale the loss (its engine.backward skips the "
                       f"scaling its optimizer's step undoes: deepspeedai/DeepSpeed#8393), so {AUTOCAST}")
    return True, f"{device} runs fp16: DeepSpeed's fp16 section (fp16 weights, fp32 master copy, its loss scaler)"


def fp16_section_problem(config: dict, device: str) -> str | None:
    """A config with DeepSpeed's fp16 section on a device without fp16 kernels: one line, else None."""
    if not _enabled(config, "fp16") or fp16_kernels(device):
        return None
    return ("DeepSpeed's fp16 section does not run on CPU: DeepSpeed's CPU accelerator has fp16 only with oneDNN "
            "fp16 kernels, which laptop CPUs lack (every rank would stop at 'Type fp16 is not supported on your "
            "device'); use bf16, or lab 09's fp16 variants (plscale lab run fp16), which run fp16 as torch autocast.")


def section_problems(config: dict) -> list[str]:
    """The precision sections of a DeepSpeed config together, each problem one line."""
    out = []
    if _enabled(config, "fp16") and _enabled(config, "bf16"):
        out.append("fp16 and bf16 are both enabled: keep one.")
    for section in ("fp16", "bf16"):
        if _enabled(config, "torch_autocast") and _enabled(config, section):
            out.append(f"torch_autocast and the {section} section are both enabled: keep one (torch_autocast keeps "
                       f"fp32 weights and runs ops in 16 bits; the {section} section makes the weights {section}).")
    if _enabled(config, "fp16"):
        fp16 = config["fp16"]
        out += [f"fp16.{p}" for p in loss_scaling_problems(**{k: fp16[k] for k in LOSS_SCALING if k in fp16})]
    return out


def zero_settings(config: dict) -> dict:
    """stage, precision (the weights'), offload_optimizer and offload_param of a DeepSpeed config dict."""
    zero = config.get("zero_optimization") or {}
    enabled = lambda key: _enabled(config, key)
    return {"stage": zero.get("stage", 0),
            "precision": "fp32" if enabled("torch_autocast") else  # ops in 16 bits, weights in fp32
                         "fp16" if enabled("fp16") else "bf16" if enabled("bf16") else "fp32",
            "offload_optimizer": _offloaded(zero.get("offload_optimizer")),
            "offload_param": _offloaded(zero.get("offload_param"))}


def _enabled(config: dict, section: str) -> bool:
    return isinstance(config.get(section), dict) and bool(config[section].get("enabled"))


def _offloaded(section) -> bool:
    return isinstance(section, dict) and section.get("device", "none") not in ("none", None)
