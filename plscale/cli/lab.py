"""`plscale lab list|show|run`."""

import sys
from pathlib import Path

import typer
from rich.markup import escape
from rich.table import Table

from plscale import datafiles
from plscale.cli.output import console
from plscale.errors import UserError
from plscale.files import write_json
from plscale.run import labs
from plscale.run.launch import Options, Plan, plan
from plscale.run.report import show
from plscale.run.resolve import Resolved, Topology, resolve_run
from plscale.run.rundir import new_run_dir, write_inputs
from plscale.run.settings import flatten

app = typer.Typer(help="List, show and run the labs.", no_args_is_help=True)


@app.command("list")
def list_labs() -> None:
    """All labs: id, aliases, title, course sections, ranks (a JAX lab's devices), minutes on CPU."""
    table = Table(title="plscale labs", title_justify="left")
    for column in ("#", "id", "aliases", "title", "course sections", "ranks", "CPU min"):
        table.add_column(column)
    for lab in labs.all_labs():
        aliases = lab.aliases + [a for v in lab.variants.values() for a in v.aliases]
        table.add_row(f"{lab.number:02d}", lab.id, ", ".join(aliases), lab.title, ", ".join(lab.sections),
                      f"{lab.default_ranks} ({','.join(map(str, lab.allowed_ranks))})"
                      + (" devices" if lab.launcher == "jax" else ""), f"{lab.cpu_minutes:g}")
    console.print(table)


@app.command("show")
def show_lab(name: str = typer.Argument(..., help="Lab id, alias, number or variant alias.")) -> None:
    """A lab's manifest: variants, settings, what it predicts."""
    lab, _ = labs.find(name)
    console.print(f"[bold]{lab.number:02d} {lab.id}[/]: {lab.title}")
    for section, topics in lab.sections.items():
        console.print(f"course section {section} (plscale course {section}): {'; '.join(topics)}")
    console.print(f"folder: {lab.folder}   entry: {lab.entry}   lesson: {lab.folder / 'README.md'}")
    unit = "devices of one JAX process" if lab.launcher == "jax" else "ranks"
    console.print(f"{unit}: default {lab.default_ranks}, allowed {lab.allowed_ranks}; "
                  f"about {lab.cpu_minutes:g} min on CPU; GPU required: {lab.gpu_required}"
                  + (f"; launcher: {lab.launcher}" if lab.launcher else ""))
    scripts = {v.entry or lab.entry for v in lab.variants.values()}
    variants = Table("variant", "aliases", *(["script"] if len(scripts) > 1 else []), "overrides", "about",
                     title="variants", title_justify="left")
    for v in lab.variants.values():
        variants.add_row(v.name, ", ".join(v.aliases), *([v.entry or lab.entry] if len(scripts) > 1 else []),
                         " ".join(f"{k}={val}" for k, val in v.overrides.items()), v.about)
    console.print(variants)
    settings = Table("setting", "default", title="settings (change with --set key=value)", title_justify="left")
    for key, value in flatten(lab.settings).items():
        settings.add_row(key, repr(value))
    console.print(settings)
    for line in lab.predicts:
        console.print(f"predicts: {line}")


@app.command("run")
def run_lab(
    name: str = typer.Argument(..., help="Lab id, alias, number or variant alias (e.g. zero2)."),
    variant: str = typer.Option(None, "--variant", "-v", help="Variant (default: the lab's, or the alias')."),
    gpus: int = typer.Option(None, "--gpus", "-g", help="Ranks per node (GPUs, or CPU processes); "
                             "a JAX lab's devices (GPUs, or simulated CPU devices)."),
    launcher: str = typer.Option(None, help="deepspeed (default), torchrun or accelerate; some labs and variants "
                                 "pick one (a JAX lab: jax)."),
    nodes: int = typer.Option(1, help="Number of nodes."),
    hostfile: str = typer.Option(None, help="DeepSpeed hostfile for several nodes."),
    node_rank: int = typer.Option(None, help="This node's rank (launch on every node, no ssh)."),
    master_addr: str = typer.Option("127.0.0.1", help="Address of node 0."),
    master_port: int = typer.Option(None, help="Port on node 0 (default: a free one; 29500 multi-node)."),
    cpu: bool = typer.Option(False, "--cpu", help="Run CPU ranks over gloo (a JAX lab: CPU devices) even when "
                             "GPUs exist."),
    steps: int = typer.Option(None, help="Training steps (overrides the lab's)."),
    sets: list[str] = typer.Option([], "--set", help="Override a setting: key=value (repeatable)."),
    ds_config: str = typer.Option(None, "--ds-config", help="Use this DeepSpeed JSON instead of the generated one."),
    data_dir: str = typer.Option(None, "--data-dir", help="Local dataset files (else PLSCALE_DATA_DIR, hub, fallback)."),
    max_restarts: int = typer.Option(None, "--max-restarts",
                                     help="torchrun only: restart every rank up to N times after one fails."),
    sweep: bool = typer.Option(False, "--sweep", help="Run the lab's sweep variants in turn, then its report."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the command and environment; run nothing."),
) -> None:
    """Run a lab on N ranks: GPUs over NCCL, or CPU processes over gloo; a JAX lab as one process with N devices."""
    lab, chosen = labs.find(name)
    chosen = lab.variant(variant) if variant else chosen
    if sweep and variant:
        raise UserError(f"--sweep runs the lab's sweep variants ({', '.join(lab.sweep) or 'none'}): drop --variant.")
    if data_dir and not Path(data_dir).is_dir():
        raise UserError(f"--data-dir {data_dir} is not a folder: point it at the dataset's files.")
    datafiles.check(lab.data, Path(data_dir) if data_dir else datafiles.data_dir())
    opts = Options(gpus, launcher, nodes, hostfile, node_rank, master_addr, master_port, cpu, steps,
                   list(sets), ds_config, data_dir, max_restarts)
    if not sweep:
        prepared = prepare(lab, chosen, opts)
        if dry_run:
            return show_plan(*prepared)
        run_dir = launch(*prepared)
        if (run_dir / "summary.json").exists():
            show(run_dir, console)
        else:  # a node other than node 0: global rank 0 wrote the summary there
            console.print(f"This node's ranks finished; node 0's run directory holds the summary. Logs: {run_dir}")
        return
    if not lab.sweep:
        raise UserError(f"Lab {lab.id} has no sweep: run its variants one by one (plscale lab show {lab.id}).")
    runs = [prepare(lab, lab.variant(v), opts) for v in lab.sweep]  # every variant checked before any runs
    if dry_run:
        for prepared in runs:
            show_plan(*prepared)
        return
    sweep_dir = new_run_dir(lab.id, "sweep")
    run_dirs = [str(launch(*prepared)) for prepared in runs]
    write_json(sweep_dir / "sweep.json", {"lab": lab.id, "variants": lab.sweep, "runs": run_dirs})
    if lab.sweep_report:
        import subprocess

        code = subprocess.call([sys.executable, str(lab.folder / lab.sweep_report), str(sweep_dir)])
        if code != 0:
            raise typer.Exit(code)
    console.print(f"sweep directory: {sweep_dir}")


def prepare(lab, variant, opts: Options) -> tuple[Plan, Resolved]:
    """The launch plan and the resolved run, each built once: everything a user can get
    wrong fails here, before anything is written."""
    the_plan = plan(lab, variant, opts)
    topology = Topology(the_plan.world_size, the_plan.device)
    return the_plan, resolve_run(lab, variant, topology, opts.sets, opts.steps, opts.ds_config)


def show_plan(the_plan: Plan, resolved: Resolved) -> None:
    named = new_run_dir(resolved.lab.id, resolved.variant.name, create=False)
    console.print(f"[bold]{resolved.lab.id}[/] / {resolved.variant.name}: {escape(the_plan.notice)}")
    console.print("[bold]command:[/]", the_plan.at(named).shell(), highlight=False, soft_wrap=True)


def launch(the_plan: Plan, resolved: Resolved) -> Path:
    """Claim the run directory, write the hand-off into it, run the ranks."""
    from plscale.run import runner

    run_dir = new_run_dir(resolved.lab.id, resolved.variant.name)
    the_plan = the_plan.at(run_dir)
    write_inputs(run_dir, the_plan, resolved, sys.argv)
    console.print(f"[bold]{resolved.lab.id}[/] / {resolved.variant.name}: {escape(the_plan.notice)}")
    console.print(f"run directory: {run_dir}")
    code = runner.run(the_plan, run_dir, console)
    if code != 0:
        raise typer.Exit(code)
    return run_dir
