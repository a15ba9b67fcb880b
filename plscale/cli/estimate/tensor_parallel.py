"""`plscale estimate tp`: tensor (and sequence) parallelism's parameters and collectives per rank
(plscale/predict/tensor_parallel.py)."""

import json
from dataclasses import asdict

import typer
from rich.markup import escape
from rich.table import Table

from plscale.cli.flags import speaks_flags
from plscale.cli.output import console
from plscale.errors import UserError
from plscale.predict import tensor_parallel as tpm
from plscale.predict.presets import PRESETS, param_count, preset


@speaks_flags()
def tensor_parallel(
    name: str = typer.Option("small", "--preset", "-m", help=f"A model preset: {', '.join(PRESETS)}."),
    tp: int = typer.Option(2, help="Tensor-parallel degree t: ranks in one TP group."),
    seq: int = typer.Option(None, help="Sequence length (default: the preset's, capped at 2048)."),
    micro_batch: int = typer.Option(1, help="Sequences per forward/backward."),
    micro_batches: int = typer.Option(1, help="Forward/backward passes per optimizer step."),
    sp: bool = typer.Option(False, "--sp", help="Sequence parallelism (Korthikanti et al., 2022)."),
    precision: str = typer.Option("bf16", help="bf16, fp16 or fp32: the activations' element size."),
    as_json: bool = typer.Option(False, "--json", help="Print parameters per rank and the collectives as JSON."),
) -> None:
    """Parameters per rank and the collectives one rank issues in its TP group per step.

    Megatron TP splits the embedding, every layer's q, k, v, o, gate, up,
    down and the head over t ranks; the RMSNorm weights ((2L+1)h) are
    replicated. Per micro-batch, A = b*s*h activation bytes: f (all-reduce
    backward) before attention and MLP, g (all-reduce forward) after them:
    2L all-reduces of A forward and 2L backward, plus the embedding (fwd),
    the head's input (bwd) and cross-entropy (3 of b*s fp32, fwd). --sp turns
    each all-reduce into reduce-scatter + all-gather (same bytes) and adds one
    all-reduce of the norms' fp32 gradients per step.
    See plscale/predict/tensor_parallel.py.
    """
    config = preset(name)
    tpm.check_divisible(config, tp, f"preset {name!r}")
    if seq is not None and seq < 1:
        raise UserError(f"--seq {seq}: a sequence has at least one token; try --seq {min(config.max_seq, 2048)}.")
    seq = seq or min(config.max_seq, 2048)
    rows = tpm.collectives(config, tp, seq, micro_batch, precision, sp=sp, micro_batches=micro_batches)
    params, dense = tpm.params_per_rank(config, tp), param_count(config)
    sums, paper = tpm.totals(rows), tpm.megatron_paper_count(config.layers)
    if as_json:
        typer.echo(json.dumps({
            "preset": name, "tp": tp, "sp": sp, "seq": seq, "micro_batch": micro_batch,
            "micro_batches": micro_batches, "precision": precision,
            "params": {"sharded": params.sharded, "replicated": params.replicated, "total": params.total,
                       "dense_over_tp": dense / tp},
            "collectives": [{**asdict(r), "total": r.total} for r in rows],
            "totals": {op: {"calls": c, "bytes": b} for op, (c, b) in sums.items()},
            "megatron_paper": paper}, indent=2))
        return

    table = Table(title=f"parameters per rank: {name}, tp {tp}", title_justify="left")
    for column in ("", "parameters", "formula"):
        table.add_column(column, justify="right" if column == "parameters" else "left")
    table.add_row("sharded", f"{params.sharded:,}", "(embedding + L x layer matmuls) / t")
    table.add_row("replicated", f"{params.replicated:,}", "RMSNorm weights (2L+1)h")
    table.add_row("[bold]total[/]", f"[bold]{params.total:,}[/]", "")
    table.add_row("dense model / tp", f"{dense / tp:,.0f}", f"{dense:,} / {tp}")
    console.print(table)
    if not rows:
        console.print("tp 1: no tensor-parallel collectives.")
        return
    table = Table(title=f"collectives per optimizer step, one rank of the TP group: seq {seq} x micro batch "
                        f"{micro_batch} x {micro_batches} micro-batches, {precision}, SP {'on' if sp else 'off'}",
                  title_justify="left")
    for column in ("op", "phase", "where", "calls", "MiB each", "MiB"):
        table.add_column(column, justify="right" if column in ("calls", "MiB each", "MiB") else "left")
    for r in rows:
        table.add_row(r.op, r.phase, escape(r.where), str(r.calls), f"{r.bytes / 2**20:.3f}",
                      f"{r.total / 2**20:.3f}")
    for op, (calls, nbytes) in sums.items():
        table.add_row(f"[bold]{op}[/]", "", "total", f"[bold]{calls}[/]", "", f"[bold]{nbytes / 2**20:.3f}[/]")
    console.print(table)
    console.print(f"Megatron paper (Shoeybi et al., 2019), transformer layers only: {paper['forward']} all-reduces "
                  f"forward and {paper['backward']} backward per micro-batch (2 per layer each way, L = "
                  f"{config.layers})" + ("; SP: each becomes a reduce-scatter + an all-gather." if sp else "."))
