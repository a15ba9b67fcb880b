"""`plscale lab list|show|run`."""

import sys
from pathlib import Path

import typer
from rich.markup import escape
from rich.table import Table

from plscale.cli.output import console
from plscale.errors import UserError
from plscale.lab import labs
from plscale.lab.settings import flatten
from plscale.run import flow
from plscale.run.launch import Options

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
    layout: str = typer.Option(None, "--layout", help="A layout from `plscale plan --json`: plan.json (its first "
                               "candidate) or plan.json:N (lab 4d)."),
    sweep: bool = typer.Option(False, "--sweep", help="Run the lab's sweep variants in turn (lab 4d: every layout "
                               "the planner offers on this machine, which it measures first, --dry-run too), then its "
                               "report."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the command and environment; run nothing."),
    profile: int = typer.Option(None, "--profile", help="Record this step (numbered as in metrics.jsonl, 1 or later) with "
                                "torch.profiler on every rank: a merged trace for Perfetto, a timeline and the "
                                "overlap figures in the run directory's profile/."),
) -> None:
    """Run a lab on N ranks: GPUs over NCCL, or CPU processes over gloo; a JAX lab as one process with N devices."""
    lab, chosen = flow.choose(name, variant, sweep, data_dir)
    opts = Options(gpus, launcher, nodes, hostfile, node_rank, master_addr, master_port, cpu, steps,
                   list(sets), ds_config, data_dir, max_restarts, profile)
    if layout and sweep:
        raise UserError("--sweep runs every layout itself: drop --layout.")
    if not sweep:
        prepared = flow.prepare(lab, flow.layout_variant(lab, chosen, opts, layout), opts)
        if dry_run:
            return show_plan(prepared)
        flow.report(launch(prepared), console)
        return
    runs = flow.prepare_sweep(lab, opts, console)  # every variant checked before any runs
    if dry_run:
        for prepared in runs.runs:
            show_plan(prepared)
        return
    try:
        sweep_dir = flow.run_sweep(lab, runs, console, sys.argv)
    except flow.RunFailed as failed:
        raise typer.Exit(failed.code) from None
    console.print(f"sweep directory: {sweep_dir}")


def show_plan(prepared: flow.Prepared) -> None:
    """What --dry-run prints: how the ranks run, and the command."""
    heading, command = flow.describe(prepared)
    lab_variant, _, notice = heading.partition(": ")
    console.print(f"[bold]{lab_variant}[/]: {escape(notice)}")
    console.print("[bold]command:[/]", command, highlight=False, soft_wrap=True)
    planned = prepared.resolved.settings.get("planned", {}).get("step_s")
    if planned:   # a layout from the planner (--layout, lab 4d's --sweep)
        console.print(f"[bold]predicted step:[/] {planned:.3f} s (plscale plan --here's model)", highlight=False)


def launch(prepared: flow.Prepared) -> Path:
    """Run the ranks (flow.launch); their exit code is the command's when they fail."""
    try:
        return flow.launch(prepared, console, sys.argv)
    except flow.RunFailed as failed:
        raise typer.Exit(failed.code) from None
