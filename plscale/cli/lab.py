"""`plscale lab list|show|run` and `plscale report`."""

import shlex
import sys
from pathlib import Path

import typer
from rich.table import Table

from plscale import datafiles
from plscale.run import labs
from plscale.dsconfig.check import check, load
from plscale.dsconfig.spec import DSSpec, build
from plscale.cli.output import console
from plscale.errors import UserError
from plscale.run.launch import Options, plan
from plscale.run.report import show
from plscale.files import write_json
from plscale.run.rundir import new_run_dir
from plscale.run.settings import flatten, resolve

app = typer.Typer(help="List, show and run the labs.", no_args_is_help=True)


@app.command("list")
def list_labs() -> None:
    """All labs: id, aliases, title, course sections, ranks, minutes on CPU."""
    table = Table(title="plscale labs", title_justify="left")
    for column in ("#", "id", "aliases", "title", "sections", "ranks", "CPU min"):
        table.add_column(column)
    for lab in labs.all_labs():
        aliases = lab.aliases + [a for v in lab.variants.values() for a in v.aliases]
        table.add_row(f"{lab.number:02d}", lab.id, ", ".join(aliases), lab.title, lab.sections[0] + (f" (+{len(lab.sections) - 1})" if len(lab.sections) > 1 else ""),
                      f"{lab.default_ranks} ({','.join(map(str, lab.allowed_ranks))})", f"{lab.cpu_minutes:g}")
    console.print(table)


@app.command("show")
def show_lab(name: str = typer.Argument(..., help="Lab id, alias, number or variant alias.")) -> None:
    """A lab's manifest: variants, settings, what it predicts."""
    lab, _ = labs.find(name)
    console.print(f"[bold]{lab.number:02d} {lab.id}[/]: {lab.title}")
    console.print(f"sections: {'; '.join(lab.sections)}")
    console.print(f"folder: {lab.folder}   entry: {lab.entry}   lesson: {lab.folder / 'README.md'}")
    console.print(f"ranks: default {lab.default_ranks}, allowed {lab.allowed_ranks}; "
                  f"about {lab.cpu_minutes:g} min on CPU; GPU required: {lab.gpu_required}")
    variants = Table("variant", "aliases", "overrides", "about", title="variants", title_justify="left")
    for v in lab.variants.values():
        variants.add_row(v.name, ", ".join(v.aliases), " ".join(f"{k}={val}" for k, val in v.overrides.items()),
                         v.about)
    console.print(variants)
    settings = Table("setting", "default", title="settings (change with --set key=value)", title_justify="left")
    for key, value in flatten(lab.settings).items():
        settings.add_row(key, repr(value))
    console.print(settings)
    for line in lab.predicts:
        console.print(f"predicts: {line}")


def _ds_config(settings: dict, world: int, path: str | None) -> dict:
    """The run's DeepSpeed config: a user's file (checked) or the one built from settings."""
    if path:
        config = load(path)
        problems = check(config, world)
        if problems:
            raise UserError(f"{path}: " + " | ".join(problems))
        return config
    spec = DSSpec.from_dict({**settings.get("ds", {}), "world_size": world})
    return build(spec)


@app.command("run")
def run_lab(
    name: str = typer.Argument(..., help="Lab id, alias, number or variant alias (e.g. zero2)."),
    variant: str = typer.Option(None, "--variant", "-v", help="Variant (default: the lab's, or the alias')."),
    gpus: int = typer.Option(None, "--gpus", "-g", help="Ranks per node (GPUs, or CPU processes)."),
    launcher: str = typer.Option(None, help="deepspeed (default) or torchrun; some variants pick one."),
    nodes: int = typer.Option(1, help="Number of nodes."),
    hostfile: str = typer.Option(None, help="DeepSpeed hostfile for several nodes."),
    node_rank: int = typer.Option(None, help="This node's rank (launch on every node, no ssh)."),
    master_addr: str = typer.Option("127.0.0.1", help="Address of node 0."),
    master_port: int = typer.Option(None, help="Port on node 0 (default: a free one; 29500 multi-node)."),
    cpu: bool = typer.Option(False, "--cpu", help="Run CPU ranks over gloo even when GPUs exist."),
    steps: int = typer.Option(None, help="Training steps (overrides the lab's)."),
    sets: list[str] = typer.Option([], "--set", help="Override a setting: key=value (repeatable)."),
    ds_config: str = typer.Option(None, "--ds-config", help="Use this DeepSpeed JSON instead of the generated one."),
    data_dir: str = typer.Option(None, "--data-dir", help="Local dataset files (else PLSCALE_DATA_DIR, hub, fallback)."),
    sweep: bool = typer.Option(False, "--sweep", help="Run the lab's sweep variants in turn, then its report."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the command and environment; run nothing."),
) -> None:
    """Run a lab on N ranks: GPUs over NCCL, or CPU processes over gloo."""
    lab, chosen = labs.find(name)
    chosen = lab.variant(variant) if variant else chosen
    if steps is not None and steps < 1:
        raise UserError(f"--steps {steps}: use 1 or more.")
    if data_dir and not Path(data_dir).is_dir():
        raise UserError(f"--data-dir {data_dir} is not a folder: point it at the dataset's files.")
    datafiles.check(lab.data, Path(data_dir) if data_dir else datafiles.data_dir())
    opts = Options(gpus, launcher, nodes, hostfile, node_rank, master_addr, master_port, cpu, steps,
                   list(sets), ds_config, data_dir)
    if not sweep:
        run_dir = run_variant(lab, chosen, opts, dry_run)
        if run_dir and (run_dir / "summary.json").exists():
            show(run_dir, console)
        elif run_dir:  # a node other than node 0: global rank 0 wrote the summary there
            console.print(f"This node's ranks finished; node 0's run directory holds the summary. Logs: {run_dir}")
        return
    if not lab.sweep:
        raise UserError(f"Lab {lab.id} has no sweep: run its variants one by one (plscale lab show {lab.id}).")
    variants = [lab.variant(v) for v in lab.sweep]
    for v in variants:  # check every variant's plan before running any
        run_variant(lab, v, opts, dry_run=True, quiet=not dry_run)
    if dry_run:
        return
    sweep_dir = new_run_dir(lab.id, "sweep")
    run_dirs = [str(run_variant(lab, v, opts, dry_run=False)) for v in variants]
    write_json(sweep_dir / "sweep.json", {"lab": lab.id, "variants": lab.sweep, "runs": run_dirs})
    if lab.sweep_report:
        import subprocess

        code = subprocess.call([sys.executable, str(lab.folder / lab.sweep_report), str(sweep_dir)])
        if code != 0:
            raise typer.Exit(code)
    console.print(f"sweep directory: {sweep_dir}")


def run_variant(lab, chosen, opts: Options, dry_run: bool, quiet: bool = False) -> Path | None:
    """Plan, write the run directory, run. Everything a user can get wrong fails before
    anything is written."""
    from plscale.run import runner

    settings = resolve(lab.settings, chosen.overrides, opts.sets)
    the_plan = plan(lab, chosen, opts, new_run_dir(lab.id, chosen.name, create=False))
    lab.check_settings(settings, the_plan)
    config = _ds_config(settings, the_plan.world_size, opts.ds_config)
    if dry_run:
        if not quiet:
            console.print(the_plan.notice)
            console.print("[bold]command:[/]", the_plan.shell(), highlight=False, soft_wrap=True)
        return None
    run_dir = new_run_dir(lab.id, chosen.name)  # claimed only now that the plan is accepted
    the_plan = plan(lab, chosen, opts, run_dir)
    for name, text in the_plan.files.items():
        (run_dir / name).write_text(text)
    write_json(run_dir / "ds_config.json", config)
    write_json(run_dir / "settings.json", {"lab": lab.id, "variant": chosen.name, "settings": settings})
    (run_dir / "command.txt").write_text(shlex.join(sys.argv) + "\n" + the_plan.shell() + "\n")
    write_json(run_dir / "env.json", the_plan.env)
    console.print(f"[bold]{lab.id}[/] / {chosen.name}: {the_plan.notice}")
    console.print(f"run directory: {run_dir}")
    code = runner.run(the_plan, run_dir, console)
    if code != 0:
        raise typer.Exit(code)
    return run_dir


def report(run_dir: Path = typer.Argument(None, help="A run directory (default: the newest under runs/).")) -> None:
    """Show a finished run's summary: measured figures beside predictions."""
    from plscale.run.rundir import runs_root

    if run_dir is None:
        runs = sorted(p for p in runs_root().glob("*") if p.is_dir())
        if not runs:
            raise UserError(f"No runs under {runs_root()}/: run a lab first (plscale lab run mnist-dp).")
        run_dir = runs[-1]
    if not run_dir.is_dir():
        raise UserError(f"{run_dir} is not a run directory.")
    show(run_dir, console)
