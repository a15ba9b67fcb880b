"""Host-side checks of the context- and expert-parallel lab's settings (no torch): fail in one
line before launch. That the degrees fit the ranks is checked by the frame (settings.parallel)."""

from plscale.errors import UserError
from plscale.predict import context_parallel as cp_predict, experts as ep_predict
from plscale.predict.presets import preset


def check(settings: dict, topology) -> None:
    model, ds, train = settings["model"], settings["ds"], settings["train"]
    config = preset(model["preset"])
    if not 8 <= model["seq"] <= config.max_seq:
        raise UserError(f"model.seq {model['seq']}: use 8 to {config.max_seq} for preset {model['preset']!r}.")
    for key, least in (("steps", 2), ("parity_steps", 0)):
        if not isinstance(train[key], int) or train[key] < least:
            raise UserError(f"train.{key} {train[key]!r}: use a whole number of at least {least}.")
    if ds["precision"] != "fp32" or ds["grad_clip"]:
        raise UserError("Keep ds.precision=fp32 and ds.grad_clip=0: the lab compares every parallel run with its "
                        "unsharded reference step by step.")
    if ds["stage"] > 2:
        raise UserError(f"ds.stage {ds['stage']}: use ZeRO stages 0-2 (DeepSpeed MoE does not run under ZeRO-3).")
    parallel = settings["parallel"]
    if parallel.get("ep", 1) > 1:
        _check_experts(settings["experts"], parallel["ep"])
        if settings["experts"]["impl"] == "hand" and ds["stage"]:
            raise UserError(f"ds.stage {ds['stage']}: the MoE layers by hand train at ZeRO 0 (ZeRO 1 and 2 reduce "
                            f"gradients inside DeepSpeed's optimizer, which knows only its own MoE layers); use "
                            f"ds.stage=0, or the moe-deepspeed variant.")
    else:
        _check_context(settings["cp"], config, model["seq"], parallel.get("cp", 1))


def _check_context(opts: dict, config, seq: int, cp: int) -> None:
    if cp < 2:
        raise UserError(f"parallel.cp {cp}: the lab splits the sequence over 2 or more ranks; use parallel.cp=world.")
    if opts["attention"] not in ("ring", "ulysses"):
        raise UserError(f"cp.attention {opts['attention']!r}: use ring or ulysses.")
    if opts["attention"] == "ulysses":
        if opts["split"] != "plain":
            raise UserError("cp.split: Ulysses gathers the whole sequence in order, so it takes the plain split; "
                            "use cp.split=plain (zig-zag is for ring attention).")
        cp_predict.check_ulysses(config.heads, config.kv_heads, cp)
    for name in ("comm_seqs", "memory_seqs"):
        if not isinstance(opts[name], list) or not opts[name]:
            raise UserError(f"cp.{name} {opts[name]!r}: give a list of sequence lengths, e.g. [256, 512].")
    # every sequence the lab cuts: the training one, and those of the studies (which cut both ways)
    cuts = [("model.seq", seq, opts["split"]), ("cp.balance_seq", opts["balance_seq"], "zigzag")]
    cuts += [(f"cp.{name}", length, "zigzag") for name in ("comm_seqs", "memory_seqs") for length in opts[name]]
    for name, length, split in cuts:
        if not isinstance(length, int) or length < 1:
            raise UserError(f"{name} {length!r}: give a whole number of tokens.")
        try:
            cp_predict.check_split(length, cp, split)
        except UserError as exc:
            raise UserError(f"{name}: {exc}") from None


def _check_experts(opts: dict, ep: int) -> None:
    if opts["impl"] not in ("hand", "deepspeed"):
        raise UserError(f"experts.impl {opts['impl']!r}: use hand or deepspeed.")
    ep_predict.check_experts(opts["count"], ep)
    ep_predict.check_top_k(opts["top_k"], opts["count"])
    if not isinstance(opts["capacity_sweep"], list):
        raise UserError(f"experts.capacity_sweep {opts['capacity_sweep']!r}: give a list, e.g. [1.0, 2.0].")
    for factor in (opts["capacity_factor"], *opts["capacity_sweep"]):
        ep_predict.check_capacity(factor)
    if not isinstance(opts["min_capacity"], int) or opts["min_capacity"] < 0:
        raise UserError(f"experts.min_capacity {opts['min_capacity']!r}: use a whole number of 0 or more.")
