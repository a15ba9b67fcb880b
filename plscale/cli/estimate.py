"""`plscale estimate memory`: memory per rank for a model, a ZeRO stage, a parallel layout and
recomputation (estimate_memory.py);
`plscale estimate tp`: tensor (and sequence) parallelism's parameters and collectives per rank;
`plscale estimate checkpoint`: what a checkpoint writes, and how often to write one;
`plscale estimate cp` and `plscale estimate moe`: context and expert parallelism (estimate_parallel.py);
`plscale estimate precision`: number formats and bytes per parameter (estimate_precision.py);
`plscale estimate layouts`: lab 10's layouts, bytes per device and collectives (estimate_layouts.py)."""

import json
from dataclasses import asdict
from pathlib import Path

import typer
from rich.markup import escape
from rich.table import Table

from plscale.cli import estimate_layouts, estimate_memory, estimate_parallel, estimate_precision
from plscale.cli.output import console, png_path
from plscale.errors import UserError
from plscale.predict import checkpoint as ckpt
from plscale.predict import tensor_parallel as tpm
from plscale.predict.memory import BYTES
from plscale.predict.presets import PRESETS, param_count, parse_count, preset

app = typer.Typer(help="Estimate what a training run needs before you rent it.", no_args_is_help=True)


app.command("memory")(estimate_memory.memory)


@app.command("tp")
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


app.command("cp")(estimate_parallel.context_parallel)
app.command("moe")(estimate_parallel.experts)
app.command("precision")(estimate_precision.precision)
app.command("layouts")(estimate_layouts.layouts)


@app.command("checkpoint")
def checkpoint(
    model: str = typer.Option("7b", "--model", "-m",
                              help=f"A preset ({', '.join(PRESETS)}) or a parameter count (1.3e9, 350M, 7b)."),
    stage: int = typer.Option(2, help="ZeRO stage 0-3."),
    ranks: int = typer.Option(8, help="Data-parallel ranks N (each writes its optimizer partition)."),
    precision: str = typer.Option("bf16", help="bf16, fp16 or fp32."),
    mtbf_hours: float = typer.Option(24.0, help="Mean time between failures of the whole job, in hours."),
    stall_s: float = typer.Option(None, help="Measured stall per checkpoint, in seconds (default: bytes per "
                                             "rank / --write-gbps)."),
    write_gbps: float = typer.Option(1.0, help="Write bandwidth per rank in GB/s, to estimate the stall."),
    step_s: float = typer.Option(1.0, help="Seconds per training step."),
    restart_s: float = typer.Option(0.0, help="Seconds to restart after a failure (adds R/M to the waste)."),
    lag_steps: float = typer.Option(0.0, help="Steps until a checkpoint is durable (an asynchronous save)."),
    png: Path = typer.Option(None, help="Save the waste-against-interval chart here."),
) -> None:
    """Bytes one save writes, and the interval that loses the least time.

    Files (DeepSpeed, Adam): stage 0 rank 0 writes (p+K)Ψ; stages 1-2 rank 0
    writes pΨ and every rank 12Ψ/N; stage 3 every rank 12Ψ/N. K = 12
    (8 for fp32 at stage 0). Stall δ (measured, or bytes per rank / write
    bandwidth), MTBF M, restart R, checkpoint every τ seconds:
    waste = δ/τ + (τ+δ)/(2M) + R/M, minimised at Young's τ = sqrt(2δM);
    Daly's τ = sqrt(2δM)[1 + sqrt(δ/2M)/3 + (δ/2M)/9] - δ. A crash loses
    k/2 + lag steps on average, k + lag at worst, saving every k steps.
    See plscale/predict/checkpoint.py.
    """
    if precision not in BYTES:
        raise UserError(f"--precision {precision!r}: use bf16, fp16 or fp32.")
    for name, value in (("--mtbf-hours", mtbf_hours), ("--write-gbps", write_gbps), ("--step-s", step_s)):
        if value <= 0:
            raise UserError(f"{name} {value:g}: it must be positive.")
    if stall_s is not None and stall_s <= 0:
        raise UserError(f"--stall-s {stall_s:g}: a save stalls for some time; give the measured seconds.")
    if restart_s < 0 or lag_steps < 0:
        raise UserError(f"--restart-s {restart_s:g} and --lag-steps {lag_steps:g} cannot be negative.")
    if png is not None:
        png_path("--png", png)
    if ranks < 1:
        raise UserError(f"--ranks {ranks}: a job has at least one rank.")
    config = PRESETS.get(model)
    params = param_count(config) if config else parse_count(model)
    files = ckpt.checkpoint_bytes(params, stage, ranks, precision, config)
    mtbf = mtbf_hours * 3600
    stall, measured = (stall_s, True) if stall_s is not None else (files.per_rank / (write_gbps * 1e9), False)

    table = Table(title=f"checkpoint: {model} ({params / 1e9:.3g}B parameters), ZeRO-{stage}, {precision}, "
                        f"{ranks} ranks", title_justify="left")
    for column in ("file", "copies", "each", "formula"):
        table.add_column(column, justify="right" if column in ("copies", "each") else "left")
    for f in files.files:
        table.add_row(f.name, str(f.copies), _size(f.nbytes), escape(f.formula))
    table.add_row("[bold]per rank (rank 0)[/]", "", f"[bold]{_size(files.per_rank)}[/]", "")
    table.add_row("[bold]total[/]", "", f"[bold]{_size(files.total)}[/]", "")
    console.print(table)
    source = "measured" if measured else f"{_size(files.per_rank)} / {write_gbps:g} GB/s"
    console.print(f"stall per checkpoint δ = {stall:.3g} s ({source}); MTBF M = {mtbf_hours:g} h; "
                  f"step {step_s:g} s")
    for label, tau in (("Young sqrt(2δM)", ckpt.young_interval(stall, mtbf)),
                       ("Daly", ckpt.daly_interval(stall, mtbf))):
        k = max(tau / step_s, 1.0)
        waste = ckpt.waste_fraction(k * step_s, stall, mtbf, restart_s)
        console.print(f"{label:16} every {_duration(tau)} = {k:,.0f} steps: waste {100 * waste:.2f} %, "
                      f"steps lost on a crash {ckpt.expected_steps_lost(k, lag_steps):,.0f} on average, "
                      f"{ckpt.worst_steps_lost(k, lag_steps):,.0f} at worst")
    if png is not None:
        from plscale.plots import interval_chart

        interval_chart([(f"ZeRO-{stage} {precision}", stall, step_s)], mtbf, png,
                       title=f"checkpointing {model} on {ranks} ranks", restart_s=restart_s)
        console.print(f"chart: {png}")


def _size(nbytes: float) -> str:
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if nbytes >= scale:
            return f"{nbytes / scale:.3g} {unit}"
    return f"{nbytes:.0f} B"


def _duration(seconds: float) -> str:
    if seconds >= 3600:
        return f"{seconds:,.0f} s ({seconds / 3600:.2g} h)"
    return f"{seconds:,.0f} s ({seconds / 60:.3g} min)" if seconds >= 60 else f"{seconds:.3g} s"
