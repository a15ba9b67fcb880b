"""What an exercise's checks.py is written with, inside each rank (worker.py runs them).

    CHECKS = Checks()

    @CHECKS.add("sums in place", hint="a nudge that names the idea, never the code")
    def sums_in_place(student, rank, world):     # student: the student's module, imported
        ...
        expect(ok, "what went wrong, on this rank")   # or close(actual, expected, "what")

A check passes when it returns. `Failed` (from `expect`/`close`) is a FAIL with its detail and
the check's hint; NotImplementedError raised in the student's file reads "not implemented
yet: <function>"; any other exception names its type, message and the student's line; a
gloo time-out waiting for a message is a deadlock (GLOO_TIMEOUT). A check does its own communication (a reference
collective, say) before its first `expect`, so ranks that fail still communicate alike.

`watch` counts calls: `with watch(student, "exchange") as calls:` replaces student.exchange
for the block by a wrapper that records each call's arguments in `calls` and runs the
original. `watch_collectives(student, "all_reduce", ...)` does so for torch.distributed's
collectives however the student's file reaches them: dist.all_reduce, distributed_c10d's,
a name imported into the file (`from torch.distributed import all_reduce`), or the process
group's own method (`dist.group.WORLD.allreduce`); a call inside a recorded one counts once.
(Not seen: torch.distributed._functional_collectives, which goes through torch.ops.)
"""

import re
import traceback
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d

# What the worker sends back per check: passed, failed, a TODO left, an exception, a hang.
PASS, FAIL, TODO, ERROR, HUNG = "pass", "fail", "todo", "error", "hung"


DEADLOCK_HINT = ("Every receive needs its peer to send, in the same order on both sides; a rank that "
                 "receives before it sends waits forever if its peer does the same.")


class Failed(Exception):
    """A property does not hold; the message says how, for this rank."""


def expect(condition, detail: str) -> None:
    if not condition:
        raise Failed(detail)


def close(actual, expected: torch.Tensor, what: str, atol: float = 1e-5, rtol: float = 1e-4) -> None:
    """`actual` is a tensor of `expected`'s shape and values (to float tolerance)."""
    expect(isinstance(actual, torch.Tensor), f"{what}: got {type(actual).__name__}, not a tensor")
    expect(tuple(actual.shape) == tuple(expected.shape),
           f"{what}: shape {list(actual.shape)}, expected {list(expected.shape)}")
    if not torch.allclose(actual.detach().float(), expected.float(), atol=atol, rtol=rtol):
        gap = (actual.detach().float() - expected.float()).abs().max().item()
        raise Failed(f"{what}: values differ (largest difference {gap:.3g})")


@dataclass
class Check:
    name: str
    hint: str
    fn: object


class Checks(list):
    """The checks of one exercise, in the order they run and print."""

    def add(self, name: str, hint: str):
        def register(fn):
            self.append(Check(name, hint, fn))
            return fn
        return register


@contextmanager
def watch(owner, *names: str):
    """Record the calls of owner.<name> for each name (that exists) in the block: a list of
    (name, args, kwargs), the originals still run."""
    calls, depth = [], [0]
    patches = [(owner, name, getattr(owner, name), name) for name in names if hasattr(owner, name)]
    with _patched(patches, calls, depth):
        yield calls


# The process group's methods under the name of the torch.distributed function that calls them.
GROUP_METHODS = {"allreduce": "all_reduce", "allreduce_coalesced": "all_reduce", "allgather": "all_gather",
                 "allgather_coalesced": "all_gather", "_allgather_base": "all_gather_into_tensor",
                 "allgather_into_tensor_coalesced": "all_gather_into_tensor", "reduce_scatter": "reduce_scatter",
                 "_reduce_scatter_base": "reduce_scatter_tensor",
                 "reduce_scatter_tensor_coalesced": "reduce_scatter_tensor", "broadcast": "broadcast",
                 "reduce": "reduce", "alltoall": "all_to_all", "alltoall_base": "all_to_all_single",
                 "gather": "gather", "scatter": "scatter", "send": "send", "recv": "recv"}


@contextmanager
def watch_collectives(student, *names: str):
    """Record the calls of torch.distributed's functions `names` (all_reduce, ...) in the
    block, reached through any namespace (module doc): a list of (name, args, kwargs)."""
    calls, depth, patches = [], [0], []
    for name in names:
        original = getattr(distributed_c10d, name, None) or getattr(dist, name, None)
        if original is None:
            continue
        patches += [(owner, attr, original, name) for owner in (dist, distributed_c10d, student)
                    for attr, value in list(vars(owner).items()) if value is original]
    group = dist.ProcessGroup
    for method, name in GROUP_METHODS.items():
        if name in names and method in vars(group):  # the raw descriptor: getattr's would not bind self again
            patches.append((group, method, vars(group)[method], name))
    with _patched(patches, calls, depth):
        yield calls


@contextmanager
def _patched(patches, calls, depth):
    """patches: (owner, attribute, its original, the name its calls are recorded under)."""
    try:
        for owner, attr, original, name in patches:
            setattr(owner, attr, _recorder(name, original, calls, depth))
        yield
    finally:
        for owner, attr, original, _ in reversed(patches):
            setattr(owner, attr, original)


def _recorder(name, original, calls, depth):
    def record(*args, **kwargs):
        if not depth[0]:  # not inside another recorded call
            calls.append((name, args, kwargs))
        depth[0] += 1
        try:
            return original(*args, **kwargs)
        finally:
            depth[0] -= 1
    return record


def run(check: Check, student, rank: int, world: int, student_file: str) -> dict:
    """One check on this rank: {name, status, detail, hint}."""
    result = {"name": check.name, "status": PASS, "detail": "", "hint": ""}
    try:
        check.fn(student, rank, world)
    except Failed as exc:
        result.update(status=FAIL, detail=str(exc), hint=check.hint)
    except SystemExit as exc:
        result.update(status=ERROR, detail=f"your code called sys.exit({exc.code!r}) instead of returning",
                      hint=check.hint)
    except NotImplementedError as exc:
        where = _student_frame(exc, student_file)
        result.update(status=TODO, detail=f"not implemented yet: {where.name if where else 'a TODO'}")
    except Exception as exc:  # noqa: BLE001  (the student's code may raise anything: name it and the line)
        if _is_timeout(exc):
            result.update(status=HUNG, detail="timed out waiting for a message that never came: the ranks wait for "
                          "each other (a deadlock?); the remaining checks are skipped", hint=DEADLOCK_HINT)
        else:
            where = _student_frame(exc, student_file)
            at = f" (line {where.lineno} of {Path(student_file).name}, in {where.name})" if where else ""
            message = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else ""
            result.update(status=ERROR, detail=f"raised {type(exc).__name__}: {message}{at}", hint=check.hint)
    return result


def _student_frame(exc: BaseException, student_file: str):
    """The innermost frame of the traceback in the student's file (qualified name, line), or None."""
    target = str(Path(student_file).resolve())
    found = None
    for frame, lineno in traceback.walk_tb(exc.__traceback__):
        if str(Path(frame.f_code.co_filename).resolve()) == target:
            found = _Frame(frame.f_code.co_qualname, lineno)
    return found


@dataclass
class _Frame:
    name: str
    lineno: int


# What gloo raises when a message does not come within the group's timeout (its recv, or a
# collective whose peer gave up waiting); anything else, a student's TimeoutError included, is an error.
GLOO_TIMEOUT = re.compile(r"Timed out waiting \d+ms for (recv|send) operation|Application timeout caused pair closure")


def _is_timeout(exc: Exception) -> bool:
    return isinstance(exc, RuntimeError) and bool(GLOO_TIMEOUT.search(str(exc)))
