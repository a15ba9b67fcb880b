"""One rank of an exercise check: `python -m plscale.exercises.worker SPEC.json RANK` (runner.py starts them).

SPEC names the jobs (an exercise and the student's file each), the rank counts to check on,
a TCPStore port and the timeouts. For each job and each rank count, the ranks below that
count join a gloo group and run the exercise's checks in order; every result is appended to
OUT/rank<R>.jsonl as soon as it is known (so a host that kills a hung rank knows where it hung).

After each check the ranks agree through the store, not the group (a group may be broken):
when a rank raised (not a clean FAIL), they rebuild the group under fresh store keys, so no
message left in flight reaches the next check; when a rank timed out waiting for a message
(a deadlock), the checks left of that job are skipped. A file that cannot be checked (it
raises or exits while being imported, or lacks a function of the skeleton) is one `problem`
record, and the job stops there.
"""

import ast
import importlib
import importlib.util
import json
import os
import sys
import time
import traceback
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from plscale.exercises.harness import ERROR, HUNG, run


def load_student(path: str, name: str):
    """The student's file as a module (it may be called ring-allreduce.py: not importable by name)."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


class Out:
    def __init__(self, path: Path):
        self.handle = path.open("a")

    def write(self, **record) -> None:
        self.handle.write(json.dumps({**record, "time": round(time.time(), 3)}) + "\n")
        self.handle.flush()


def barrier(store, key: str, ranks: int) -> None:
    """Wait until every rank has reached `key` (through the store: no group needed)."""
    store.add(key, 1)
    while store.add(key, 0) < ranks:
        time.sleep(0.01)


def check_job(j: int, job: dict, rank: int, ranks: int, store, op_timeout: float, out: Out) -> None:
    checks = importlib.import_module(f"plscale.exercises.{job['package']}.checks").CHECKS
    out.write(job=j, checks=[c.name for c in checks], hints=[c.hint for c in checks])
    stop = False
    for world in job["worlds"]:
        # after a deadlock or a broken file the larger rank counts are not tried
        if rank < world and not stop and check_world(j, job, world, checks, rank, store, op_timeout, out):
            store.add(f"stop/job{j}", 1)
        barrier(store, f"done/job{j}/world{world}", ranks)  # the ranks above `world` wait here
        stop = bool(int(store.add(f"stop/job{j}", 0)))


def required(skeleton: str) -> list[str]:
    """What the checks call: the functions and classes the skeleton defines at its top level."""
    tree = ast.parse(Path(skeleton).read_text())
    return [node.name for node in tree.body if isinstance(node, (ast.FunctionDef, ast.ClassDef))]


def load(job: dict, name: str):
    """(the student's module, '') or (None, what keeps the checks from running it, in one line)."""
    try:
        student = load_student(job["file"], name)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) or exc.code is None else 1
        return None, f"your file exited while being imported (exit code {code or 0}): take the exit out of it"
    except Exception as exc:  # noqa: BLE001  (any error in the student's file; every rank fails alike)
        message = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else ""
        line = next((f" at line {f.lineno}" for f in reversed(traceback.extract_tb(exc.__traceback__))
                     if Path(f.filename).resolve() == Path(job["file"])), "")
        return None, (f"your file raised {type(exc).__name__} while being imported{line}: {message} "
                      f"(run `python {job['file']}` to see the whole error)")
    missing = [f"`{n}`" for n in required(job["skeleton"]) if not hasattr(student, n)]
    if missing:
        return None, (f"your file defines no {', no '.join(missing)}: the checks call "
                      f"{'it' if len(missing) == 1 else 'them'}; keep the names the skeleton gives")
    return student, ""


def check_world(j: int, job: dict, world: int, checks, rank: int, store, op_timeout: float, out: Out) -> bool:
    """The checks of one job on `world` ranks (this rank one of them); True when the job must
    stop: the checks deadlocked, or the file cannot be checked (every rank finds that alike)."""
    out.write(job=j, world=world, importing=True)
    student, problem = load(job, f"plscale_student_{j}_{world}")
    if problem:
        out.write(job=j, world=world, problem=problem)
        return True
    out.write(job=j, world=world, imported=True)
    generation = 0

    def join():
        prefix = f"job{j}/world{world}/group{generation}"
        dist.init_process_group("gloo", store=dist.PrefixStore(prefix, store), rank=rank, world_size=world,
                                timeout=timedelta(seconds=op_timeout))

    join()
    for i, check in enumerate(checks):
        out.write(job=j, world=world, started=check.name)
        torch.manual_seed(1000 * i + rank)
        result = run(check, student, rank, world, job["file"])
        out.write(job=j, world=world, **result)
        key = f"status/job{j}/world{world}/check{i}"
        store.set(f"{key}/rank{rank}", result["status"])
        statuses = {store.get(f"{key}/rank{r}").decode() for r in range(world)}
        if HUNG in statuses:
            for later in checks[i + 1:]:
                out.write(job=j, world=world, name=later.name, status="skipped",
                          detail="skipped: an earlier check deadlocked")
            dist.destroy_process_group()
            return True
        if ERROR in statuses:
            dist.destroy_process_group()
            generation += 1
            join()
    dist.destroy_process_group()
    return False


def main(spec_path: str, rank: int) -> None:
    spec = json.loads(Path(spec_path).read_text())
    os.environ["DS_ACCELERATOR"] = "cpu"
    torch.set_num_threads(1)
    out = Out(Path(spec["out"]) / f"rank{rank}.jsonl")
    store = dist.TCPStore("127.0.0.1", spec["port"], spec["ranks"], rank == 0,
                          timeout=timedelta(seconds=spec["timeout"]))
    for j, job in enumerate(spec["jobs"]):
        check_job(j, job, rank, spec["ranks"], store, spec["op_timeout"], out)
    out.write(finished=True)
    barrier(store, "finished", spec["ranks"])
    if rank == 0:  # rank 0 serves the store: it leaves once the others have stopped using it
        barrier(store, "left", spec["ranks"])
    else:
        store.add("left", 1)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
    sys.stdout.flush()
    os._exit(0)  # the results are written: skip tearing torch down (seconds on a busy machine)
