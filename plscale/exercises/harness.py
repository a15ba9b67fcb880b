"""What an exercise's checks.py is written with, inside each rank (worker.py runs them).

    CHECKS = Checks()

    @CHECKS.add("sums in place", hint="a nudge that names the idea, never the code")
    def sums_in_place(student, rank, world):     # student: the student's module, imported
        ...
        expect(ok, "what went wrong, on this rank")   # or close(actual, expected, "what")

A check passes when it returns. `Failed` (from `expect`/`close`) is a FAIL with its detail and
the check's hint; NotImplementedError raised in the student's file reads "not implemented
yet: <function>"; any other exception names its type, message and the student's line; a
torch.distributed timeout is a deadlock. A check does its own communication (a reference
collective, say) before its first `expect`, so ranks that fail still communicate alike.

`watch` counts calls: `with watch(dist, "all_reduce") as calls:` replaces dist.all_reduce for
the block by a wrapper that records each call's arguments in `calls` and runs the original.
"""

import traceback
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch

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
    calls, saved = [], {}
    for name in names:
        if hasattr(owner, name):
            saved[name] = getattr(owner, name)
            setattr(owner, name, _recorder(name, saved[name], calls))
    try:
        yield calls
    finally:
        for name, original in saved.items():
            setattr(owner, name, original)


def _recorder(name, original, calls):
    def record(*args, **kwargs):
        calls.append((name, args, kwargs))
        return original(*args, **kwargs)
    return record


def run(check: Check, student, rank: int, world: int, student_file: str) -> dict:
    """One check on this rank: {name, status, detail, hint}."""
    result = {"name": check.name, "status": PASS, "detail": "", "hint": ""}
    try:
        check.fn(student, rank, world)
    except Failed as exc:
        result.update(status=FAIL, detail=str(exc), hint=check.hint)
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


def _is_timeout(exc: Exception) -> bool:
    text = str(exc).lower()
    return "timed out" in text or "timeout" in text or type(exc).__name__ == "DistBackendError"
