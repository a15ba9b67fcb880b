"""Run a lab, or its sweep, from this process: what `plscale lab run` does, for the CLI, the
slides' refresh and the benchmarks alike.

    lab, variant = flow.choose("zero2")                    # lab and variant; a bad name: UserError
    prepared = flow.prepare(lab, variant, Options(gpus=2)) # the plan and the resolved run, written nowhere
    heading, command = flow.describe(prepared)             # what --dry-run prints
    run_dir = flow.launch(prepared, console)               # claim runs/..., write the hand-off, run the ranks
    flow.report(run_dir, console)                          # the summary beside the predictions

or in one call: `flow.run("zero2", Options(gpus=2))` -> the run directory, and
`flow.sweep("zero", Options(gpus=2))` -> the sweep directory. Everything a user can get wrong
raises UserError before anything is written; ranks that exit non-zero raise RunFailed, which
carries their exit code and run directory. The console shows what the CLI shows: rank 0 live,
the progress bar, a failed rank's last lines. Imports neither torch nor the ranks' code.
"""

import argparse
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple

from rich.console import Console
from rich.markup import escape

from plscale import datafiles
from plscale.errors import UserError
from plscale.files import write_json
from plscale.lab import labs
from plscale.lab.labs import Lab, Variant
from plscale.lab.resolve import Resolved, Topology, resolve_run
from plscale.lab.rundir import new_run_dir, write_inputs
from plscale.run.launch import Options, Plan, plan
from plscale.run.report import show


class Prepared(NamedTuple):
    """A run checked and resolved, nothing written yet."""
    plan: Plan
    resolved: Resolved


class Sweep(NamedTuple):
    """A sweep's runs, each prepared, and what sweep.json records besides them."""
    runs: list                  # [Prepared]
    per_run: dict | None = None  # name -> one entry a run; sweep.json keeps those of the runs that finished
    record: dict | None = None   # anything else


class RunFailed(Exception):
    """The ranks (or a sweep's report script) exited with `code`; their logs are in `run_dir`."""

    def __init__(self, code: int, run_dir: Path):
        super().__init__(f"the run failed (exit code {code}); logs: {run_dir}")
        self.code, self.run_dir = code, run_dir


def choose(name: str, variant: str | None = None, sweep: bool = False,
           data_dir: str | None = None) -> tuple[Lab, Variant]:
    """The lab and variant a name picks (`zero2`: lab zero, variant zero2), and its data checked."""
    lab, chosen = labs.find(name)
    chosen = lab.variant(variant) if variant else chosen
    if sweep and variant:
        runs = "the planner's layouts" if lab.sweep_layouts else f"the lab's sweep variants ({', '.join(lab.sweep) or 'none'})"
        raise UserError(f"--sweep runs {runs}: drop --variant.")
    if data_dir and not Path(data_dir).is_dir():
        raise UserError(f"--data-dir {data_dir} is not a folder: point it at the dataset's files.")
    datafiles.check(chosen.data or lab.data, Path(data_dir) if data_dir else datafiles.data_dir())
    return lab, chosen


def prepare(lab: Lab, variant: Variant, opts: Options) -> Prepared:
    """The launch plan and the resolved run, each built once: everything a user can get
    wrong fails here, before anything is written."""
    the_plan = plan(lab, variant, opts)
    topology = Topology(the_plan.world_size, the_plan.device)
    return Prepared(the_plan, resolve_run(lab, variant, topology, opts.sets, opts.steps, opts.ds_config, opts.profile))


def here_only(the_plan: Plan, flag: str) -> None:
    """The planner's layouts are planned for this machine's CPU ranks (plscale plan --here)."""
    if the_plan.device != "cpu" or the_plan.nodes > 1:
        raise UserError(f"{flag} plans for this machine's CPU ranks (plscale plan --here): run it with --cpu on one "
                        f"node; for GPUs, plan with `plscale plan --gpu H100 ...` and set parallel.* by hand.")


def layout_variant(lab: Lab, variant: Variant, opts: Options, spec: str | None) -> Variant:
    """--layout plan.json[:N]: the planner's candidate as a variant of the lab, named after its
    layout (plscale.run.layouts); the variant unchanged without one."""
    if spec is None:
        return variant
    from plscale.run import layouts
    if not lab.sweep_layouts:
        raise UserError(f"--layout: lab {lab.id} takes no planner layout; lab 4d does (plscale lab list).")
    layouts.check_sets(opts.sets, "--layout")
    base = prepare(lab, variant, opts)
    here_only(base.plan, "--layout")
    return layouts.chosen(spec, base.resolved.settings, base.plan.world_size)


def prepare_sweep(lab: Lab, opts: Options, console: Console | None = None) -> Sweep:
    """Every sweep variant prepared, so a bad one fails before any runs; a lab whose sweep is the
    planner's layouts measures this machine and plans first (plscale.run.layouts)."""
    if lab.sweep_layouts:
        from plscale.run import layouts
        layouts.check_sets(opts.sets, "--sweep")
        base = prepare(lab, lab.variant(None), opts)
        here_only(base.plan, "--sweep")
        found = layouts.planned(lab, base.resolved.settings, base.plan.world_size,
                                lambda v: prepare(lab, v, opts), console or Console())
        if not found.runs:
            raise UserError(f"No layout of {base.plan.world_size} ranks that the planner offers does lab {lab.id} run: "
                            + "; ".join(found.left_out))
        return Sweep([prepare(lab, v, opts) for v, _ in found.runs], {"planned": [c for _, c in found.runs]},
                     {"machine": found.machine, "left_out": found.left_out})
    if not lab.sweep:
        raise UserError(f"Lab {lab.id} has no sweep: run its variants one by one (plscale lab show {lab.id}).")
    return Sweep([prepare(lab, lab.variant(v), opts) for v in lab.sweep])


def describe(prepared: Prepared, runs: Path | None = None) -> tuple[str, str]:
    """(`lab / variant: how the ranks run`, the shell command): what --dry-run prints, with the
    run directory a run would get now."""
    the_plan, resolved = prepared
    named = new_run_dir(resolved.lab.id, resolved.variant.name, runs, create=False)
    return f"{resolved.lab.id} / {resolved.variant.name}: {the_plan.notice}", the_plan.at(named).shell()


def launch(prepared: Prepared, console: Console | None = None, command: list[str] | None = None,
           runs: Path | None = None) -> Path:
    """Claim the run directory (under `runs`, else PLSCALE_RUNS_DIR or ./runs), write the hand-off
    into it (command.txt says `command`, else the `plscale lab run` these options stand for),
    run the ranks; the run directory, or RunFailed."""
    from plscale.run import runner

    console = console or Console()
    the_plan, resolved = prepared
    run_dir = new_run_dir(resolved.lab.id, resolved.variant.name, runs)
    the_plan = the_plan.at(run_dir)
    write_inputs(run_dir, the_plan, resolved, command or ["plscale", "lab", "run", resolved.lab.id,
                                                          "--variant", resolved.variant.name])
    console.print(f"[bold]{resolved.lab.id}[/] / {resolved.variant.name}: {escape(the_plan.notice)}")
    console.print(f"run directory: {run_dir}")
    code = runner.run(the_plan, run_dir, console)
    if code != 0:
        if (run_dir / "summary.json").is_file():  # finished with a failed check: its figures still count
            report(run_dir, console)
        raise RunFailed(code, run_dir)
    return run_dir


def report(run_dir: Path, console: Console | None = None) -> None:
    """A finished run's summary; on a node other than node 0, where to find it."""
    console = console or Console()
    if (Path(run_dir) / "summary.json").exists():
        show(run_dir, console)
    else:  # a node other than node 0: global rank 0 wrote the summary there
        console.print(f"This node's ranks finished; node 0's run directory holds the summary. Logs: {run_dir}")


def run(name: str, opts: Options | None = None, variant: str | None = None, console: Console | None = None,
        command: list[str] | None = None, runs: Path | None = None, layout: str | None = None) -> Path:
    """`plscale lab run NAME` from this process: the run directory once the ranks finished."""
    opts = opts or Options()
    lab, chosen = choose(name, variant, data_dir=opts.data_dir)
    chosen = layout_variant(lab, chosen, opts, layout)
    return launch(prepare(lab, chosen, opts), console, command or command_line(name, opts, variant), runs)


def sweep(name: str, opts: Options | None = None, console: Console | None = None,
          command: list[str] | None = None, runs: Path | None = None) -> Path:
    """`plscale lab run NAME --sweep`: every sweep variant in turn, then the lab's sweep report
    on the sweep directory (sweep.json lists the runs); the sweep directory."""
    opts = opts or Options()
    lab, _ = choose(name, sweep=True, data_dir=opts.data_dir)
    return run_sweep(lab, prepare_sweep(lab, opts, console), console, command or command_line(name, opts, sweep=True),
                     runs)


def run_sweep(lab: Lab, prepared: Sweep, console: Console | None = None,
              command: list[str] | None = None, runs: Path | None = None) -> Path:
    """Run prepared sweep variants in turn, then the lab's sweep report; the sweep directory. A run
    that fails does not stop the others: the report covers those that finished, sweep.json lists
    the failed ones, and RunFailed follows the report."""
    console = console or Console()
    sweep_dir = new_run_dir(lab.id, "sweep", runs)
    finished, failed = [], []
    for i, p in enumerate(prepared.runs, 1):
        console.print(f"[bold]sweep {i} of {len(prepared.runs)}[/]")
        try:
            finished.append((i - 1, str(launch(p, console, command, runs))))
        except RunFailed as exc:
            failed.append({"variant": p.resolved.variant.name, "run": str(exc.run_dir), "exit_code": exc.code})
            console.print(f"[red]{p.resolved.variant.name} failed[/] (exit code {exc.code}): the sweep goes on")
    kept = [i for i, _ in finished]
    per_run = {key: [values[i] for i in kept] for key, values in (prepared.per_run or {}).items()}
    write_json(sweep_dir / "sweep.json", {"lab": lab.id, "variants": [prepared.runs[i].resolved.variant.name for i in kept],
                                          "runs": [d for _, d in finished], **per_run, **(prepared.record or {}),
                                          "failed": failed})
    if lab.sweep_report and finished:
        script = [sys.executable, str(lab.folder / lab.sweep_report), str(sweep_dir)]
        if console.file is sys.stdout:  # the terminal: the script prints there itself
            code = subprocess.call(script)
        else:
            done = subprocess.run(script, capture_output=True, text=True)
            console.print(done.stdout + done.stderr, end="", markup=False, highlight=False)
            code = done.returncode
        if code != 0:
            raise RunFailed(code, sweep_dir)
    if failed:
        raise RunFailed(failed[0]["exit_code"], sweep_dir)
    return sweep_dir


# `plscale lab run`'s flags, for a command written as words (lab.yaml's `figures:` runs, command.txt).
# tests/test_flow.py checks they are exactly the CLI's.
FLAGS = {"--variant": "variant", "-v": "variant", "--gpus": "gpus", "-g": "gpus", "--launcher": "launcher",
         "--nodes": "nodes", "--hostfile": "hostfile", "--node-rank": "node_rank", "--master-addr": "master_addr",
         "--master-port": "master_port", "--cpu": "cpu", "--steps": "steps", "--set": "sets",
         "--ds-config": "ds_config", "--data-dir": "data_dir", "--max-restarts": "max_restarts",
         "--layout": "layout", "--sweep": "sweep", "--dry-run": "dry_run", "--profile": "profile"}


class Request(NamedTuple):
    """A `plscale lab run` command line, parsed."""
    name: str
    variant: str | None
    opts: Options
    sweep: bool = False
    dry_run: bool = False
    layout: str | None = None


def parse(words: list[str], prog: str = "plscale lab run") -> Request:
    """`lab run zero --sweep --gpus 2 --cpu` (with or without `plscale lab run`) as a Request;
    UserError for words `plscale lab run` would refuse, naming `prog`."""
    words = list(words)
    if words[:1] == ["plscale"]:
        words = words[1:]
    if words[:2] == ["lab", "run"]:
        words = words[2:]
    parser = _Parser(prog=prog, add_help=False)
    parser.add_argument("name")
    for dest in dict.fromkeys(FLAGS.values()):
        names = [flag for flag, d in FLAGS.items() if d == dest]
        if dest in ("cpu", "sweep", "dry_run"):
            parser.add_argument(*names, dest=dest, action="store_true")
        elif dest == "sets":
            parser.add_argument(*names, dest=dest, action="append", default=[])
        else:
            kind = int if dest in ("gpus", "nodes", "node_rank", "master_port", "steps", "max_restarts",
                                   "profile") else str
            parser.add_argument(*names, dest=dest, type=kind,
                                default={"nodes": 1, "master_addr": "127.0.0.1"}.get(dest))
    args = parser.parse_args(words)
    opts = Options(args.gpus, args.launcher, args.nodes, args.hostfile, args.node_rank, args.master_addr,
                   args.master_port, args.cpu, args.steps, list(args.sets), args.ds_config, args.data_dir,
                   args.max_restarts, args.profile)
    return Request(args.name, args.variant, opts, args.sweep, args.dry_run, args.layout)


def command_line(name: str, opts: Options, variant: str | None = None, sweep: bool = False) -> list[str]:
    """The `plscale lab run` these options stand for (what command.txt records)."""
    words = ["plscale", "lab", "run", name] + (["--variant", variant] if variant else [])
    defaults = Options()
    for flag, dest in FLAGS.items():
        if flag.startswith("--") and dest not in ("variant", "sweep", "dry_run", "sets", "layout") \
                and getattr(opts, dest) != getattr(defaults, dest):
            value = getattr(opts, dest)
            words += [flag] if value is True else [flag, str(value)]
    for text in opts.sets:
        words += ["--set", text]
    return words + (["--sweep"] if sweep else [])


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        raise UserError(f"{self.prog}: {message}.")
