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
    if schedule == "interleaved" and v < 2:
        raise UserError(f"pipeline.virtual {pipe['virtual']}: interleaving needs 2 or more stages per rank.")
    stages = p * v
    if stages > config.layers:
        raise UserError(f"{stages} pipeline stages for {config.layers} layers of preset {model['preset']!r}: "
                        f"use at most {config.layers} stages (parallel.pp x pipeline.virtual), or a deeper preset.")
    if engine != "deepspeed" and config.layers % stages:
        raise UserError(f"{config.layers} layers do not split evenly into {stages} stages: pick a stage count "
                        f"that divides {config.layers}.")
    if pipe["partition"] not in ("uniform", "parameters"):
        raise UserError(f"pipeline.partition {pipe['partition']!r}: use uniform or parameters (DeepSpeed's methods).")
    m = ds["grad_accum"]
    for count in [m, *settings["bubble"]["micro_batches"]]:
        if not isinstance(count, int) or count < 1:
            raise UserError(f"{count!r} micro-batches: use a whole number of at least 1 (ds.grad_accum, "
                            f"bubble.micro_batches).")
        if engine == "torch" and schedule == "1f1b" and count < p:
            raise UserError(f"{count} micro-batches for {p} stages: torch's Schedule1F1B needs at least one per stage; "
                            f"use {p} or more (ds.grad_accum, bubble.micro_batches).")
        if schedule == "interleaved" and count % p:
            raise UserError(f"{count} micro-batches do not divide into rounds of {p} stages, as interleaving "
                            f"needs: use a multiple of {p} (ds.grad_accum, bubble.micro_batches).")
    if ds["stage"] != 0 or ds["precision"] != "fp32":
        raise UserError("The pipeline lab runs ZeRO stage 0 in fp32 (ds.stage=0, ds.precision=fp32): every engine "
                        "is compared with an unpipelined fp32 model.")
    if ds["grad_clip"]:
        raise UserError("Keep ds.grad_clip=0 here: plscale's and torch's engines do not clip, and the lab compares "
                        "them with an unpipelined model step by step.")
    if not 8 <= model["seq"] <= config.max_seq:
        raise UserError(f"model.seq {model['seq']}: use 8 to {config.max_seq} for preset {model['preset']!r}.")
    steps = settings["train"]["steps"]
    if steps < 1 or not 0 <= settings["train"]["parity_steps"] <= steps:
        raise UserError(f"train.steps {steps}, train.parity_steps {settings['train']['parity_steps']}: use 1 or "
                        f"more steps, and at most as many parity steps.")
    if not 0 <= settings["memory"]["census_step"] < steps:
        raise UserError(f"memory.census_step {settings['memory']['census_step']}: use 0 to {steps - 1}.")
    if settings["bubble"]["steps"] < 2:
        raise UserError(f"bubble.steps {settings['bubble']['steps']}: use 2 or more (the first warms up).")
