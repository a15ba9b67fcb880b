"""Collectives counted where they are issued: calls and bytes per (collective, phase).

Each mechanism written by hand keeps one (the tensor-parallel operators, Ulysses' all-to-alls,
the experts' dispatch), so a lab can set one step's traffic beside its prediction:

    TALLY = Tally()
    TALLY.add("all_reduce", "forward", x)     # a tensor, or its size in bytes
    TALLY.reset(); loss.backward(); TALLY.rows()   # {("all_reduce", "backward"): (calls, bytes)}

Bytes are each call's whole tensor (the size nccl-tests and DeepSpeed's comms logger report):
the all-reduced tensor, the gathered one, a reduce-scatter's input, an all-to-all's buffer.
What leaves the rank follows from the collective (plscale.predict.busbw.bus_factor).
"""

from collections import defaultdict

import torch


class Tally:
    def __init__(self):
        self.counts = defaultdict(lambda: [0, 0])

    def add(self, op: str, phase: str, tensor: torch.Tensor | int) -> None:
        entry = self.counts[(op, phase)]
        entry[0] += 1
        entry[1] += tensor if isinstance(tensor, int) else tensor.numel() * tensor.element_size()

    def reset(self) -> None:
        self.counts.clear()

    def rows(self) -> dict:
        """{(op, phase): (calls, bytes)}, sorted."""
        return {key: tuple(value) for key, value in sorted(self.counts.items())}
