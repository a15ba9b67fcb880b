"""Collectives counted where they are issued: calls and bytes per (collective, phase).

Each mechanism written by hand keeps one (the tensor-parallel operators, Ulysses' all-to-alls,
the experts' dispatch), so a lab can set one step's traffic beside its prediction:

    TALLY = Tally()
    TALLY.add("all_reduce", "forward", x)     # a tensor, or its size in bytes
    TALLY.reset(); loss.backward(); TALLY.rows()   # {("all_reduce", "backward"): (calls, bytes)}
    with TALLY.timed(): dist.all_reduce(x)         # and the seconds the calls took: TALLY.seconds

Bytes are each call's whole tensor (the size nccl-tests and DeepSpeed's comms logger report):
the all-reduced tensor, the gathered one, a reduce-scatter's input, an all-to-all's buffer.
What leaves the rank follows from the collective (plscale.predict.busbw.bus_factor).
"""

import time
from collections import defaultdict
from contextlib import contextmanager

import torch


class Tally:
    def __init__(self):
        self.counts = defaultdict(lambda: [0, 0])
        self.seconds = 0.0   # inside timed(): the collectives' wall time since the last reset (on the host:
                             # with CUDA, where collectives queue on a stream, the time to queue them)

    def add(self, op: str, phase: str, tensor: torch.Tensor | int) -> None:
        entry = self.counts[(op, phase)]
        entry[0] += 1
        entry[1] += tensor if isinstance(tensor, int) else tensor.numel() * tensor.element_size()

    @contextmanager
    def timed(self):
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds += time.perf_counter() - start

    def reset(self) -> None:
        self.counts.clear()
        self.seconds = 0.0

    def rows(self) -> dict:
        """{(op, phase): (calls, bytes)}, sorted."""
        return {key: tuple(value) for key, value in sorted(self.counts.items())}
