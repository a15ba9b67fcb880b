"""The allocator's history of one training step: every allocation and free, in time order.

The tensor census (census.py) counts what is alive at one moment, and its saved-tensors
hook sees only what autograd saves through the hook; recomputation hides what it keeps
inside torch.utils.checkpoint's own hooks. The allocator sees everything: torch's profiler,
with profile_memory=True, records each allocation (+bytes) and each free (-bytes) with its
time, on CPU and on CUDA alike. Named intervals come from torch.profiler.record_function:

    with allocations.record(device) as rec:
        with allocations.phase("forward"):  loss = engine(x, y)
        with allocations.phase("backward"): engine.backward(loss)
        with allocations.phase("step"):     engine.step()
    h = rec.history
    h.kept()              bytes allocated during the forward and still held at its end: what
                          the forward leaves for the backward (activations, the loss)
    h.live()              (seconds, bytes allocated since the step began), event by event
    h.peak()              the most bytes allocated above the step's start, at any moment
    h.runs("layer 0")     each interval a label ran in: a second one inside the backward is
                          a recomputation (plscale.strategies.recompute.llama labels layers and cores)

Bytes are relative to the start of the recording (the allocator knows deltas, not the
level); on CUDA, add torch.cuda.memory_allocated() taken before it for the level. A block
allocated before the recording and freed inside it is not seen (torch warns once: "Memory
block of unknown size was allocated before the profiling started"). On CPU each event is a
tensor's bytes. On CUDA it is a block of the caching allocator: sizes rounded up to 512
bytes, and a block split from a larger one may carry some of its rest, so a history there
counts a little above the tensors' bytes.
"""

import gc
import os
import sys
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass, field
from itertools import accumulate

import torch
from torch.profiler import ProfilerActivity, profile, record_function

PHASE = "phase:"


def phase(name: str):
    """Mark a phase of the step (forward, backward, step) in the history."""
    return record_function(PHASE + name)


@dataclass
class Interval:
    name: str
    start: int  # ns since the history's start
    end: int

    def holds(self, t: int) -> bool:
        return self.start <= t <= self.end


@dataclass
class History:
    device: str                                   # "cpu" or "cuda"
    times: list = field(default_factory=list)     # ns since the start, one per allocator event
    deltas: list = field(default_factory=list)    # + bytes allocated, - bytes freed
    phases: list = field(default_factory=list)    # Interval per phase, in time order
    labels: list = field(default_factory=list)    # Interval per run of every other label

    def net(self, start: int, end: int) -> int:
        """Bytes allocated minus bytes freed between two times."""
        return sum(d for t, d in zip(self.times, self.deltas) if start <= t <= end)

    def phase(self, name: str) -> Interval:
        return next(p for p in self.phases if p.name == name)

    def kept(self, phase: str = "forward") -> int:
        """Bytes allocated during the phase and still held at its end."""
        p = self.phase(phase)
        return self.net(p.start, p.end)

    def live(self) -> tuple[list, list]:
        """(seconds since the start, bytes allocated since the start) after each event."""
        return [t / 1e9 for t in self.times], list(accumulate(self.deltas))

    def peak(self, phase: str | None = None) -> int:
        """The most bytes allocated above the start, during one phase or the whole history."""
        _, level = self.live()
        window = self.phase(phase) if phase else None
        return max((b for t, b in zip(self.times, level) if window is None or window.holds(t)), default=0)

    def runs(self, label: str) -> list:
        return [i for i in self.labels if i.name == label]

    def reran(self, label: str, phase: str = "backward") -> bool:
        """Whether the label ran (again) inside the phase: recomputed there."""
        window = self.phase(phase)
        return any(window.holds(i.start) for i in self.runs(label))

    def left_by(self, label: str, phase: str = "forward") -> int:
        """Bytes the label's first run inside the phase allocated and still held when it ended."""
        window = self.phase(phase)
        run = next(i for i in self.runs(label) if window.holds(i.start))
        return self.net(run.start, run.end)

    def to_dict(self) -> dict:
        """Plain data for summary.json (times in seconds)."""
        seconds, level = self.live()
        return {"device": self.device, "seconds": seconds, "bytes": level,
                "phases": {p.name: [p.start / 1e9, p.end / 1e9] for p in self.phases},
                "labels": [[i.name, i.start / 1e9, i.end / 1e9] for i in self.labels]}


class Recorder:
    history: History | None = None


@contextmanager
def record(device: torch.device):
    """Record the allocator's events on `device` (and every labelled interval) inside the block."""
    if torch.autograd.profiler._is_profiler_enabled:   # kineto records one session at a time
        raise RuntimeError("the allocator's history runs torch.profiler, and a profiler is already recording "
                           "(--profile of the same step?): profile another step, or leave --profile out")
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.synchronize(device)
    # Python's cycle collector, run inside, would free whatever old garbage it finds (an earlier
    # model, say) in the middle of the history: collect it first, and pause the collector.
    gc.collect()
    rec = Recorder()
    prof = profile(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else []), profile_memory=True)
    gc.disable()
    try:
        with _without_tracepoints():
            prof.start()
        try:
            yield rec
            if cuda:
                torch.cuda.synchronize(device)
        finally:
            with _without_tracepoints():
                prof.stop()
    finally:
        gc.enable()
    # The raw events, each with its time and bytes (prof.events() folds the memory rows into
    # per-operator totals). kineto_results is not public API: torch 2.13 has it.
    rec.history = from_events(prof.profiler.kineto_results.events(), device)


@contextmanager
def _without_tracepoints():
    """Kineto prints 'USDT: ... profiler_start' (and _stop) straight to file descriptor 2 each
    time; catch the descriptor while it starts or stops and pass on everything else."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as caught:
        os.dup2(caught.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            caught.seek(0)
            rest = [line for line in caught.read().decode(errors="replace").splitlines(keepends=True)
                    if not line.startswith(("USDT:", "STAGE:"))]
            sys.stderr.write("".join(rest))


def from_events(events, device: torch.device) -> History:
    """A History from the profiler's events: memory events of `device`'s type, the intervals
    of record_function labels (phases apart from the rest), times from the first event."""
    want = "CUDA" if device.type == "cuda" else "CPU"
    index = (device.index if device.index is not None else torch.cuda.current_device()) if device.type == "cuda" else None
    memory = sorted((e.start_ns(), e.nbytes()) for e in events
                    if e.name() == "[memory]" and str(e.device_type()).endswith(want)
                    and (index is None or e.device_index() == index))
    marks = sorted((e.start_ns(), e.end_ns(), e.name()) for e in events  # the host's copy of each label
                   if e.is_user_annotation() and str(e.device_type()).endswith("CPU"))
    origin = min([t for t, _ in memory[:1]] + [s for s, _, _ in marks[:1]], default=0)
    h = History(device.type, [t - origin for t, _ in memory], [b for _, b in memory])
    for start, end, name in marks:
        interval = Interval(name.removeprefix(PHASE), start - origin, end - origin)
        (h.phases if name.startswith(PHASE) else h.labels).append(interval)
    return h
