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
spec and the memory model use (stage, precision, offload_optimizer, offload_param).
"""

from plscale.errors import UserError

STAGES = (0, 1, 2, 3)
PRECISIONS = ("fp32", "bf16", "fp16")


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


def zero_settings(config: dict) -> dict:
    """stage, precision, offload_optimizer and offload_param of a DeepSpeed config dict."""
    zero = config.get("zero_optimization") or {}
    enabled = lambda key: bool((config.get(key) or {}).get("enabled"))  # noqa: E731
    return {"stage": zero.get("stage", 0),
            "precision": "fp16" if enabled("fp16") else "bf16" if enabled("bf16") else "fp32",
            "offload_optimizer": _offloaded(zero.get("offload_optimizer")),
            "offload_param": _offloaded(zero.get("offload_param"))}


def _offloaded(section) -> bool:
    return isinstance(section, dict) and section.get("device", "none") not in ("none", None)
