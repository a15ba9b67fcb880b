"""Host-side checks of the recomputation and mixed-precision lab's settings (no torch): fail in
one line before launch."""

from plscale.dsconfig.valid import LOSS_SCALING, fp16_path, loss_scaling_problems
from plscale.errors import UserError, did_you_mean
from plscale.predict.activations import (
    STRATEGIES,
    check_core,
    check_layers,
    check_strategy,
)
from plscale.predict.formats import number_format
from plscale.predict.presets import preset

MAX_SEQ = 2048
RUNS = ("fp32", "bf16", "fp16", "fp16-unscaled")  # precision.py's runs; fp16-unscaled: no loss scaling


def check(settings: dict, topology) -> None:
    model, train = settings["model"], settings["train"]
    config = preset(model["preset"])
    if not isinstance(model["seq"], int) or not 8 <= model["seq"] <= MAX_SEQ:  # RoPE: no table to outgrow
        raise UserError(f"model.seq {model['seq']}: use 8 to {MAX_SEQ} (the math core keeps heads x seq² "
                        f"probabilities per sequence).")
    check_core(model["attention"], "model.attention")  # fused (PyTorch's flash kernel) or math
    if not isinstance(train["steps"], int) or train["steps"] < 2:
        raise UserError(f"train.steps {train['steps']!r}: use a whole number of at least 2 (--steps 2 or more).")
    if not 0 < settings["memory"]["tolerance"] < 1:
        raise UserError(f"memory.tolerance {settings['memory']['tolerance']}: use a fraction such as 0.05.")
    _check_recompute(settings["recompute"], config, model["preset"])
    recorded = min(settings["recompute"]["record_step"], train["steps"] - 1)
    if topology.entry == "recompute.py" and topology.profile == recorded:
        raise UserError(f"--profile {recorded}: step {recorded} is recorded by the allocator's history, itself "
                        f"torch.profiler: profile another step, or move recompute.record_step.")
    _check_precision(settings, topology)


def _check_recompute(opts: dict, config, name: str) -> None:
    strategies, layers = opts["strategies"], opts["layers"]
    if not isinstance(strategies, list) or not strategies:
        raise UserError(f"recompute.strategies {strategies!r}: give a list of strategies, one or more of "
                        f"{', '.join(STRATEGIES)}.")
    for strategy in strategies:  # the memory model's strategies and layer rules (plscale.predict.activations)
        check_strategy(strategy, "recompute.strategies: strategy")
    if len(set(strategies)) < len(strategies):
        raise UserError(f"recompute.strategies {strategies}: name each strategy once.")
    check_layers(layers, config.layers, "recompute.layers", f"preset {name}")
    if not isinstance(opts["record_step"], int) or opts["record_step"] < 0:
        raise UserError(f"recompute.record_step {opts['record_step']!r}: use a step number, 0 or more "
                        f"(the last step is used if the run is shorter).")


def _check_precision(settings: dict, topology) -> None:
    """precision.py's settings, for its variants; fp8.py's formats, for its variant."""
    if topology.entry == "fp8.py":
        _check_fp8(settings["fp8"]["formats"])
    if topology.entry != "precision.py":
        return
    runs, fp16 = settings["precision"]["runs"], settings["fp16"]
    if not isinstance(runs, list) or not runs:
        raise UserError(f"precision.runs {runs!r}: give a list, e.g. [fp32, bf16, fp16] (choices: {', '.join(RUNS)}).")
    for run in runs:
        if run not in RUNS:
            fp8 = "; fp8 has its own variant: plscale lab run fp8" if str(run).startswith(("fp8", "e4m3", "e5m2")) else ""
            raise UserError(f"precision.runs: unknown precision {run!r}.{did_you_mean(str(run), RUNS)} Choose from "
                            f"fp32, bf16, fp16 and fp16-unscaled (fp16 with no loss scaling){fp8}.")
    if len(set(runs)) < len(runs):
        raise UserError(f"precision.runs {runs}: name each precision once.")
    problems = loss_scaling_problems(**{k: fp16[k] for k in LOSS_SCALING})
    if problems:
        raise UserError(f"fp16.{problems[0]}")
    if fp16["loss_scale"] == 1 and {"fp16", "fp16-unscaled"} <= set(runs):
        raise UserError("fp16.loss_scale 1 turns loss scaling off, so the fp16 run would be fp16-unscaled twice: "
                        "use fp16.loss_scale=0 (dynamic), or drop fp16 or fp16-unscaled from precision.runs.")
    native, _ = fp16_path(settings["ds"]["stage"], topology.device)
    if not native and any(run.startswith("fp16") for run in runs):  # torch_autocast: torch's GradScaler
        where = "on CPU" if topology.device == "cpu" else "at ZeRO 0"
        if fp16["loss_scale"] not in (0, 1):
            raise UserError(f"fp16.loss_scale {fp16['loss_scale']:g}: {where} fp16 runs under torch's GradScaler, "
                            f"which has no static scale; use 0 (dynamic) or 1 (none), or DeepSpeed's fp16 section "
                            f"(on GPUs at ZeRO 1-3).")
        if fp16["hysteresis"] != 1:
            raise UserError(f"fp16.hysteresis {fp16['hysteresis']}: {where} fp16 runs under torch's GradScaler, which "
                            f"halves the scale on every overflow; use 1 (hysteresis is DeepSpeed's fp16 section's, on "
                            f"GPUs at ZeRO 1-3).")
        if fp16["min_loss_scale"] != 1:
            raise UserError(f"fp16.min_loss_scale {fp16['min_loss_scale']}: {where} fp16 runs under torch's GradScaler, "
                            f"which has no floor; use 1 (a floor is DeepSpeed's fp16 section's, on GPUs at ZeRO 1-3).")
        if topology.device == "cpu" and settings["ds"]["stage"] != 0:
            raise UserError(f"ds.stage {settings['ds']['stage']}: on CPU fp16 runs as DeepSpeed's torch_autocast, whose "
                            f"loss scale backs off at ZeRO 0 only (at ZeRO 1-3 DeepSpeed skips an overflowing step "
                            f"before it calls the GradScaler's update: the scale never halves, and a scale too large "
                            f"keeps every step skipped); use ds.stage=0, or drop fp16 from precision.runs.")
    tolerance = settings["precision"]["underflow_tolerance"]
    if not isinstance(tolerance, (int, float)) or not 0 < tolerance < 1:
        raise UserError(f"precision.underflow_tolerance {tolerance!r}: use a fraction such as 0.01.")


def _check_fp8(formats) -> None:
    if not isinstance(formats, list) or not formats:
        raise UserError(f"fp8.formats {formats!r}: give a list of formats, e.g. [e4m3, e5m2].")
    for name in formats:
        try:
            number_format(str(name))
        except UserError as exc:
            raise UserError(f"fp8.formats: {exc}") from None
