"""Watching a multi-process run from outside, for benchmarks on a shared, noisy machine (Linux).

    with Others() as others:                       # the CPU share other processes took meanwhile
        window = watch(argv, env, "runs/x/*/metrics.jsonl", first=6, last=30)
    window.wall_s, window.cpu_s                    # over steps 6..29: wall clock, CPU of the whole tree

`watch` starts a command and follows a file that gets one line per finished step (the
lab's metrics.jsonl, a bare loop's step file). When line `first` appears it notes the clock
and the CPU seconds of the command's whole process tree (launcher, ranks, the CLI that
reads their output), again at line `last`. CPU seconds per step move much less than wall
time when other processes compete for the cores, so they tell a real cost from noise.
"""

import glob
import os
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

TICK = os.sysconf("SC_CLK_TCK")


@dataclass
class Window:
    steps: int        # steps between the two marks
    wall_s: float     # wall clock between them
    cpu_s: float      # CPU seconds of the whole process tree between them


def _stat(pid: int) -> list[str] | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text[text.rindex(")") + 2:].split()  # fields from the state on (the name may hold spaces)


def tree_cpu(root: int) -> float:
    """CPU seconds (user + system, own and reaped children's) of root and all its descendants."""
    parent, cpu = {}, {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            fields = _stat(int(entry))
            if fields:
                parent[int(entry)] = int(fields[1])
                cpu[int(entry)] = sum(int(x) for x in fields[11:15]) / TICK  # utime stime cutime cstime
    keep, grew = {root}, True
    while grew:
        more = {pid for pid, ppid in parent.items() if ppid in keep} - keep
        keep |= more
        grew = bool(more)
    return sum(cpu.get(pid, 0.0) for pid in keep)


def _lines(pattern: str) -> int:
    found = glob.glob(pattern)
    if not found:
        return 0
    with open(found[0], "rb") as f:
        return f.read().count(b"\n")


def watch(argv: list, env: dict, lines: str, first: int, last: int, poll: float = 0.01) -> Window:
    """Run argv to the end; measure between the `first`-th and `last`-th line of the file `lines`
    (a glob). Raises CalledProcessError if the command fails."""
    proc = subprocess.Popen([str(a) for a in argv], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    marks = {}
    while proc.poll() is None:
        n = _lines(lines)
        for mark in (first, last):
            if n >= mark and mark not in marks:
                marks[mark] = (time.perf_counter(), tree_cpu(proc.pid), n)
        time.sleep(poll)
    if proc.returncode:
        raise subprocess.CalledProcessError(proc.returncode, argv)
    if len(marks) < 2:
        raise RuntimeError(f"{lines} never reached {last} lines")
    (t0, c0, n0), (t1, c1, n1) = marks[first], marks[last]  # n: the lines seen, should two come at once
    return Window(n1 - n0, t1 - t0, c1 - c0)


class Others:
    """The share of the machine's CPU that other processes used while the block ran:
    busy time from /proc/stat less the CPU of this process and its reaped descendants, over wall
    time x cores. Other people's tests on a shared machine show here."""

    def __enter__(self):
        self.t, self.busy, self.ours = time.time(), _busy_s(), _ours_s()
        return self

    def __exit__(self, *exc):
        wall = time.time() - self.t
        self.share = max(0.0, (_busy_s() - self.busy) - (_ours_s() - self.ours)) / (wall * os.cpu_count())


def _busy_s() -> float:
    """CPU seconds spent by everything on the machine since boot (/proc/stat; NaN elsewhere)."""
    try:
        fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except OSError:
        return float("nan")
    return (sum(fields[:8]) - fields[3] - fields[4]) / TICK  # all but idle and iowait


def _ours_s() -> float:
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system
