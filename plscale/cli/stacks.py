"""`plscale stacks [RUN]`: every rank's Python stack, now, of a run that is still going.

Each rank registers faulthandler on SIGUSR1 at start (plscale/rank/logs.py) and records its pid
in the run directory's pids/. This command sends each live rank the signal and prints what it
wrote to stacks/rank_N.txt: every thread's stack, most recent call first, so a hung run shows
which collective each rank is waiting in and which rank is elsewhere. Then each rank's Flight
Recorder (plscale/rank/flight.py): its newest collective in each group, by sequence number, and
the first collective the ranks disagree on, if any. Host side: no torch import.
"""

import os
import signal
import socket
import time
from pathlib import Path

import typer
from rich.markup import escape

from plscale.cli.output import console
from plscale.errors import UserError


def stacks(run: Path = typer.Argument(None, help="A run directory, or a run name under the runs directory "
                                                 "(default: the newest run)."),
           wait: float = typer.Option(5.0, help="Seconds to wait for each rank's answer.")) -> None:
    """Print the Python stack of every rank of a running lab (why is it hung, where is each rank)."""
    run_dir = _run_dir(run)
    ranks = _live_ranks(run_dir)
    marks = {r: _size(run_dir / "stacks" / f"rank_{r}.txt") for r in ranks}
    for rank, pid in ranks.items():
        os.kill(pid, signal.SIGUSR1)
    deadline = time.monotonic() + wait
    texts = {}
    while len(texts) < len(ranks) and time.monotonic() < deadline:
        time.sleep(0.1)
        for rank in ranks:
            path = run_dir / "stacks" / f"rank_{rank}.txt"
            if rank not in texts and _size(path) > marks[rank]:
                time.sleep(0.1)  # let it finish writing
                with open(path, "rb") as f:
                    f.seek(marks[rank])
                    texts[rank] = f.read().decode("utf-8", "replace")
    for rank in sorted(ranks):
        console.rule(f"rank {rank} (pid {ranks[rank]})")
        console.print(escape(_main_first(texts[rank])) if rank in texts else
                      f"[yellow]no answer within {wait:g} s[/]", highlight=False)
    silent = sorted(set(ranks) - set(texts))
    console.print(f"{len(texts)} of {len(ranks)} rank(s) answered; the stacks are appended to "
                  f"{escape(str(run_dir / 'stacks'))}/." + (f" Silent: rank(s) {', '.join(map(str, silent))}." if silent
                                                             else ""))
    _flight_recorder(run_dir, ranks, wait)


def _flight_recorder(run_dir: Path, ranks: dict[int, int], wait: float) -> None:
    """Ask each rank for its Flight Recorder record (a write to its FIFO), then read them."""
    from plscale.lab.rundir import asking_dir
    from plscale.run import diagnose

    folder = run_dir / "flight" / "live"
    before = {r: _mtime(folder / f"rank_{r}.pkl") for r in ranks}
    asked = [r for r in ranks if _ask(asking_dir(run_dir) / f"ask_rank_{r}")]
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline and any(_mtime(folder / f"rank_{r}.pkl") == before[r] for r in asked):
        time.sleep(0.1)
    recs = {r: rec for r, rec in diagnose.records(run_dir, "flight/live").items() if r in asked}
    if not recs:
        console.print("Flight Recorder: no rank answered (a lab started before plscale kept one, or a "
                      "filesystem without FIFOs).")
        return
    console.rule("Flight Recorder: each rank's newest collective")
    console.print(escape("\n".join(diagnose.last_collectives(recs) + diagnose.disagreement(recs, live=True))),
                  highlight=False)


def _ask(fifo: Path) -> bool:
    try:  # non-blocking: a rank that is gone (no reader) is not waited for
        fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
    except OSError:
        return False
    os.write(fd, b"?")
    os.close(fd)
    return True


def _mtime(path: Path) -> float:
    return path.stat().st_mtime_ns if path.is_file() else 0


def _run_dir(run: Path | None) -> Path:
    from plscale.lab.rundir import runs_root

    if run is None:
        found = sorted(p for p in runs_root().glob("*") if (p / "settings.json").is_file())
        if not found:
            raise UserError(f"No runs under {runs_root()}/: start a lab first (plscale lab run mnist-dp).")
        return found[-1]
    path = run if run.is_dir() else runs_root() / run
    if not (path / "settings.json").is_file():
        raise UserError(f"{run} is not a run directory (no settings.json): give one under {runs_root()}/.")
    return path


def _live_ranks(run_dir: Path) -> dict[int, int]:
    """rank -> pid of the ranks of this run still running on this machine."""
    here, live, elsewhere = socket.gethostname(), {}, []
    for path in sorted((run_dir / "pids").glob("rank_*")):
        pid, host = (path.read_text().split() + [""])[:2]
        rank = int(path.name.removeprefix("rank_"))
        if host != here:
            elsewhere.append(f"rank {rank} on {host}")
            continue
        if _alive(pid):
            live[rank] = int(pid)
    if not live:
        where = f" ({', '.join(elsewhere)}: run `plscale stacks` there)" if elsewhere else ""
        ended = "it finished (summary.json)" if (run_dir / "summary.json").is_file() else "it ended"
        raise UserError(f"No rank of {run_dir.name} is running on this machine{where}: {ended}; its logs are "
                        f"rank_N.log in {run_dir}.")
    return live


def _alive(pid: str) -> bool:
    """Running (an exited rank its parent has not reaped yet is a zombie: it answers no signal)."""
    try:
        os.kill(int(pid), 0)
    except (ProcessLookupError, PermissionError, ValueError):
        return False
    stat = Path(f"/proc/{pid}/stat")
    return not (stat.is_file() and stat.read_text().rsplit(")", 1)[-1].split()[:1] == ["Z"])


def _size(path: Path) -> int:
    return path.stat().st_size if path.is_file() else 0


def _main_first(text: str) -> str:
    """The main thread (the one running the script's <module>) first: what a student reads first;
    plscale's own Flight Recorder thread, always waiting on its FIFO, left out."""
    blocks = [b for b in text.strip().split("\n\n") if b.strip() and "plscale/rank/flight.py" not in b]
    return "\n\n".join(sorted(blocks, key=lambda b: " in <module>" not in b))
