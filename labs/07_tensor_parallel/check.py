"""Host-side checks of the tensor-parallel lab's settings (no torch): fail in one line before launch.
That tp divides the ranks is checked by the frame (settings.parallel)."""

from plscale.errors import UserError, did_you_mean
from plscale.predict.presets import preset
from plscale.predict.tensor_parallel import check_divisible

PATHS = ("dtensor", "autotp", "megatron")


def check(settings: dict, topology) -> None:
    model, opts, ds = settings["model"], settings["tp"], settings["ds"]
    config = preset(model["preset"])
    tp = settings["parallel"].get("tp", 1)
    if tp < 2:
        raise UserError(f"parallel.tp {tp}: the lab splits the model over 2 or more ranks (it trains the dense "
                        f"model beside it anyway): use parallel.tp=2.")
    check_divisible(config, tp, f"preset {model['preset']!r}")
    if not config.tie_embeddings:
        raise UserError(f"Preset {model['preset']!r} has an untied head; the tensor-parallel Llama ties it to the "
                        f"embedding: use tiny, small, deep, 124m, 350m or 1b.")
    if not 8 <= model["seq"] <= config.max_seq:
        raise UserError(f"model.seq {model['seq']}: use 8 to {config.max_seq} for preset {model['preset']!r}.")
    if opts["sequence_parallel"] and model["seq"] % tp:
        raise UserError(f"model.seq {model['seq']} does not split into {tp} sequence shards: use a multiple of {tp}.")
    if not isinstance(opts["compare"], list):
        raise UserError(f"tp.compare {opts['compare']!r}: give a list, e.g. tp.compare=[dtensor] or tp.compare=[].")
    for name in opts["compare"]:
        if name not in PATHS:
            raise UserError(f"tp.compare: unknown path {name!r}.{did_you_mean(str(name), PATHS)} Use any of "
                            f"{', '.join(PATHS)}, or [] for none.")
    for key, least in (("steps", 2), ("parity_steps", 0)):
        value = settings["train"][key]
        if not isinstance(value, int) or value < least:
            raise UserError(f"train.{key} {value!r}: use a whole number of at least {least}.")
    if not isinstance(opts["compare_steps"], int) or opts["compare_steps"] < 2:
        raise UserError(f"tp.compare_steps {opts['compare_steps']!r}: use 2 or more (the first step warms up).")
    if ds["stage"] > 2:
        raise UserError(f"ds.stage {ds['stage']}: the tensor-parallel lab runs ZeRO stages 0-2 over the "
                        f"data-parallel groups (ZeRO-3 would split the shards again).")
    if ds["grad_clip"]:
        raise UserError("Keep ds.grad_clip=0 here: the production paths beside the DeepSpeed run step without "
                        "clipping, and the lab compares them step by step.")
    census = settings["memory"]["census_step"]
    if not isinstance(census, int) or not 1 <= census < settings["train"]["steps"]:
        raise UserError(f"memory.census_step {census!r}: use 1 to train.steps - 1 (Adam's moments exist after step 0).")
    if ds["precision"] != "fp32":
        raise UserError("The tensor-parallel lab runs in fp32 (ds.precision=fp32): every path is compared with "
                        "the dense model step by step.")
