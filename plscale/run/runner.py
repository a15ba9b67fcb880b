"""Run a launch plan: stream rank 0 live, keep the launcher's log, stop every rank on
Ctrl-C, and when a rank fails, show that rank's last lines.

Ranks write their own logs (rank_N.log) and, when they crash, rank_N.error and their Flight
Recorder record (plscale/run/diagnose.py names the rank and the call from them); rank 0 prints
`PLSCALE_PROGRESS {json}` lines that become a live progress bar here.
"""

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

from plscale.lab.rundir import clear_node_scratch
from plscale.run import diagnose
from plscale.run.launch import Plan

PROGRESS = "PLSCALE_PROGRESS "
# The launchers' and DeepSpeed's own start-up chatter: kept in launcher.log, not shown.
CHATTER = re.compile(r"^\[\d{4}-\d\d-\d\d [\d:,]+\] \[(INFO|WARNING)\] \[(real_accelerator|runner|launch|"
                     r"constants|multinode_runner|comm|config_utils|logging)\.py|^W\d{4} .*torch/distributed|"
                     r"^\*{20,}|^Setting OMP_NUM_THREADS|^USDT:.*Profiler|^  warnings\.warn|^\S*torch/distributed/run\.py")


def run(plan: Plan, run_dir: Path, console: Console) -> int:
    env = {**os.environ, **plan.env}
    log_path = run_dir / "launcher.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen(plan.argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, bufsize=1, start_new_session=True)
        try:
            show(proc.stdout, console, log)
            code = proc.wait()
        except KeyboardInterrupt:
            console.print("[yellow]Interrupted: stopping every rank...[/]")
            stop(proc)
            return 130
        finally:
            clear_node_scratch(run_dir)  # the ranks' node-local scratch does not outlive the run
    if code != 0:
        report_failure(run_dir, code, console)
    return code


def progress_of(line: str) -> dict | None:
    """A `PLSCALE_PROGRESS {json}` line's fields (phase, step, total, text); None for another line, or one cut
    short (a job killed as rank 0 wrote it)."""
    if not line.startswith(PROGRESS):
        return None
    try:
        return json.loads(line[len(PROGRESS):])
    except ValueError:
        return None


def show(lines, console: Console, log=None) -> None:
    """The launcher's output as the console shows it: rank 0's lines, its progress as a bar (on a
    terminal; else a line every tenth), the launchers' chatter left out. Every line also goes to `log`."""
    bar = None
    task = None
    try:
        for line in lines:
            if log is not None:
                log.write(line)
                log.flush()
            line = line.rstrip("\n")
            if line.startswith(PROGRESS):
                info = progress_of(line)
                if info is None:
                    continue
                if console.is_terminal:
                    if bar is None:
                        bar = Progress(TextColumn("[bold]{task.description}"), BarColumn(),
                                       TextColumn("{task.completed}/{task.total} {task.fields[text]}"),
                                       TimeRemainingColumn(), console=console, transient=True)
                        bar.start()
                        task = bar.add_task(info.get("phase", "train"), total=info["total"], text="")
                    bar.update(task, completed=info["step"], total=info["total"],
                               description=info.get("phase", "train"), text=info.get("text", ""))
                elif info["step"] == info["total"] or info["step"] % max(1, info["total"] // 10) == 0:
                    console.print(f"  {info.get('phase', 'train')} {info['step']}/{info['total']} "
                                  f"{info.get('text', '')}", markup=False, highlight=False)
                continue
            if CHATTER.search(line):
                continue
            (bar.console if bar else console).print(line, markup=False, highlight=False)
    finally:  # Ctrl-C too: the terminal gets its cursor back
        if bar is not None:
            bar.stop()


def stop(proc: subprocess.Popen) -> None:
    """SIGINT, then SIGTERM, then SIGKILL to the whole process group: no orphan ranks."""
    for sig, wait in ((signal.SIGINT, 5), (signal.SIGTERM, 3), (signal.SIGKILL, 2)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        deadline = time.time() + wait
        while time.time() < deadline:
            if proc.poll() is not None:
                try:  # the launcher is gone; make sure its ranks are too
                    os.killpg(proc.pid, 0)
                except ProcessLookupError:
                    return
            time.sleep(0.1)


def report_failure(run_dir: Path, code: int, console: Console, launcher_log: str = "launcher.log") -> None:
    """What failed: a check of a finished run, else the failed ranks' last lines (the launcher's when no
    rank left an error) and the diagnosis."""
    summary = run_dir / "summary.json"
    if summary.is_file():  # the ranks finished: what failed is a check the lab asserts, not a rank
        failed = [c for c in json.loads(summary.read_text()).get("checks", []) if not c["ok"]]
        console.print(f"[bold red]The run finished, but {len(failed)} check(s) failed[/] (exit code {code}): "
                      + "; ".join(c["name"] for c in failed), highlight=False)
        return
    failed = sorted(run_dir.glob("rank_*.error"), key=lambda p: int(p.stem.split("_")[1]))
    console.print(f"[bold red]The run failed (exit code {code}).[/] Logs: {run_dir}")
    if failed:
        for marker in failed[:2]:
            rank = marker.stem.split("_")[1]
            console.print(f"[red]rank {rank} failed; its last lines:[/]")
            console.print(_tail(run_dir / f"rank_{rank}.log"), markup=False, highlight=False)
    else:
        console.print("[red]last lines of the launcher's output:[/]")
        console.print(_tail(run_dir / launcher_log), markup=False, highlight=False)
    diagnosis = diagnose.lines(run_dir)
    if diagnosis:
        console.print("[bold red]Diagnosis[/] (diagnosis.txt; every rank's stack under stacks/, the Flight "
                      "Recorder's records under flight/):")
        console.print("\n".join(diagnosis), markup=False, highlight=False)


def _tail(path: Path, lines: int = 15) -> str:
    try:
        text = [line for line in path.read_text(errors="replace").splitlines() if not line.startswith(PROGRESS)]
        return "\n".join(text[-lines:])
    except OSError:
        return f"({path.name} was not written)"
