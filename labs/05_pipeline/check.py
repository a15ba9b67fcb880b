"""Host-side checks of the pipeline lab's settings (no torch): fail in one line before launch.
That the stages divide the ranks is checked by the frame (settings.parallel)."""

from plscale.errors import UserError
from plscale.predict.presets import preset

SCHEDULES = {"plscale": ("gpipe", "1f1b"), "deepspeed": ("1f1b",), "torch": ("gpipe", "1f1b", "interleaved")}


def check(settings: dict, topology) -> None:
    pipe, ds, model = settings["pipeline"], settings["ds"], settings["model"]
    config = preset(model["preset"])
    p, engine, schedule = settings["parallel"].get("pp", 1), pipe["engine"], pipe["schedule"]
    if engine not in SCHEDULES:
        raise UserError(f"pipeline.engine {engine!r}: use plscale, deepspeed or torch.")
    if schedule not in SCHEDULES[engine]:
        raise UserError(f"pipeline.schedule {schedule!r} is not one the {engine} engine runs: use "
                        f"{' or '.join(SCHEDULES[engine])}.")
    v = pipe["virtual"] if schedule == "interleaved" else 1
    if schedule == "interleaved":
        whole("pipeline.virtual", v, 2, "(stages per rank: interleaving needs 2 or more)")
    stages = p * v
    if stages > config.layers:
        raise UserError(f"{stages} pipeline stages for {config.layers} layers of preset {model['preset']!r}: "
                        f"use at most {config.layers} stages (parallel.pp x pipeline.virtual), or a deeper preset.")
    if engine != "deepspeed" and config.layers % stages:
        raise UserError(f"{config.layers} layers do not split evenly into {stages} stages: pick a stage count "
                        f"that divides {config.layers}.")
    if pipe["partition"] not in ("uniform", "parameters"):
        raise UserError(f"pipeline.partition {pipe['partition']!r}: use uniform or parameters (DeepSpeed's methods).")
    whole("train.steps", settings["train"]["steps"], 1)
    whole("train.parity_steps", settings["train"]["parity_steps"], 0)
    whole("bubble.steps", settings["bubble"]["steps"], 2, "(the first warms up)")
    whole("memory.census_step", settings["memory"]["census_step"], 0)
    counts = settings["bubble"]["micro_batches"]
    if not isinstance(counts, list) or not counts:
        raise UserError(f"bubble.micro_batches {counts!r}: give a list such as [1,2,4,8,16].")
    if schedule == "interleaved" and p < 2:
        raise UserError("Interleaving needs a pipeline of 2 or more ranks: --set parallel.pp=2.")
    for count in [ds["grad_accum"], *counts]:
        whole("micro-batches (ds.grad_accum, bubble.micro_batches)", count, 1)
        if engine == "torch" and schedule == "1f1b" and count < p:
            raise UserError(f"{count} micro-batches for {p} stages: torch's Schedule1F1B needs at least one per stage; "
                            f"use {p} or more (ds.grad_accum, bubble.micro_batches).")
        if schedule == "interleaved" and count % p:
            raise UserError(f"{count} micro-batches do not divide into rounds of {p} stages, as the interleaved "
                            f"schedule here takes them: use a multiple of {p} (ds.grad_accum, bubble.micro_batches).")
    if ds["stage"] != 0 or ds["precision"] != "fp32":
        raise UserError("The pipeline lab runs ZeRO stage 0 in fp32 (ds.stage=0, ds.precision=fp32): every engine "
                        "is compared with an unpipelined fp32 model.")
    if ds["grad_clip"]:
        raise UserError("Keep ds.grad_clip=0 here: plscale's and torch's engines do not clip, and the lab compares "
                        "them with an unpipelined model step by step.")
    if not 8 <= model["seq"] <= config.max_seq:
        raise UserError(f"model.seq {model['seq']}: use 8 to {config.max_seq} for preset {model['preset']!r}.")


def whole(name: str, value, least: int, why: str = "") -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < least:
        raise UserError(f"{name} {value!r}: use a whole number of at least {least}{' ' + why if why else ''}.")
