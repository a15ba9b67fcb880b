"""One reader of DeepSpeed's comms logger: calls, bytes and seconds per collective.

DeepSpeed logs every collective it issues when the config has `"comms_logger":
{"enabled": true, "prof_all": true}`, in `comms_logger.comms_dict`:

    comms_dict[op][message bytes] = [calls, [latency ms, ...], [algbw, ...], [busbw, ...]]

Calls and bytes are plain counts. The latencies are not always per call: DeepSpeed 0.19
reads each op's timer with `elapsed(reset=False)`, so every record holds the running total
of that op's time over all sizes. `cumulative_latencies()` reads which the installed
version does, and `snapshot()` turns either into seconds per op.

    before = comms.snapshot()
    ...                                   # some steps
    per_step = comms.per_step(before, comms.stop(), steps)       # {op: Traffic}; logging off after
"""

import functools
import inspect
from contextlib import contextmanager
from dataclasses import dataclass


@dataclass(frozen=True)
class Traffic:
    calls: float
    bytes: float
    seconds: float

    def __sub__(self, other: "Traffic") -> "Traffic":
        return Traffic(self.calls - other.calls, self.bytes - other.bytes, self.seconds - other.seconds)

    def __truediv__(self, n: float) -> "Traffic":
        return Traffic(self.calls / n, self.bytes / n, self.seconds / n)


def _logger():
    from deepspeed.comm.comm import comms_logger

    return comms_logger


def enabled() -> bool:
    return bool(_logger().enabled)


@functools.cache
def cumulative_latencies() -> bool:
    """True when this DeepSpeed version logs running totals of each op's time (never reset)."""
    from deepspeed.comm import comm

    try:
        return "reset=False" in inspect.getsource(comm.timed_op)
    except (OSError, TypeError):  # no source installed: assume the versions plscale is tested on (0.19)
        return True


def snapshot() -> dict[str, Traffic]:
    """Totals so far per collective (op name as DeepSpeed logs it)."""
    out = {}
    for op, sizes in _logger().comms_dict.items():
        calls = sum(record[0] for record in sizes.values())
        nbytes = sum(size * record[0] for size, record in sizes.items())
        latencies = [ms for record in sizes.values() for ms in record[1]]
        ms = max(latencies, default=0.0) if cumulative_latencies() else sum(latencies)
        out[op] = Traffic(calls, nbytes, ms / 1000)
    return out


def stop() -> dict[str, Traffic]:
    """The totals so far, and the logger off from here on. While it is on, DeepSpeed waits for
    every collective it logs to finish (the device synchronised after each), which serialises
    communication that would overlap compute: a lab logs a few steps and times the others."""
    totals = snapshot()
    _logger().enabled = False
    return totals


@contextmanager
def off():
    """The logger off for the block (the steps a lab times), then as it was."""
    was = _logger().enabled
    _logger().enabled = False
    try:
        yield
    finally:
        _logger().enabled = was


def per_step(before: dict, after: dict, steps: int, min_bytes: int = 1024) -> dict[str, Traffic]:
    """What each collective did per step between two snapshots; ops that moved less than
    `min_bytes` per step (loss scalars, flags) are left out."""
    zero = Traffic(0, 0, 0.0)
    rows = {op: (after[op] - before.get(op, zero)) / max(steps, 1) for op in after}
    return {op: t for op, t in rows.items() if t.bytes >= min_bytes}


def calls_by_size() -> dict[str, dict[int, int]]:
    """Calls per message size per collective, for a run's summary."""
    return {op: {int(size): record[0] for size, record in sizes.items()}
            for op, sizes in _logger().comms_dict.items()}
