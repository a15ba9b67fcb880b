"""`plscale report [RUN...] [--compare] [--force] [--plot PATH]`: one run beside its lab's
reference results, or several runs side by side (plscale/run/compare.py)."""

from pathlib import Path

import typer

from plscale.cli.output import console, png_path
from plscale.errors import UserError

DEFAULT_PLOT = Path("compare.png")


def report(
    runs: list[Path] = typer.Argument(None, help="Run directories, or run names under the runs directory "
                                      "(default: the newest run)."),
    compare: bool = typer.Option(False, "--compare", help="Compare 2 or more runs: settings that differ, figures, "
                                 "checks, each against the lab's reference; loss curves in one PNG."),
    force: bool = typer.Option(False, "--force", help="With --compare: compare runs of different labs."),
    plot: Path = typer.Option(None, "--plot", help="Where the loss curves go (--compare: default ./compare.png; "
                              "one run: only when given)."),
) -> None:
    """Show a run's figures beside predictions and the lab's reference; --compare RUN RUN...: runs side by side.

    One run: each figure with the reference's value and ok / outside / hardware, and the likely
    causes of what is outside. --compare: the settings that differ, figures and checks side by
    side, and the loss curves in one PNG.
    """
    from plscale.run.compare import load_run, load_runs
    from plscale.run.report import compare as compare_runs
    from plscale.run.report import plot_curves, show
    from plscale.lab.rundir import runs_root

    runs = list(runs or [])
    if plot is not None:
        png_path("--plot", plot)
    if compare:
        chosen = load_runs(runs, force)  # every run checked before anything is written
        compare_runs(chosen, console, plot or DEFAULT_PLOT)
        return
    if len(runs) > 1:
        raise UserError(f"{len(runs)} runs given: add --compare to compare them, or give one run.")
    if force:
        raise UserError("--force only applies to --compare (it lets runs of different labs be compared): "
                        "drop it, or add --compare and 2 or more runs.")
    if not runs:
        found = sorted(p for p in runs_root().glob("*") if (p / "settings.json").is_file())
        if not found:
            raise UserError(f"No runs under {runs_root()}/: run a lab first (plscale lab run mnist-dp).")
        runs = [found[-1]]
    run = load_run(runs[0])
    show(run.path, console, reference=True)
    if plot is not None:
        for line in plot_curves([run], plot):
            console.print(line, highlight=False, soft_wrap=True)
