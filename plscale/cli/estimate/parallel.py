"""`plscale estimate cp`: context parallelism's split, attention work, communication and activations
per rank; `plscale estimate moe`: an MoE layer's capacity, all-to-alls and parameters per rank under
expert parallelism. Both are registered on `plscale estimate` (plscale/cli/estimate/__init__.py)."""

import json
from dataclasses import asdict, replace

import typer
from rich.table import Table

from plscale.cli.flags import speaks_flags
from plscale.cli.output import console
from plscale.errors import UserError
from plscale.predict import context_parallel as cpm
from plscale.predict import experts as moe
from plscale.predict.activations import activation_bytes
from plscale.predict.presets import PRESETS, param_count, preset
from plscale.predict.setup import Setup
from plscale.predict.units import BYTES

CAPACITY_FACTORS = (0.5, 1.0, 1.25, 1.5, 2.0)


@speaks_flags()
def context_parallel(
    name: str = typer.Option("small", "--model", "--preset", "-m", help=f"A model preset: {', '.join(PRESETS)}."),
    seq: int = typer.Option(None, help="Sequence length (default: the preset's, capped at 2048)."),
    cp: int = typer.Option(2, help="Context-parallel degree: ranks sharing each sequence."),
    micro_batch: int = typer.Option(1, help="Sequences per forward/backward."),
    precision: str = typer.Option("bf16", help="bf16, fp16 or fp32: the activations' element size."),
    split: str = typer.Option("zigzag", help="zigzag: 2cp chunks, rank r holds r and 2cp-1-r (balanced); "
                                             "plain: cp chunks in order."),
    as_json: bool = typer.Option(False, "--json", help="Print the split, work, bytes and activations as JSON."),
) -> None:
    """Context parallelism per rank: its tokens, causal attention work, bytes sent, activations.

    Causal work per rank in query-key scores: plain split max/min -> 2cp-1,
    zig-zag 1. Per attention layer and micro-batch, block B = b(s/cp)a_kv*d*e:
    ring attention sends 2(cp-1)B forward (k, v) and (4(cp-1)+2)B backward
    (k, v with dk, dv, then dk, dv home): about constant as cp grows, and it
    overlaps with attention. DeepSpeed-Ulysses: 4 all-to-alls each way (q, k,
    v, out) of b(s/P)(a or a_kv)d*e, (P-1)/P of each sent: falls as 1/P;
    needs P to divide the heads. Activations: every term for s/cp tokens.
    See plscale/predict/context_parallel.py.
    """
    config = preset(name)
    if precision not in BYTES:
        raise UserError(f"--precision {precision!r}: use bf16, fp16 or fp32.")
    if cp < 1:
        raise UserError(f"--cp {cp}: context parallelism needs at least 1 rank; use --cp 2 or more.")
    if micro_batch < 1:
        raise UserError(f"--micro-batch {micro_batch}: a micro-batch has at least one sequence.")
    if seq is not None and seq < 1:
        raise UserError(f"--seq {seq}: a sequence has at least one token; try --seq {min(config.max_seq, 2048)}.")
    seq = seq or min(config.max_seq, 2048)
    cpm.check_split(seq, cp, split)
    e, L = BYTES[precision], config.layers

    n = 2 * cp if split == "zigzag" else cp
    size = seq // n
    work = {"plain": cpm.attention_work(seq, cp, "plain")}
    work["zigzag"] = cpm.attention_work(seq, cp, "zigzag") if seq % (2 * cp) == 0 else None
    ring = cpm.ring_bytes(micro_batch, seq, cp, config.kv_heads, config.head_dim, e)
    try:
        uly, note = cpm.ulysses_bytes(micro_batch, seq, cp, config.heads, config.kv_heads, config.head_dim, e), ""
    except UserError as exc:
        uly, note = None, f"Ulysses does not apply: {exc}"
    cps = sorted({2**k for k in range(1, cp.bit_length()) if 2**k <= cp} | {max(cp, 2)})
    growth = cpm.comm_table(config, micro_batch, [seq, 2 * seq, 4 * seq], cps, e)
    dense = Setup(params=param_count(config), model=config, seq=seq, micro_batch=micro_batch, precision=precision)
    act = {"without_cp": activation_bytes(dense),
           "with_cp": activation_bytes(replace(dense, cp=cp))}

    if as_json:
        typer.echo(json.dumps({
            "preset": name, "seq": seq, "cp": cp, "micro_batch": micro_batch, "precision": precision,
            "split": split, "chunk_tokens": size,
            "ranks": [{"rank": r, "chunks": cpm.chunks(cp, r, split), "tokens": seq // cp} for r in range(cp)],
            "work": {**work, "imbalance": {k: cpm.imbalance(w) if w else None for k, w in work.items()}},
            "ring": {**asdict(ring), "total": ring.total, "per_step": L * ring.total},
            "ulysses": None if uly is None else {
                "degree": uly.degree, "calls_per_phase": uly.calls, "message_q": uly.message_q,
                "message_kv": uly.message_kv, "forward_message": uly.forward_message,
                "forward_sent": uly.forward_sent, "backward_message": uly.backward_message,
                "backward_sent": uly.backward_sent, "total_sent": uly.total_sent, "per_step": L * uly.total_sent},
            "ulysses_note": note or None, "layers": L,
            "growth": [asdict(r) for r in growth], "activations": act}, indent=2))
        return

    table = Table(title=f"{name}: seq {seq} over cp {cp}, {split}, {n} chunks of {size} tokens", title_justify="left")
    for column in ("rank", "chunks", "positions", "work, plain", "work, zig-zag"):
        table.add_column(column, justify="right" if column.startswith("work") else "left")
    for r in range(cp):
        held = cpm.chunks(cp, r, split)
        zig = work["zigzag"]
        table.add_row(str(r), ", ".join(map(str, held)),
                      ", ".join(f"{i * size}-{(i + 1) * size - 1}" for i in held),
                      f"{work['plain'][r]:,}", f"{zig[r]:,}" if zig else "n/a")
    table.add_row("[bold]max/min[/]", "", "", *(f"[bold]{cpm.imbalance(w):.2f}[/]" if w else "n/a"
                                                   for w in work.values()))
    console.print(table)
    console.print("work: causal query-key scores per sequence and head, the split's chunks against every key before "
                  "them (plain: cp chunks in order; zig-zag: rank r holds chunks r and 2cp-1-r).")
    if work["zigzag"] is None:
        console.print(f"zig-zag needs seq divisible by 2 x cp = {2 * cp}: {seq} is not.")

    table = Table(title=f"bytes one rank sends per attention layer: micro batch {micro_batch} x seq {seq}, "
                        f"{precision}, cp {cp}; per step = {L} layers, one micro-batch", title_justify="left")
    for column in ("scheme", "how", "forward", "backward", "per layer", "per step"):
        table.add_column(column, justify="left" if column in ("scheme", "how") else "right")
    table.add_row("ring attention", f"send/recv, block B = {_size(ring.block)}: 2(cp-1)B fwd, (4(cp-1)+2)B bwd",
                  _size(ring.forward), _size(ring.backward), _size(ring.total), _size(L * ring.total))
    if uly is not None:
        table.add_row("Ulysses", f"{uly.calls} all-to-alls each way, (P-1)/P of each message sent",
                      _size(uly.forward_sent), _size(uly.backward_sent), _size(uly.total_sent),
                      _size(L * uly.total_sent))
        table.add_row("Ulysses messages", f"q, out {_size(uly.message_q)}; k, v {_size(uly.message_kv)} "
                      "(the comms logger's sizes)", _size(uly.forward_message), _size(uly.backward_message),
                      _size(2 * uly.forward_message), _size(2 * L * uly.forward_message))
    console.print(table)
    if note:
        console.print(f"note: {note}", highlight=False)

    table = Table(title="bytes one rank sends per layer, fwd + bwd, as seq and cp grow",
                  title_justify="left")
    for column in ("seq", "cp", "tokens a rank", "ring", "Ulysses", "ring / Ulysses"):
        table.add_column(column, justify="right")
    for row in growth:
        table.add_row(str(row.seq), str(row.cp), str(row.seq // row.cp), _size(row.ring),
                      _size(row.ulysses) if row.ulysses is not None else "n/a",
                      f"{row.ring / row.ulysses:.2f}" if row.ulysses else "")
    console.print(table)
    console.print("ring: each rank sends 2(cp-1)/cp of the whole sequence's k and v forward, about constant as cp "
                  "grows, and hides it behind attention; Ulysses: about 1/P of q, k, v and out, falling with P, "
                  "but nothing overlaps its all-to-alls.")
    console.print(f"activations per rank (plscale's Llama, micro batch {micro_batch}): {_size(act['without_cp'])} "
                  f"without cp, {_size(act['with_cp'])} with cp {cp} (every term for {seq // cp} of {seq} tokens); "
                  f"model states unchanged.")


@speaks_flags()
def experts(
    name: str = typer.Option("small", "--model", "--preset", "-m", help=f"A model preset: {', '.join(PRESETS)}."),
    num_experts: int = typer.Option(8, "--experts", "-e", help="Experts E in each MoE layer."),
    top_k: int = typer.Option(2, help="Experts each token goes to: 1 (Switch) or 2 (GShard)."),
    capacity_factor: float = typer.Option(1.25, help="Room per expert, in even shares of the routes (> 0)."),
    min_capacity: int = typer.Option(0, help="The least room an expert gets (DeepSpeed's MoE defaults to 4)."),
    ep: int = typer.Option(1, help="Expert-parallel degree: ranks the experts are split over."),
    seq: int = typer.Option(None, help="Sequence length (default: the preset's, capped at 2048)."),
    micro_batch: int = typer.Option(1, help="Sequences per rank per forward/backward."),
    every: int = typer.Option(1, help="An MoE layer every N layers (1: all; DeepSpeed-Megatron's expert interval)."),
    precision: str = typer.Option("bf16", help="bf16, fp16 or fp32: the activations' element size."),
    as_json: bool = typer.Option(False, "--json", help="Print capacity, all-to-alls and parameters as JSON."),
) -> None:
    """Mixture of experts per rank: capacity, all-to-alls, parameters.

    S = b*s tokens a rank per micro-batch, each routed to k of E experts with
    room C = max(ceil(S/E * k * F), min capacity) each. Per MoE layer: 4
    all-to-alls (dispatch, combine; forward, backward) of E*C*h*e bytes, of
    which (ep-1)/ep leave the rank. Each rank holds E/ep experts and all the
    other weights. F > 1 pads, F < 1 drops routes even when routing is even.
    See plscale/predict/experts.py.
    """
    config = preset(name)
    if precision not in BYTES:
        raise UserError(f"--precision {precision!r}: use bf16, fp16 or fp32.")
    moe.check_experts(num_experts, ep)
    moe.check_capacity(capacity_factor)
    moe.check_top_k(top_k, num_experts)
    if micro_batch < 1 or min_capacity < 0 or every < 1:
        raise UserError(f"--micro-batch {micro_batch} and --every {every} must be at least 1, --min-capacity "
                        f"{min_capacity} at least 0.")
    if seq is not None and seq < 1:
        raise UserError(f"--seq {seq}: a sequence has at least one token; try --seq {min(config.max_seq, 2048)}.")
    if every > config.layers:
        raise UserError(f"--every {every}: {name} has {config.layers} layers, so no layer would be MoE; "
                        f"use --every {config.layers} or less.")
    seq = seq or min(config.max_seq, 2048)
    e, tokens = BYTES[precision], micro_batch * seq
    a2a = moe.alltoall_bytes(tokens, num_experts, top_k, capacity_factor, config.hidden, ep, e, min_capacity)
    params = moe.expert_params(config, num_experts, every)
    sweep = sorted(set(CAPACITY_FACTORS) | {capacity_factor})
    sweep_rows = [(f, moe.alltoall_bytes(tokens, num_experts, top_k, f, config.hidden, ep, e, min_capacity))
                  for f in sweep]
    routes, slots = top_k * tokens, num_experts * a2a.capacity
    even = {f: moe.even_routing(tokens, num_experts, top_k, f, min_capacity) for f in sweep}

    if as_json:
        typer.echo(json.dumps({
            "preset": name, "experts": num_experts, "top_k": top_k, "capacity_factor": capacity_factor,
            "min_capacity": min_capacity, "ep": ep, "seq": seq, "micro_batch": micro_batch, "every": every,
            "precision": precision, "tokens": tokens, "routes": routes, "capacity": a2a.capacity, "slots": slots,
            "even_routing": dict(zip(("padding", "dropped"), even[capacity_factor])),
            "alltoall": {"calls": a2a.calls, "message": a2a.message, "sent": a2a.sent,
                         "per_layer_message": a2a.total_message, "per_layer_sent": a2a.total_sent,
                         "moe_layers": params.moe_layers, "per_step_sent": a2a.per_step(params.moe_layers)[2]},
            "params": {**asdict(params), "total": params.total, "per_rank": params.per_rank(ep),
                       "dense_model": param_count(config)},
            "capacity_factors": [{"capacity_factor": f, "capacity": r.capacity, "slots": num_experts * r.capacity,
                                  "padding": even[f][0], "dropped": even[f][1],
                                  "per_layer_sent": r.total_sent} for f, r in sweep_rows]}, indent=2))
        return

    table = Table(title=f"MoE layer of {name}: E {num_experts}, top-{top_k}, factor F {capacity_factor:g}, ep {ep}",
                  title_justify="left")
    for column in ("", "value", "formula"):
        table.add_column(column, justify="right" if column == "value" else "left")
    table.add_row("tokens a rank per micro-batch S", f"{tokens:,}", f"b x s = {micro_batch} x {seq}")
    table.add_row("routes", f"{routes:,}", "k x S")
    table.add_row("capacity per expert C", f"{a2a.capacity:,}", f"max(ceil(S/E x k x F), {min_capacity})")
    table.add_row("slots", f"{slots:,}", "E x C: what is computed, sent and held")
    table.add_row("padding if routing is even", f"{100 * even[capacity_factor][0]:.1f} %", "(E x C - k x S) / (E x C)")
    table.add_row("dropped if routing is even", f"{100 * even[capacity_factor][1]:.1f} %", "(k x S - E x C) / (k x S)")
    table.add_row("experts a rank", str(num_experts // ep), "E / ep")
    console.print(table)

    table = Table(title=f"all-to-alls one rank issues per MoE layer ({precision}); per step = {params.moe_layers} "
                        f"MoE layers, one micro-batch", title_justify="left")
    for column in ("all-to-all", "calls", "message", "sent", "per layer sent", "per step sent"):
        table.add_column(column, justify="left" if column == "all-to-all" else "right")
    if a2a.calls:
        table.add_row("dispatch + combine, fwd + bwd", str(a2a.calls), _size(a2a.message), _size(a2a.sent),
                      _size(a2a.total_sent), _size(a2a.per_step(params.moe_layers)[2]))
        console.print(table)
        console.print(f"message E x C x h x e = {num_experts} x {a2a.capacity} x {config.hidden} x {e}; each rank "
                      f"keeps 1/{ep} of it for its own experts.")
    else:
        console.print("ep 1: every expert is local, no all-to-all.")

    table = Table(title=f"parameters per rank: {name} with {num_experts} experts in {params.moe_layers} of "
                        f"{config.layers} layers, ep {ep}", title_justify="left")
    for column in ("", "parameters", "on each rank"):
        table.add_column(column, justify="left" if not column else "right")
    table.add_row("dense (embedding, attention, norms, other MLPs)", f"{params.dense:,}", f"{params.dense:,}")
    table.add_row("routers (h x E a layer)", f"{params.gates:,}", f"{params.gates:,}")
    table.add_row("experts (3hf each)", f"{params.experts:,}", f"{params.experts // ep:,}")
    table.add_row("[bold]total[/]", f"[bold]{params.total:,}[/]", f"[bold]{params.per_rank(ep):,}[/]")
    table.add_row("the dense model", f"{param_count(config):,}", "")
    console.print(table)

    table = Table(title="capacity factor F (GShard, Switch): padding against drops", title_justify="left")
    for column in ("factor", "C", "slots", "padding if even", "dropped if even", "sent per layer"):
        table.add_column(column, justify="right")
    for f, r in sweep_rows:
        mark = "[bold]" if f == capacity_factor else ""
        table.add_row(f"{mark}{f:g}", f"{r.capacity:,}", f"{num_experts * r.capacity:,}",
                      f"{100 * even[f][0]:.1f} %", f"{100 * even[f][1]:.1f} %", _size(r.total_sent))
    console.print(table)


def _size(nbytes: float) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if nbytes >= scale:
            return f"{nbytes / scale:.3g} {unit}"
    return f"{nbytes:.0f} B"
