"""`plscale estimate checkpoint`: what a checkpoint writes, and how often to write one
(plscale/predict/checkpoint.py)."""

from pathlib import Path

import typer
from rich.markup import escape
from rich.table import Table

from plscale.cli import hf_model
from plscale.cli.flags import speaks_flags
from plscale.cli.hf_model import is_hf
from plscale.cli.output import console, png_path
from plscale.errors import UserError
from plscale.predict import checkpoint as ckpt
from plscale.predict.presets import PRESETS, param_count, parse_count
from plscale.predict.published import SHAPES, model_shape
from plscale.predict.units import BYTES


@speaks_flags()
def checkpoint(
    model: str = typer.Option("7b", "--model", "-m",
                              help=f"A preset ({', '.join(PRESETS)}), a published shape ({', '.join(SHAPES)}), "
                                   f"a parameter count (1.3e9, 350M, 7b), or a "
                                   f"Hugging Face model's config: hf:FOLDER, hf:config.json, hf:org/name."),
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
    known = model.lower() in PRESETS or model.lower() in SHAPES  # a preset, or a published run's shape
    config, read = hf_model.read(model) if is_hf(model) else (model_shape(model) if known else None, None)
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
    if read:
        console.print(escape(read), highlight=False, soft_wrap=True)
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
        from plscale.charts.plots import interval_chart

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
