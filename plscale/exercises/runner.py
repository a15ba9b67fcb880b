"""Run exercise checks on CPU ranks over gloo, from the host, with a time limit.

    results = run_checks([(find("ring-allreduce"), Path("exercises/ring-allreduce.py"))])
    results[0].passed, results[0].checks     # one JobResult per (exercise, file)

One process per rank, max(worlds) of them for all jobs together (starting a rank costs about
2 s of importing torch, so several files are checked in one start: the tests check every
reference solution, skeleton and wrong solution at once). Each rank writes its results line
by line (worker.py). A check passes only when it passed on every rank count of its exercise:
one the ranks never reached reads "not run on 3, 4 ranks" with the reason. Past `timeout`
seconds the host kills the ranks it started and names the check they were in: a deadlocked
student program fails in one line instead of hanging. A message that never comes times out
sooner, after `op_timeout` seconds, inside the check. A rank that dies takes the others with
it, and the line names the check and rank count it died in; so does Ctrl-C or SIGTERM to the
host (the ranks are killed, then KeyboardInterrupt / SystemExit(143) goes on).

Host side: imports no torch.
"""

import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from plscale.exercises import Exercise
from plscale.hardware import free_port

PASSED = "pass"


@dataclass
class CheckResult:
    name: str
    passed: bool
    status: str                # pass, fail, todo, error, hung, skipped, not run
    detail: str = ""           # for a failure: where (ranks, rank) and what
    hint: str = ""


@dataclass
class JobResult:
    exercise: Exercise
    file: Path
    checks: list[CheckResult] = field(default_factory=list)
    problem: str = ""          # why checks did not run: the file cannot be imported, a rank crashed, time ran out

    @property
    def passed(self) -> bool:
        return not self.problem and bool(self.checks) and all(c.passed for c in self.checks)

    @property
    def not_implemented(self) -> list[str]:
        """The TODOs left, each function once, in the order met."""
        names = [c.detail.removeprefix("not implemented yet: ") for c in self.checks if c.status == "todo"]
        return list(dict.fromkeys(names))


def run_checks(jobs: list[tuple[Exercise, Path]], timeout: float = 60.0, op_timeout: float | None = None,
               progress=None) -> list[JobResult]:
    """Check each (exercise, file) on its rank counts; all within `timeout` seconds."""
    ranks = max(w for exercise, _ in jobs for w in exercise.worlds)
    op_timeout = op_timeout or max(2.0, min(20.0, timeout / 3))
    with tempfile.TemporaryDirectory(prefix="plscale-exercise-") as tmp:
        out = Path(tmp)
        spec = {"port": free_port(), "ranks": ranks, "timeout": timeout, "op_timeout": op_timeout, "out": str(out),
                "jobs": [{"package": e.package, "file": str(Path(f).resolve()), "skeleton": str(e.skeleton),
                          "worlds": list(e.worlds)} for e, f in jobs]}
        (out / "spec.json").write_text(json.dumps(spec))
        env = {**os.environ, "OMP_NUM_THREADS": "1", "DS_ACCELERATOR": "cpu", "PYTHONUNBUFFERED": "1"}
        procs = []
        try:
            with _sigterm_raises():
                for r in range(ranks):
                    procs.append(subprocess.Popen(
                        [sys.executable, "-m", "plscale.exercises.worker", str(out / "spec.json"), str(r)],
                        stdout=(out / f"rank{r}.out").open("w"), stderr=subprocess.STDOUT, env=env))
                stop = _wait(procs, out, timeout, progress)
        finally:  # Ctrl-C, SIGTERM or any error here: no rank outlives the host
            _kill(procs)
        return _collect(jobs, out, stop)


@contextmanager
def _sigterm_raises():
    """SIGTERM raises SystemExit(143) here (so `finally` kills the ranks), instead of ending
    the host at once; only in the main thread, where signal handlers live."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum, frame):
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _wait(procs, out: Path, timeout: float, progress) -> "Crash | str":
    """'' when every rank finished; else what happened (the ranks killed): a Crash, or the
    line of a time-out."""
    deadline = time.monotonic() + timeout
    while True:
        codes = [p.poll() for p in procs]
        dead = [r for r, c in enumerate(codes) if c is not None and (c != 0 or not _finished(out, r))]
        if dead:  # the others would wait for it until their timeouts
            time.sleep(0.5)  # let them write what they saw
            _kill(procs)
            return _crash(out, dead, codes)
        if all(c is not None for c in codes):
            return ""
        if time.monotonic() > deadline:
            _kill(procs)
            where = _where(out)
            return (f"timed out after {timeout:g} s{' in ' + where if where else ''}: a rank waits for a message "
                    f"that never comes (deadlock) or loops forever")
        if progress:
            n = len(procs)
            progress(f"checking: {_where(out) or f'starting {n} rank' + ('s' if n > 1 else '')}")
        time.sleep(0.25)


def _kill(procs) -> None:
    for p in procs:  # only the ranks this run started
        if p.poll() is None:
            p.kill()
    for p in procs:
        p.wait()


def _tail(path: Path) -> str:
    lines = [line for line in path.read_text(errors="replace").splitlines() if line.strip()] if path.exists() else []
    return lines[-1].strip()[:300] if lines else ""


def _rank_records(out: Path, rank: int) -> list[dict]:
    path = out / f"rank{rank}.jsonl"
    lines = path.read_text().splitlines() if path.exists() else []
    return [json.loads(line) for line in lines if line.strip().endswith("}")]  # a half-written last line skipped


def _records(out: Path) -> list[dict]:
    ranks = sorted(int(p.stem.removeprefix("rank")) for p in out.glob("rank*.jsonl"))
    return [{**record, "rank": r} for r in ranks for record in _rank_records(out, r)]


def _finished(out: Path, rank: int) -> bool:
    records = _rank_records(out, rank)
    return any("finished" in r for r in records[-1:])


def _where(out: Path) -> str:
    """The check the ranks were last in: 'check "X" on 4 ranks'."""
    started = [r for r in _records(out) if "started" in r]
    return f'check "{started[-1]["started"]}" on {started[-1]["world"]} ranks' if started else ""


# gloo's check that a message fits the buffer posted for it (gloo/transport/tcp/pair.cc)
GLOO_SIZE = re.compile(r"op\.preamble\.length <= op\.nbytes\. (\d+) vs (\d+)")


@dataclass
class Crash:
    line: str                  # the one line shown: which rank, where, why
    check: str = ""            # the check it died in, and on how many ranks
    world: int = 0
    rank: int = 0
    why: str = ""


def _crash(out: Path, dead: list[int], codes: list) -> Crash:
    """The rank that died first: in which check and rank count, and why. A rank that died
    importing the student's file comes first, then one killed by a signal (gloo aborts), then
    the lowest: the others mostly died of losing it."""
    def last(r):
        return (_rank_records(out, r) or [{}])[-1]

    rank = min(dead, key=lambda r: ("importing" not in last(r), (codes[r] or 0) >= 0, r))
    code = codes[rank]
    exited = f"exit code {code}" if code >= 0 else f"killed by {signal.Signals(-code).name}"
    if "importing" in last(rank):
        return Crash(f"your file exited while being imported ({exited}): take the exit out of it")
    tail = _tail(out / f"rank{rank}.out")
    size = GLOO_SIZE.search(tail)
    if size:
        why = (f"a receive buffer's size differs from what the neighbour sent ({size[1]} bytes arrived for a "
               f"{size[2]}-byte buffer)")
    elif code == 0:
        why = "it exited (exit code 0) in the middle of the checks: does your code call os._exit or sys.exit?"
    else:
        why = f"{tail} ({exited})" if tail else exited
    steps = [r for r in _rank_records(out, rank) if "started" in r or "status" in r]
    if steps and "started" in steps[-1]:
        check, world = steps[-1]["started"], steps[-1]["world"]
        return Crash(f'rank {rank} crashed in check "{check}" on {world} ranks: {why}', check, world, rank, why)
    after = f' after check "{steps[-1]["name"]}" on {steps[-1]["world"]} ranks' if steps else ""
    return Crash(f"rank {rank} crashed{after}: {why}")


def _collect(jobs, out: Path, stop: "Crash | str") -> list[JobResult]:
    problem, crash = (stop.line, stop) if isinstance(stop, Crash) else (stop, None)
    records = _records(out)
    reached = max((r["job"] for r in records if "job" in r), default=0)
    results = []
    for j, (exercise, file) in enumerate(jobs):
        mine = [r for r in records if r.get("job") == j]
        if not problem or j < reached:
            stopped = ""
        else:
            stopped = problem if j == reached else f"not checked: the ranks stopped on an earlier file ({problem})"
        stopped = next((r["problem"] for r in mine if "problem" in r), stopped)
        listed = next((r for r in mine if "checks" in r), {})
        names = listed.get("checks") or list(dict.fromkeys(r["name"] for r in mine if "status" in r))
        hints = dict(zip(names, listed.get("hints", [])))
        rows = [r for r in mine if "status" in r]
        if crash and crash.check and j == reached:  # the check it died in: the crash, not what the others saw
            rows = [r for r in rows if (r["name"], r["world"]) != (crash.check, crash.world)]
            rows.append({"name": crash.check, "world": crash.world, "rank": crash.rank, "status": "crashed",
                         "detail": f"crashed: {crash.why}", "hint": hints.get(crash.check, "")})
        hung = min((r["world"] for r in rows if r["status"] == "hung"), default=None)
        why = "the run stopped (below)" if stopped else f"a check deadlocked on {hung} ranks" if hung else "not reached"
        checks = [_merge(name, [r for r in rows if r["name"] == name], exercise.worlds, why) for name in names]
        if stopped and not rows:  # nothing ran: the one line says it all
            checks = []
        results.append(JobResult(exercise, Path(file), checks, stopped))
    return results


def _ranks(worlds) -> str:
    return f"{', '.join(map(str, worlds))} rank{'s' if worlds != [1] else ''}"


def _merge(name: str, rows: list[dict], worlds, why: str) -> CheckResult:
    """One check over every rank and rank count: it passes when it passed on every rank of
    every rank count; a failure reports the first (fewest ranks, lowest rank) where it failed, a
    crash or a hang first (it explains its neighbours' broken connections); else the rank counts
    it never completed on are named, with `why`."""
    cause = {"crashed": 0, "hung": 1}
    bad = sorted((r for r in rows if r["status"] != PASSED),
                 key=lambda r: (r["world"], cause.get(r["status"], 2), r["rank"]))
    if bad:
        first = bad[0]
        if first["status"] == "todo":  # the same on every rank
            return CheckResult(name, False, "todo", first["detail"])
        where = f"{first['world']} ranks, rank {first['rank']}: " if first["world"] > 1 else ""
        return CheckResult(name, False, first["status"], where + first["detail"], first.get("hint", ""))
    ran = [w for w in worlds if len({r["rank"] for r in rows if r["world"] == w}) == w]
    missing = [w for w in worlds if w not in ran]
    if not missing:
        return CheckResult(name, True, PASSED)
    detail = (f"passed on {_ranks(ran)}; " if ran else "") + f"not run on {_ranks(missing)}: {why}"
    return CheckResult(name, False, "not run", detail)
