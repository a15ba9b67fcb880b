"""`plscale report [RUN...] [--compare] [--force] [--plot PATH]`: one run beside its lab's
reference results, or several runs side by side (plscale/run/compare.py)."""

from pathlib import Path

import typer

from plscale.cli.output import console, png_path
from plscale.errors import UserError

DEFAULT_PLOT = Path("compare.png")


def report(
    runs: list[Path] = typer.Argument(None, help="Run directories (default: the newest under runs/)."),
    compare: bool = typer.Option(False, "--compare", help="Compare 2 or more runs: settings that differ, figures, "
                                 "checks, each against the lab's reference; loss curves in one PNG."),
    force: bool = typer.Option(False, "--force", help="Compare runs of different labs."),
    plot: Path = typer.Option(None, "--plot", help="Where the loss curves go (--compare: default ./compare.png; "
                              "one run: only when given)."),
) -> None:
    """Show a finished run's summary: measured figures beside predictions and the lab's reference."""
    from plscale.run.compare import load_run, load_runs
    from plscale.run.report import compare as compare_runs
    from plscale.run.report import plot_curves, show
    from plscale.run.rundir import runs_root

    runs = list(runs or [])
    if plot is not None:
        png_path("--plot", plot)
    if compare:
        chosen = load_runs(runs, force)  # every run checked before anything is written
        compare_runs(chosen, console, plot or DEFAULT_PLOT)
        return
    if len(runs) > 1:
        raise UserError(f"{len(runs)} runs given: add --compare to compare them, or give one run.")
    if not runs:
        found = sorted(p for p in runs_root().glob("*") if (p / "settings.json").is_file())
        if not found:
            raise UserError(f"No runs under {runs_root()}/: run a lab first (plscale lab run mnist-dp).")
        runs = [found[-1]]
    run = load_run(runs[0])
    show(run.path, console, reference=True)
    if plot is not None:
        written = plot_curves([run], plot)
        console.print(f"loss curves: {plot}" if written else "loss curves: none (no step/loss rows in metrics.jsonl)")
