"""Check a DeepSpeed config: plscale's own rules (each problem one line with the numbers
and the fix), then DeepSpeed's own parser with the world size set to `--gpus N`."""

import json
from pathlib import Path

from plscale.dsconfig import valid
from plscale.errors import UserError, nearest

SECTIONS = {"zero_optimization", "fp16", "bf16", "optimizer", "scheduler", "activation_checkpointing",
            "flops_profiler", "comms_logger", "pipeline", "tensor_parallel", "tensorboard", "wandb",
            "csv_monitor", "aio", "amp", "checkpoint", "data_types", "data_efficiency", "elasticity",
            "autotuning", "compression_training", "sparse_attention", "curriculum_learning", "nebula",
            "monitor_config", "torch_autocast", "compile", "timers", "weight_quantization"}


def load(path: str | Path) -> dict:
    """Read a JSON config; an unreadable or malformed file is a UserError."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise UserError(f"Cannot read DeepSpeed config {path}: {exc.strerror}. Check the path.") from None
    try:
        config = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UserError(f"{path} is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}. "
                        f"Fix the file (or regenerate it with `plscale config new`).") from None
    if not isinstance(config, dict):
        raise UserError(f"{path} must hold a JSON object, not {type(config).__name__}.")
    return config


def rule_problems(config: dict, world_size: int, label: str = "world size") -> list[str]:
    """plscale's own rules, each problem one line naming the numbers and the fix. world_size:
    the data-parallel ranks (`label` names them: with pipeline stages they are fewer)."""
    problems = []
    micro = config.get("train_micro_batch_size_per_gpu")
    accum = config.get("gradient_accumulation_steps", 1)
    total = config.get("train_batch_size")
    for name, value in (("train_micro_batch_size_per_gpu", micro), ("gradient_accumulation_steps", accum),
                        ("train_batch_size", total)):
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
            problems.append(f"{name} is {value!r}: it must be a whole number of at least 1.")
    if not problems and total is not None and micro is not None and total != micro * accum * world_size:
        problems.append(
            f"train_batch_size {total} != micro batch {micro} x accumulation {accum} x {label} "
            f"{world_size} = {micro * accum * world_size}: set train_batch_size to "
            f"{micro * accum * world_size} or drop it and let DeepSpeed derive it.")
    if total is None and micro is None:
        problems.append("Neither train_batch_size nor train_micro_batch_size_per_gpu is set: set one.")
    if not problems and total is not None and micro is None and total % (accum * world_size):
        problems.append(f"train_batch_size {total} is not divisible by accumulation {accum} x {label} "
                        f"{world_size}: choose a multiple of {accum * world_size}.")
    problems += valid.problems(**valid.zero_settings(config))  # stage, precision and offload together
    problems += valid.section_problems(config)  # fp16, bf16, torch_autocast; fp16's loss scaling
    clip = config.get("gradient_clipping", 0)
    if not isinstance(clip, (int, float)) or clip < 0:
        problems.append(f"gradient_clipping is {clip!r}: use 0 (off) or a positive number.")
    known = SECTIONS | _deepspeed_keys()
    for key in config:
        if key not in known:
            close = nearest(key, known, n=1)
            if close:
                problems.append(f"Unknown key {key!r}: DeepSpeed ignores it. Did you mean {close[0]!r}?")
    return problems


def _quiet_accelerator() -> None:
    """Without GPUs, tell DeepSpeed so up front rather than have it warn while it guesses."""
    import os

    from plscale.hardware import cuda_gpus

    if not cuda_gpus():
        os.environ.setdefault("DS_ACCELERATOR", "cpu")


def _deepspeed_keys() -> set:
    _quiet_accelerator()
    try:
        from deepspeed.runtime import constants
    except ImportError:
        return set()
    return {v for k, v in vars(constants).items() if k.isupper() and isinstance(v, str) and "_" in v}


def deepspeed_problem(config: dict, world_size: int) -> str | None:
    """Parse with DeepSpeed's own DeepSpeedConfig, as if `world_size` ranks were running."""
    from unittest import mock

    _quiet_accelerator()
    from deepspeed.runtime import config as ds_config

    try:
        with mock.patch.object(ds_config.dist, "get_rank", lambda *a, **k: 0), \
             mock.patch.object(ds_config.dist, "get_world_size", lambda *a, **k: world_size):
            ds_config.DeepSpeedConfig(dict(config))
    except Exception as exc:  # DeepSpeed raises assertions, ValueErrors and pydantic errors
        return "DeepSpeed rejects it: " + " ".join(str(exc).split())[:400]
    return None


def check(config: dict, world_size: int, label: str = "world size") -> list[str]:
    problems = rule_problems(config, world_size, label)
    if not problems:
        problem = deepspeed_problem(config, world_size)
        if problem:
            problems.append(problem)
    return problems
