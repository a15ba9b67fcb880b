"""Run exercise checks on CPU ranks over gloo, from the host, with a time limit.

    results = run_checks([(find("ring-allreduce"), Path("exercises/ring-allreduce.py"))])
    results[0].passed, results[0].checks     # one JobResult per (exercise, file)

One process per rank, max(worlds) of them for all jobs together (starting a rank costs about
2 s of importing torch, so several files are checked in one start: the tests check every
reference solution, skeleton and wrong solution at once). Each rank writes its results line
by line (worker.py). Past `timeout` seconds the host kills the ranks it started and names the
check they were in: a deadlocked student program fails in one line instead of hanging. A
message that never comes times out sooner, after `op_timeout` seconds, inside the check.

Host side: imports no torch.
"""

import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from plscale.exercises import Exercise

PASSED = "pass"


@dataclass
class CheckResult:
    name: str
    passed: bool
    status: str                # pass, fail, todo, error, hung, skipped, timeout, crashed
    detail: str = ""           # for a failure: where (ranks, rank) and what
    hint: str = ""


@dataclass
class JobResult:
    exercise: Exercise
    file: Path
    checks: list[CheckResult] = field(default_factory=list)
    problem: str = ""          # the whole run failed: timed out or a rank crashed (one line)

    @property
    def passed(self) -> bool:
        return not self.problem and bool(self.checks) and all(c.passed for c in self.checks)

    @property
    def not_implemented(self) -> list[str]:
        """The TODOs left, each function once, in the order met."""
        names = [c.detail.removeprefix("not implemented yet: ") for c in self.checks if c.status == "todo"]
        return list(dict.fromkeys(names))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run_checks(jobs: list[tuple[Exercise, Path]], timeout: float = 60.0, op_timeout: float | None = None,
               progress=None) -> list[JobResult]:
    """Check each (exercise, file) on its rank counts; all within `timeout` seconds."""
    ranks = max(w for exercise, _ in jobs for w in exercise.worlds)
    op_timeout = op_timeout or max(2.0, min(20.0, timeout / 3))
    with tempfile.TemporaryDirectory(prefix="plscale-exercise-") as tmp:
        out = Path(tmp)
        spec = {"port": free_port(), "ranks": ranks, "timeout": timeout, "op_timeout": op_timeout, "out": str(out),
                "jobs": [{"package": e.package, "file": str(Path(f).resolve()), "worlds": list(e.worlds)}
                         for e, f in jobs]}
        (out / "spec.json").write_text(json.dumps(spec))
        env = {**os.environ, "OMP_NUM_THREADS": "1", "DS_ACCELERATOR": "cpu", "PYTHONUNBUFFERED": "1"}
        procs = [subprocess.Popen([sys.executable, "-m", "plscale.exercises.worker", str(out / "spec.json"), str(r)],
                                  stdout=(out / f"rank{r}.out").open("w"), stderr=subprocess.STDOUT, env=env)
                 for r in range(ranks)]
        problem = _wait(procs, out, timeout, progress)
        return _collect(jobs, out, ranks, problem)


def _wait(procs, out: Path, timeout: float, progress) -> str:
    """'' when every rank finished; else one line saying what happened (the ranks killed)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        codes = [p.poll() for p in procs]
        if all(c is not None for c in codes):
            break
        failed = [r for r, c in enumerate(codes) if c not in (None, 0)]
        if failed:  # one rank died: the others would wait for it until their timeouts
            time.sleep(0.5)
            _kill(procs)
            return f"rank {failed[0]} crashed: {_tail(out / f'rank{failed[0]}.out')}"
        if progress:
            progress(f"checking: {_where(out) or 'starting ' + str(len(procs)) + ' ranks'}")
        time.sleep(0.25)
    else:
        _kill(procs)
        where = _where(out)
        return (f"timed out after {timeout:g} s{' in ' + where if where else ''}: a rank waits for a message that "
                f"never comes (deadlock) or loops forever")
    failed = [r for r, p in enumerate(procs) if p.returncode != 0]
    return f"rank {failed[0]} crashed: {_tail(out / f'rank{failed[0]}.out')}" if failed else ""


def _kill(procs) -> None:
    for p in procs:  # only the ranks this run started
        if p.poll() is None:
            p.kill()
    for p in procs:
        p.wait()


def _tail(path: Path) -> str:
    lines = [line for line in path.read_text(errors="replace").splitlines() if line.strip()] if path.exists() else []
    return lines[-1].strip()[:300] if lines else "no output"


def _records(out: Path) -> list[dict]:
    records = []
    for path in sorted(out.glob("rank*.jsonl")):
        rank = int(path.stem.removeprefix("rank"))
        for line in path.read_text().splitlines():
            if line.strip():
                records.append({**json.loads(line), "rank": rank})
    return records


def _where(out: Path) -> str:
    """The check the ranks were last in: 'check "X" of job 0 on 4 ranks'."""
    started = [r for r in _records(out) if "started" in r]
    return f'check "{started[-1]["started"]}" on {started[-1]["world"]} ranks' if started else ""


def _collect(jobs, out: Path, ranks: int, problem: str) -> list[JobResult]:
    records = [r for r in _records(out) if "status" in r]
    results = []
    for j, (exercise, file) in enumerate(jobs):
        mine = [r for r in records if r["job"] == j]
        names = list(dict.fromkeys(r["name"] for r in mine))
        checks = [_merge(name, [r for r in mine if r["name"] == name]) for name in names]
        results.append(JobResult(exercise, Path(file), checks, _problem_of(j, jobs, out, problem)))
    return results


def _problem_of(j: int, jobs, out: Path, problem: str) -> str:
    """The run's problem belongs to the job the ranks were in when it happened, and to the
    jobs after it (they never ran); the jobs before it finished."""
    started = [r["job"] for r in _records(out) if "started" in r]
    return problem if problem and j >= (max(started) if started else 0) else ""


def _merge(name: str, rows: list[dict]) -> CheckResult:
    """One check over every rank and rank count: it passes when it passed everywhere; a
    failure reports the first (fewest ranks, lowest rank) where it failed."""
    bad = sorted((r for r in rows if r["status"] != PASSED), key=lambda r: (r["world"], r["rank"]))
    if not bad:
        return CheckResult(name, True, PASSED)
    first = bad[0]
    if first["status"] == "todo":  # the same on every rank
        return CheckResult(name, False, "todo", first["detail"])
    where = f"{first['world']} ranks, rank {first['rank']}: " if first["world"] > 1 else ""
    return CheckResult(name, False, first["status"], where + first["detail"], first.get("hint", ""))
