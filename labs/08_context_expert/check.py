"""Host-side checks of the context- and expert-parallel lab's settings (no torch): fail in one
line before launch. That the degrees fit the ranks is checked by the frame (settings.parallel)."""

from plscale.errors import UserError
from plscale.predict.errors import PredictionError
from plscale.predict import context_parallel as cp_predict
from plscale.predict.presets import preset

RANKS = (2, 4, 8)  # lab.yaml's allowed rank counts


def check(settings: dict, topology) -> None:
    model, ds, train = settings["model"], settings["ds"], settings["train"]
    config = preset(model["preset"])
    if not 8 <= model["seq"] <= config.max_seq:
        raise UserError(f"model.seq {model['seq']}: use 8 to {config.max_seq} for preset {model['preset']!r}.")
    for key, least in (("steps", 2), ("parity_steps", 0)):
        if not isinstance(train[key], int) or train[key] < least:
            raise UserError(f"train.{key} {train[key]!r}: use a whole number of at least {least}"
                            f"{' (--steps 2 or more)' if key == 'steps' else ''}.")
    if ds["precision"] != "fp32" or ds["grad_clip"]:
        raise UserError("Keep ds.precision=fp32 and ds.grad_clip=0: the lab compares every parallel run with its "
                        "unsharded reference step by step.")
    if ds["stage"] > 2:
        raise UserError(f"ds.stage {ds['stage']}: use ZeRO stages 0-2 (DeepSpeed MoE does not run under ZeRO-3).")
    cp, ep = settings["parallel"].get("cp", 1), settings["parallel"].get("ep", 1)
    if cp > 1 and ep > 1:
        raise UserError(f"parallel.cp {cp} and parallel.ep {ep}: the lab splits sequences (ring-attention, ulysses) "
                        f"or experts (moe, moe-deepspeed), one at a time; leave the other at 1.")
    if ep > 1:
        _check_experts(settings["experts"], ep, ds)
    elif cp > 1:
        _check_context(settings["cp"], config, model["seq"], cp)
    else:
        raise UserError("parallel.cp 1 and parallel.ep 1: the lab splits sequences or experts over 2 or more ranks; "
                        "use parallel.cp=world (ring-attention, ulysses) or parallel.ep=world (moe, moe-deepspeed).")


def _check_context(opts: dict, config, seq: int, cp: int) -> None:
    if opts["attention"] not in ("ring", "ulysses"):
        raise UserError(f"cp.attention {opts['attention']!r}: use ring or ulysses.")
    if opts["split"] not in cp_predict.SPLITS:
        raise UserError(f"cp.split {opts['split']!r}: use zigzag or plain.")
    if opts["attention"] == "ulysses":
        if opts["split"] != "plain":
            raise UserError("cp.split: Ulysses gathers the whole sequence in order, so it takes the plain split; "
                            "use cp.split=plain (zig-zag is for ring attention).")
        ok = [str(n) for n in RANKS if config.heads % n == 0 and config.kv_heads % n == 0]
        if config.heads % cp or config.kv_heads % cp:
            raise UserError(f"Ulysses splits the heads over the ranks: {config.heads} heads and {config.kv_heads} "
                            f"key/value heads do not split {cp} ways; use --gpus {' or '.join(ok) or '1'}, "
                            f"or ring attention (ring-attention).")
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
        except PredictionError as exc:                  # worded with the setting the user typed
            raise exc.named({"seq": name}) from None


def _check_experts(opts: dict, ep: int, ds: dict) -> None:
    if opts["impl"] not in ("hand", "deepspeed"):
        raise UserError(f"experts.impl {opts['impl']!r}: use hand or deepspeed.")
    count = opts["count"]
    if not isinstance(count, int) or count < 1 or count % ep:
        raise UserError(f"experts.count {count!r} does not split over ep {ep} ranks: use a multiple of {ep}, "
                        f"e.g. experts.count={2 * ep}.")
    if opts["top_k"] not in (1, 2) or opts["top_k"] > count:
        raise UserError(f"experts.top_k {opts['top_k']!r}: use 1 or 2 (DeepSpeed's gates), at most experts.count.")
    if not isinstance(opts["capacity_sweep"], list) or not opts["capacity_sweep"]:
        raise UserError(f"experts.capacity_sweep {opts['capacity_sweep']!r}: give a list, e.g. [1.0, 2.0].")
    for name, factor in [("capacity_factor", opts["capacity_factor"])] + [("capacity_sweep", f)
                                                                           for f in opts["capacity_sweep"]]:
        if not isinstance(factor, (int, float)) or factor <= 0:
            raise UserError(f"experts.{name}: capacity factor {factor!r}; use a number above 0 (1.0 gives each "
                            f"expert its even share of the tokens; 1.25 is common).")
    if not isinstance(opts["min_capacity"], int) or opts["min_capacity"] < 0:
        raise UserError(f"experts.min_capacity {opts['min_capacity']!r}: use a whole number of 0 or more.")
    if not isinstance(opts["aux_weight"], (int, float)) or opts["aux_weight"] < 0:
        raise UserError(f"experts.aux_weight {opts['aux_weight']!r}: use 0 (no load balancing) or more; 0.01 is common.")
    if opts["impl"] == "hand" and ds["stage"]:
        raise UserError(f"ds.stage {ds['stage']}: the MoE layers by hand train at ZeRO 0 (ZeRO 1 and 2 reduce "
                        f"gradients inside DeepSpeed's optimizer, which knows only its own MoE layers); use "
                        f"ds.stage=0, or the moe-deepspeed variant.")
