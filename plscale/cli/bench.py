"""`plscale bench collectives`: bus bandwidth per message size, nccl-tests style.

Checks sizes, collectives and memory on the host, then runs the collectives lab's `bench`
variant through the same plan and runner as `plscale lab run`.
"""

import shutil
from pathlib import Path

import typer

from plscale.predict import busbw
from plscale.lab import labs
from plscale.cli.flags import speaks_flags
from plscale.cli.output import console
from plscale.errors import UserError
from plscale.run.launch import Options
from plscale.run.report import show

app = typer.Typer(help="Benchmarks that print what they measure.", no_args_is_help=True)


@app.command("collectives")
@speaks_flags()
def collectives(
    gpus: int = typer.Option(None, "--gpus", "-g", help="Ranks (GPUs, or CPU processes); default: the lab's."),
    sizes: str = typer.Option("auto", help="Message sizes in bytes: 32K-64M (doubling), 32K,1M,64M, or auto."),
    ops: str = typer.Option(busbw.DEFAULT_OPS, help=f"Collectives, comma-separated: {', '.join(busbw.OPS)}."),
    dtype: str = typer.Option("float32", help=f"Element type: {', '.join(busbw.DTYPES)}."),
    iters: int = typer.Option(None, help="Timed calls per size, at most (default: the lab's, 20)."),
    budget: float = typer.Option(None, help="Seconds of timed calls per size and collective (default: the lab's, 1)."),
    ring: bool = typer.Option(True, help="Time the hand-written ring and naive all-reduce beside all_reduce."),
    launcher: str = typer.Option(None, help="deepspeed (default), torchrun or accelerate."),
    cpu: bool = typer.Option(False, "--cpu", help="CPU ranks over gloo even when GPUs exist."),
    out: Path = typer.Option(None, help="Also copy busbw.csv and busbw.png into this folder."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the command; run nothing."),
) -> None:
    """all_reduce, all_gather, reduce_scatter, broadcast, all_to_all: time, algbw, busbw per size."""
    from plscale.cli.lab import launch, show_plan
    from plscale.run.flow import prepare

    lab, _ = labs.find("collectives")
    variant = lab.variant("bench")
    ranks = lab.default_ranks if gpus is None else gpus
    if ranks < 2:
        raise UserError(f"--gpus {ranks}: collectives need 2 or more ranks.")
    if iters is not None and iters < 1:
        raise UserError(f"--iters {iters}: use 1 or more.")
    if budget is not None and budget <= 0:
        raise UserError(f"--budget {budget:g}: use a positive number of seconds.")
    if out is not None and out.exists() and not out.is_dir():
        raise UserError(f"--out {out} is a file: give a folder.")
    # Sizes, collectives, dtype and memory are checked by the lab's check.py before launch.
    sets = [f"bench.sizes={sizes}", f"bench.ops={ops}", f"bench.dtype={dtype}",
            f"bench.ring={str(ring).lower()}", f"bench.naive={str(ring).lower()}"]
    sets += [f"bench.iters={iters}"] if iters is not None else []
    sets += [f"bench.budget_s={budget}"] if budget is not None else []
    opts = Options(gpus=ranks, launcher=launcher, cpu=cpu, sets=sets)
    prepared = prepare(lab, variant, opts)
    if dry_run:
        return show_plan(prepared)
    run_dir = launch(prepared)
    show(run_dir, console)
    console.print(f"table as CSV: {run_dir / 'busbw.csv'}")
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        for name in ("busbw.csv", "busbw.png"):
            shutil.copy2(run_dir / name, out / name)
        console.print(f"copied busbw.csv and busbw.png to {out}")
