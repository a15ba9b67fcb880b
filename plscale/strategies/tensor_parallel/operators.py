"""The conjugate operators of Megatron's tensor parallelism, as autograd functions.

A column-parallel linear needs the whole input on every rank and gives each rank a slice
of the output; a row-parallel linear takes those slices and gives each rank a partial sum.
Two operators glue them (Shoeybi et al., Megatron-LM, 2019), each the other's mirror:

    f  copy_to(x)          forward: identity       backward: all-reduce the gradient
    g  reduce_from(x)      forward: all-reduce     backward: identity

so one attention block or MLP costs one all-reduce forward (g) and one backward (f). On a
group of one rank each is the identity, and sends nothing (as Megatron's mappings bypass it):
a layout with tp 1 pays no collective.

Sequence parallelism (Korthikanti et al., 2022) keeps the norms and residuals split along
the sequence between the blocks. An all-reduce is a reduce-scatter then an all-gather, so
g becomes a reduce-scatter (each rank keeps the sum of its slice of the sequence) and f an
all-gather (the block needs the whole sequence); the backward swaps them. Same bytes,
a t-th of the activations in between:

    gather_sequence(x)           forward: all-gather along the sequence   backward: reduce-scatter
    reduce_scatter_sequence(x)   forward: reduce-scatter                  backward: all-gather

Activations are [batch, seq, hidden]; the sequence is dim 1. Every call is counted in
TALLY by collective and phase, so a lab can report what one step sent:

    TALLY.reset(); loss.backward(); TALLY.rows()   # {(op, phase): (calls, bytes)}
"""

import torch
import torch.distributed as dist

from plscale.rank.distributed import all_gather_single, reduce_scatter_single
from plscale.rank.tally import Tally

SEQ = 1


TALLY = Tally()


def _bytes(x: torch.Tensor) -> int:
    return x.numel() * x.element_size()


def all_reduce(x: torch.Tensor, group, phase: str, op=dist.ReduceOp.SUM) -> torch.Tensor:
    """x summed (or its max) over the group: a new tensor; x itself on a group of one rank."""
    if dist.get_world_size(group) == 1:
        return x
    TALLY.add("all_reduce", phase, _bytes(x))
    x = x.contiguous().clone()
    with TALLY.timed():
        dist.all_reduce(x, op=op, group=group)
    return x


def all_gather_along_sequence(x: torch.Tensor, group, phase: str) -> torch.Tensor:
    """[b, s/t, h] on each rank -> [b, s, h], the ranks' slices in group order."""
    t = dist.get_world_size(group)
    if t == 1:
        return x
    front = x.transpose(0, SEQ).contiguous()           # the sequence first: gathered slices stack on dim 0
    out = front.new_empty((front.shape[0] * t, *front.shape[1:]))
    with TALLY.timed():
        all_gather_single(out, front, group=group)
    TALLY.add("all_gather", phase, _bytes(out))
    return out.transpose(0, SEQ).contiguous()


def reduce_scatter_along_sequence(x: torch.Tensor, group, phase: str) -> torch.Tensor:
    """[b, s, h] partial sums on each rank -> [b, s/t, h]: this rank's slice of the sum."""
    t = dist.get_world_size(group)
    if t == 1:
        return x
    front = x.transpose(0, SEQ).contiguous()
    if front.shape[0] % t:
        raise ValueError(f"sequence of {front.shape[0]} tokens does not split over {t} ranks")
    out = front.new_empty((front.shape[0] // t, *front.shape[1:]))
    TALLY.add("reduce_scatter", phase, _bytes(front))
    with TALLY.timed():
        reduce_scatter_single(out, front, group=group)
    return out.transpose(0, SEQ).contiguous()


class _CopyTo(torch.autograd.Function):  # f
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return all_reduce(grad, ctx.group, "backward"), None


class _ReduceFrom(torch.autograd.Function):  # g
    @staticmethod
    def forward(ctx, x, group):
        return all_reduce(x, group, "forward")

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class _GatherSequence(torch.autograd.Function):  # f under sequence parallelism
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return all_gather_along_sequence(x, group, "forward")

    @staticmethod
    def backward(ctx, grad):
        return reduce_scatter_along_sequence(grad, ctx.group, "backward"), None


class _ReduceScatterSequence(torch.autograd.Function):  # g under sequence parallelism
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return reduce_scatter_along_sequence(x, group, "forward")

    @staticmethod
    def backward(ctx, grad):
        return all_gather_along_sequence(grad, ctx.group, "backward"), None


def copy_to(x, group):
    """f: identity forward, all-reduce backward (before a column-parallel linear)."""
    return _CopyTo.apply(x, group)


def reduce_from(x, group):
    """g: all-reduce forward, identity backward (after a row-parallel linear)."""
    return _ReduceFrom.apply(x, group)


def gather_sequence(x, group):
    """f with sequence parallelism: all-gather forward, reduce-scatter backward."""
    return _GatherSequence.apply(x, group)


def reduce_scatter_sequence(x, group):
    """g with sequence parallelism: reduce-scatter forward, all-gather backward."""
    return _ReduceScatterSequence.apply(x, group)


def split_sequence(x, group):
    """This rank's slice of the sequence, [b, s, h] -> [b, s/t, h] (no communication)."""
    t, r = dist.get_world_size(group), dist.get_rank(group)
    if x.shape[SEQ] % t:
        raise ValueError(f"sequence of {x.shape[SEQ]} tokens does not split over {t} ranks")
    return x.chunk(t, dim=SEQ)[r].contiguous()
