"""Collectives counted as torch dispatches them: for libraries that issue their own (FSDP2).

A TorchDispatchMode sees every c10d operator a library calls on this thread, the backward's
hooks included (on CPU the autograd engine runs them on the calling thread). Calls and bytes go
into a plscale.rank.tally.Tally under the phase the lab names, by the Tally's convention: the
gathered tensor of an all-gather, a reduce-scatter's input, an all-reduced tensor.

    with counting(TALLY, "forward"):
        loss = model(x, y)
    with counting(TALLY, "backward"):
        loss.backward()
    TALLY.rows()   # {("all_gather", "forward"): (calls, bytes), ("reduce_scatter", "backward"): ...}
"""

from contextlib import contextmanager

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from plscale.rank.tally import Tally

c10d, functional = torch.ops.c10d, torch.ops._c10d_functional
# operator -> (name, which argument holds the whole tensor); DTensor's redistributions (tensor
# parallelism) call the functional collectives, FSDP2 the in-place ones
OPS = {c10d._allgather_base_: ("all_gather", 0), c10d._reduce_scatter_base_: ("reduce_scatter", 1),
       c10d.allreduce_: ("all_reduce", 0), functional.all_reduce: ("all_reduce", 0)}


def _nbytes(arg) -> int:
    tensors = arg if isinstance(arg, (list, tuple)) else [arg]
    return sum(t.numel() * t.element_size() for t in tensors)


class _Counting(TorchDispatchMode):
    def __init__(self, tally: Tally, phase: str):
        super().__init__()
        self.tally, self.phase = tally, phase

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        known = OPS.get(func._overloadpacket)
        if known:
            self.tally.add(known[0], self.phase, _nbytes(args[known[1]]))
        return func(*args, **(kwargs or {}))


@contextmanager
def counting(tally: Tally, phase: str):
    with _Counting(tally, phase):
        yield tally
