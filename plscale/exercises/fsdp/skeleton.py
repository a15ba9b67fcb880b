"""Exercise fsdp: fully sharded data parallelism by hand, each layer's weights gathered just before its forward.

Lab 04 (labs/04_zero) runs PyTorch's FSDP2 (`fully_shard`) beside ZeRO-3. Check with

    plscale exercise check fsdp

N data-parallel ranks train one model, and no rank keeps all of it: each layer's parameters
are flattened into one vector, padded with zeros to N·k elements (k = ceil(P_layer / N)), and
rank r keeps elements r·k .. (r+1)·k - 1, its shard, the only thing its optimizer steps. A
layer's whole weights exist only while they are used:

    forward    all-gather the layer's shards -> its whole flat vector -> run the layer with it
    backward   the gradient of that flat vector is reduce-scattered: rank r gets the sum of
               every rank's gradient over its own k elements; divided by N, the mean

That is one autograd.Function (`Gather`): forward an all-gather, backward a reduce-scatter.
Autograd keeps the gathered weights for the layer's backward, so this is fully_shard with
`reshard_after_forward=False` (FSDP2 frees them after forward and gathers again in backward).

Write, over torch.distributed's default group:
- Gather: forward(ctx, shard) -> the whole padded flat vector (dist.all_gather_into_tensor);
  backward(ctx, grad) -> this rank's k elements of the gradient, summed over the ranks and
  divided by N (dist.reduce_scatter_tensor).
- FSDP.__init__(model): model is an nn.Sequential; every child that has parameters is a unit.
  For each unit, `self.shards` gets one nn.Parameter: this rank's k elements of its flattened,
  padded parameters (fp32, in named_parameters() order). `parameters()` returns self.shards.
- FSDP.__call__(x): through every child in order; a unit runs with its whole weights:
  Gather.apply(its shard), cut into views of each parameter's shape (`views`, given), then
  `torch.func.functional_call(child, views, (x,))`.

What the checks test, on 2 and 4 ranks, with layers whose sizes N does not divide: the shards
(k fp32 elements each, and the only parameters); the output equals the whole model's; each
shard's gradient equals this rank's slice of the whole model's mean gradient over every rank's
batch; one all-gather per unit forward and one reduce-scatter per unit backward, nothing else;
three SGD steps (momentum 0.9) equal PyTorch's fully_shard's (reshard_after_forward=False), and
AdamW's state is k elements per unit.
"""

import math  # noqa: F401  (you will need it)

import torch
import torch.distributed as dist  # noqa: F401  (you will need it)
from torch import nn


def views(flat: torch.Tensor, unit: nn.Module) -> dict:
    """{name: the part of `flat` shaped as that parameter}, in named_parameters() order (given)."""
    out, offset = {}, 0
    for name, p in unit.named_parameters():
        out[name] = flat[offset:offset + p.numel()].view_as(p)
        offset += p.numel()
    return out


class Gather(torch.autograd.Function):
    """forward: all-gather the shards into the whole flat vector; backward: reduce-scatter its gradient."""

    @staticmethod
    def forward(ctx, shard):
        # TODO: your code here
        raise NotImplementedError("Gather.forward")

    @staticmethod
    def backward(ctx, grad):
        # TODO: your code here
        raise NotImplementedError("Gather.backward")


class FSDP:
    def __init__(self, model: nn.Sequential):
        self.model = model
        # TODO: self.shards, one nn.Parameter per unit (a child with parameters)
        raise NotImplementedError("FSDP.__init__")

    def parameters(self):
        return self.shards

    def __call__(self, x):
        # TODO: every child in order; a unit with its gathered weights
        raise NotImplementedError("FSDP.__call__")
