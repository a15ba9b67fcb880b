"""Checks of the debugging lab's settings (no torch): fail in one line before launch."""

import platform

from plscale.errors import UserError
from plscale.predict.presets import PRESETS

LEVELS = ("", "OFF", "INFO", "DETAIL")  # torch's TORCH_DISTRIBUTED_DEBUG


def check(settings: dict, topology) -> None:
    train, debug, knobs = settings["train"], settings["debug"], settings["dist"]
    for key in ("steps", "micro_batch"):
        if train[key] < 1:
            raise UserError(f"train.{key} {train[key]}: use 1 or more.")
    if not -topology.world_size <= debug["rank"] < topology.world_size:
        raise UserError(f"debug.rank {debug['rank']}: there are {topology.world_size} ranks; use 0 to "
                        f"{topology.world_size - 1}, or -1 for the last.")
    if not 0 <= debug["step"] <= train["steps"]:
        raise UserError(f"debug.step {debug['step']}: the run has {train['steps']} steps (train.steps); use 1 to "
                        f"{train['steps']}, or run more steps with --steps.")
    if debug["slow_ms"] < 0 or debug["pace"] < 1:
        raise UserError("debug.slow_ms takes 0 or more milliseconds, debug.pace a factor of 1 or more.")
    if knobs["timeout_s"] <= 0:
        raise UserError(f"dist.timeout_s {knobs['timeout_s']}: use a positive number of seconds, such as 20.")
    if knobs["debug"] is not False and str(knobs["debug"]).upper() not in LEVELS:  # YAML reads OFF as false
        raise UserError(f"dist.debug {knobs['debug']!r}: use OFF, INFO or DETAIL (TORCH_DISTRIBUTED_DEBUG).")
    if topology.entry == "oom.py":
        _check_oom(settings, topology)


def _check_oom(settings: dict, topology) -> None:
    oom, steps = settings["oom"], settings["train"]["steps"]
    if steps < 3:
        raise UserError(f"train.steps {steps}: the oom runs take 3 or more (the first step has no Adam moments yet, "
                        f"the last is recorded with the limit lifted): use --steps 3.")
    if oom["limit_mib"] <= 0:
        raise UserError(f"oom.limit_mib {oom['limit_mib']}: use a positive number of MiB, such as 160.")
    if oom["model"] not in PRESETS:
        raise UserError(f"oom.model {oom['model']!r}: use one of the presets {', '.join(PRESETS)}.")
    if oom["offload"] and oom["fsdp2"]:
        raise UserError("oom.offload with oom.fsdp2: the oom runs offload a replica's optimizer (ZeRO-Offload by hand); "
                        "choose one of the two fixes.")
    if oom["recompute"] not in ("none", "selective", "full"):
        raise UserError(f"oom.recompute {oom['recompute']!r}: use none, selective or full.")
    for key in ("seq", "micro_batch", "grad_accum"):
        if oom[key] < 1:
            raise UserError(f"oom.{key} {oom[key]}: use 1 or more.")
    if topology.profile is not None:
        raise UserError("--profile: the oom runs record their last step with the allocator's history, itself "
                        "torch.profiler, and a profiler's buffers would count against the limit: leave --profile out.")
    if topology.device == "cpu" and platform.libc_ver()[0] != "glibc":
        raise UserError("The oom runs limit a CPU rank's memory with Linux's RLIMIT_DATA and glibc's mallopt: run "
                        "them on Linux with glibc (not macOS, not musl), or on GPUs.")
