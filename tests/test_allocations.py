"""The allocator's history from profiler events: device filtering, phases, labels, kept and
peak (stub events, so the CUDA path is exercised on a machine without a GPU)."""

from dataclasses import dataclass

import torch

from plscale.rank.allocations import from_events


@dataclass
class Event:
    name_: str
    start: int
    nbytes_: int = 0
    device: str = "DeviceType.CPU"
    index: int = -1
    end: int = 0
    annotation: bool = False

    def name(self):
        return self.name_

    def start_ns(self):
        return self.start

    def end_ns(self):
        return self.end

    def nbytes(self):
        return self.nbytes_

    def device_type(self):
        return self.device

    def device_index(self):
        return self.index

    def is_user_annotation(self):
        return self.annotation


def _step(device: str, index: int) -> list:
    """Forward allocates 100 and 50, frees 30; backward allocates 40 and frees 160."""
    mem = lambda t, b: Event("[memory]", t, b, device, index)  # noqa: E731
    return [Event("phase:forward", 10, end=40, annotation=True), Event("phase:backward", 50, end=90, annotation=True),
            Event("layer 0", 11, end=20, annotation=True), Event("layer 0", 60, end=70, annotation=True),
            mem(11, 100), mem(21, 50), mem(30, -30), mem(61, 40), mem(80, -160)]


def test_cpu_history_kept_peak_and_reruns():
    h = from_events(_step("DeviceType.CPU", -1), torch.device("cpu"))
    assert h.kept() == 120 and h.kept("backward") == -120
    assert h.peak() == 160 and h.peak("forward") == 150
    assert h.left_by("layer 0") == 100 and h.reran("layer 0")


def test_cuda_history_takes_only_its_own_device():
    theirs = [Event("[memory]", 15, 999, "DeviceType.CUDA", 0), Event("[memory]", 16, 7, "DeviceType.CPU", -1)]
    h = from_events(_step("DeviceType.CUDA", 1) + theirs, torch.device("cuda", 1))
    assert h.kept() == 120 and h.peak() == 160  # device 0's block and the host's bytes left out
    assert from_events(_step("DeviceType.CUDA", 1), torch.device("cuda", 0)).deltas == []
