"""Host-side checks of the 4D lab's settings (no torch): fail in one line before launch. That
tp x pp x cp divides the ranks is checked by the frame (settings.parallel, plscale.predict.grid)."""

from plscale.errors import UserError
from plscale.predict.context_parallel import check_split
from plscale.predict.errors import PredictionError
from plscale.predict.presets import preset
from plscale.predict.tensor_parallel import check_divisible


def check(settings: dict, topology) -> None:
    model, ds, train, par = settings["model"], settings["ds"], settings["train"], settings["parallel"]
    config = preset(model["preset"])
    tp, pp, cp = par.get("tp", 1), par.get("pp", 1), par.get("cp", 1)
    if par.get("ep", 1) != 1:
        raise UserError(f"parallel.ep {par['ep']}: the 4D lab splits dense layers (tp, pp, cp, dp); leave ep at 1.")
    try:
        check_divisible(config, tp, f"preset {model['preset']!r}")
    except PredictionError as exc:                       # worded with the setting the user typed
        raise UserError(f"parallel.tp {tp}: {exc}") from None
    if not config.tie_embeddings or config.dropout:
        raise UserError(f"Preset {model['preset']!r} has an untied head or dropout; the 4D Llama ties its head to "
                        f"the embedding and drops nothing: use tiny, small or deep.")
    if pp > config.layers or config.layers % pp:
        raise UserError(f"parallel.pp {pp}: preset {model['preset']!r} has {config.layers} layers, which do not "
                        f"split evenly into {pp} stages; use parallel.pp "
                        f"{' or '.join(str(d) for d in range(1, config.layers + 1) if config.layers % d == 0)}.")
    if not 8 <= model["seq"] <= config.max_seq:
        raise UserError(f"model.seq {model['seq']}: use 8 to {config.max_seq} for preset {model['preset']!r}.")
    engine = settings["pipeline"]["engine"]
    if engine not in ("plscale", "deepspeed", "torch"):
        raise UserError(f"pipeline.engine {engine!r}: use plscale or deepspeed (train.py), or run a torchtitan "
                        f"variant (fsdp2-tp2, fsdp2-tp2-pp2) for torch.")
    if engine == "torch" and (cp > 1 or settings["tp"]["sequence_parallel"]):
        raise UserError(f"parallel.cp {cp}{' with tp.sequence_parallel' if settings['tp']['sequence_parallel'] else ''}: "
                        f"the torchtitan variants compose FSDP2, tp and pp; use parallel.cp=1 and "
                        f"tp.sequence_parallel=false, or train.py's variants for context parallelism.")
    if settings["cp"]["split"] not in ("zigzag", "plain"):
        raise UserError(f"cp.split {settings['cp']['split']!r}: use zigzag or plain.")
    try:
        check_split(model["seq"], cp, settings["cp"]["split"])
    except PredictionError as exc:
        raise exc.named({"seq": "model.seq"}) from None
    if settings["tp"]["sequence_parallel"]:
        if tp < 2:
            raise UserError(f"tp.sequence_parallel with parallel.tp {tp}: sequence parallelism splits the tokens "
                            f"over the tp group; use parallel.tp=2 or more, or tp.sequence_parallel=false.")
        if (model["seq"] // cp) % tp:
            raise UserError(f"model.seq {model['seq']}: each rank's {model['seq'] // cp} tokens (seq / cp) do not "
                            f"split over tp {tp} (tp.sequence_parallel); use a multiple of {2 * cp * tp}.")
        if settings["pipeline"]["engine"] != "plscale":
            raise UserError("tp.sequence_parallel: the DeepSpeed pipeline engine here runs without it; use "
                            "pipeline.engine=plscale.")
    m = ds["grad_accum"]
    if not isinstance(m, int) or m < pp:
        raise UserError(f"ds.grad_accum {m!r}: 1F1B needs at least as many micro-batches per step as stages "
                        f"(parallel.pp {pp}); use ds.grad_accum={pp} or more ({2 * pp} keeps the bubble smaller).")
    for key, least in (("steps", 1), ("parity_steps", 1)):
        if not isinstance(train[key], int) or train[key] < least:
            raise UserError(f"train.{key} {train[key]!r}: use a whole number of at least {least}.")
    tol = train["param_tolerance"]
    if not isinstance(tol, (int, float)) or tol <= 0:
        raise UserError(f"train.param_tolerance {tol!r}: give a number above 0, in learning rates (0.05 is 5% of "
                        f"one step's size).")
    if ds["precision"] != "fp32" or ds["grad_clip"]:
        raise UserError("Keep ds.precision=fp32 and ds.grad_clip=0: the lab compares the 4D model with the dense "
                        "one step by step.")
    if ds["stage"] not in (0, 1):
        raise UserError(f"ds.stage {ds['stage']}: the 4D lab shards the optimizer states over dp x cp (ZeRO-1) or "
                        f"not at all; use ds.stage=1 or ds.stage=0.")
