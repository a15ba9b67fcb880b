"""Megatron's parallel layers on the operators f and g (operators.py). No biases, as in Llama.

    ColumnParallelLinear   Y = X [A_1 | ... | A_t]: rank i holds the columns A_i (rows of the
                           weight, out/t of them) and gives Y_i. Input whole on every rank: f;
                           a sequence slice under sequence parallelism: all-gather.
    RowParallelLinear      Y = X_1 B_1 + ... + X_t B_t: rank i holds the rows B_i and its
                           X_i (a column layer's output); the sum is g (all-reduce), or a
                           reduce-scatter along the sequence under sequence parallelism.
    VocabParallelEmbedding rank i holds tokens [iV/t, (i+1)V/t); others look up zeros; g sums.
    vocab_parallel_cross_entropy   the loss from logits split over the vocabulary, with three
                           small all-reduces (max, sum of exp, target logit) instead of
                           gathering V logits per token.

A column layer may stack several outputs (q, k and v; SwiGLU's gate and up) and then holds
its slice of each: `ColumnParallelLinear(d, [d, d_kv, d_kv], group)`. Every layer loads its
shard of a dense weight with `load_shard`, so a parallel model starts from the dense one.
"""

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from plscale.strategies.tensor_parallel import operators as ops

IGNORE = -100  # a target the loss skips, as in F.cross_entropy


def _split(n: int, t: int, what: str) -> int:
    if n % t:
        raise ValueError(f"{what} {n} does not split over {t} tensor-parallel ranks")
    return n // t


def parts_of(out_features) -> list[int]:
    """A column layer's stacked output widths: [n] for one output, the list for several."""
    return list(out_features) if isinstance(out_features, (list, tuple)) else [out_features]


def column_shard(full: tuple, t: int, rank: int) -> torch.Tensor:
    """Rank `rank`'s rows of each dense weight (one per stacked part), stacked."""
    return torch.cat([w.chunk(t, dim=0)[rank] for w in full])


def row_shard(full: torch.Tensor, t: int, rank: int) -> torch.Tensor:
    """Rank `rank`'s columns of a dense weight."""
    return full.chunk(t, dim=1)[rank]


class ColumnParallelLinear(nn.Module):
    def __init__(self, in_features: int, out_features, group, sequence_parallel: bool = False):
        super().__init__()
        self.group, self.sequence_parallel = group, sequence_parallel
        self.t, self.rank = dist.get_world_size(group), dist.get_rank(group)
        self.parts = parts_of(out_features)
        local = sum(_split(n, self.t, "output width") for n in self.parts)
        self.weight = nn.Parameter(torch.empty(local, in_features))
        self.weight.tensor_model_parallel = True  # Megatron's mark: a shard, not a copy (gradient norms)

    @torch.no_grad()
    def load_shard(self, *full: torch.Tensor) -> None:
        """This rank's rows of each dense weight (one per part), stacked."""
        self.weight.copy_(column_shard(full, self.t, self.rank))

    def forward(self, x):
        x = ops.gather_sequence(x, self.group) if self.sequence_parallel else ops.copy_to(x, self.group)
        y = F.linear(x, self.weight)
        return y.split([n // self.t for n in self.parts], dim=-1) if len(self.parts) > 1 else y


class RowParallelLinear(nn.Module):
    def __init__(self, in_features: int, out_features: int, group, sequence_parallel: bool = False):
        super().__init__()
        self.group, self.sequence_parallel = group, sequence_parallel
        self.t, self.rank = dist.get_world_size(group), dist.get_rank(group)
        self.weight = nn.Parameter(torch.empty(out_features, _split(in_features, self.t, "input width")))
        self.weight.tensor_model_parallel = True

    @torch.no_grad()
    def load_shard(self, full: torch.Tensor) -> None:
        self.weight.copy_(row_shard(full, self.t, self.rank))

    def forward(self, x):
        partial = F.linear(x, self.weight)
        if self.sequence_parallel:
            return ops.reduce_scatter_sequence(partial, self.group)
        return ops.reduce_from(partial, self.group)


class VocabParallelEmbedding(nn.Module):
    def __init__(self, vocab: int, dim: int, group, sequence_parallel: bool = False):
        super().__init__()
        self.group, self.sequence_parallel = group, sequence_parallel
        self.t, self.rank = dist.get_world_size(group), dist.get_rank(group)
        rows = _split(vocab, self.t, "vocabulary")
        self.start, self.end = self.rank * rows, (self.rank + 1) * rows
        self.weight = nn.Parameter(torch.empty(rows, dim))
        self.weight.tensor_model_parallel = True

    @torch.no_grad()
    def load_shard(self, full: torch.Tensor) -> None:
        self.weight.copy_(full[self.start:self.end])

    def forward(self, tokens):
        outside = (tokens < self.start) | (tokens >= self.end)
        local = (tokens - self.start).masked_fill(outside, 0)
        partial = F.embedding(local, self.weight).masked_fill(outside.unsqueeze(-1), 0.0)
        if self.sequence_parallel:
            return ops.reduce_scatter_sequence(partial, self.group)
        return ops.reduce_from(partial, self.group)


class _VocabParallelCrossEntropy(torch.autograd.Function):
    """Mean cross-entropy over the tokens whose target is not IGNORE, from this rank's logits
    [N, V/t] for vocabulary ids [start, start + V/t). Backward needs no communication:
    softmax minus the one-hot target, each rank for its own columns."""

    @staticmethod
    def forward(ctx, logits, targets, start, group):
        logits = logits.to(torch.promote_types(logits.dtype, torch.float32))  # fp32 at least
        top = ops.all_reduce(logits.max(dim=-1).values, group, "forward", op=dist.ReduceOp.MAX)
        shifted = logits - top.unsqueeze(-1)
        local = targets - start
        mine = (local >= 0) & (local < logits.shape[-1])
        at = local.clamp(0, logits.shape[-1] - 1)
        rows = torch.arange(len(targets), device=logits.device)
        target_logit = ops.all_reduce(torch.where(mine, shifted[rows, at], 0.0), group, "forward")
        softmax = shifted.exp_()                           # in place: one [N, V/t] buffer, not three
        total = ops.all_reduce(softmax.sum(dim=-1), group, "forward")
        softmax.div_(total.unsqueeze(-1))
        valid = targets != IGNORE
        count = valid.sum().clamp(min=1)
        ctx.save_for_backward(softmax, at, mine, valid, count)
        return ((total.log() - target_logit) * valid).sum() / count

    @staticmethod
    def backward(ctx, grad):
        softmax, at, mine, valid, count = ctx.saved_tensors
        out = softmax.clone()
        out[torch.arange(len(at), device=out.device), at] -= mine.to(out.dtype)  # no host sync
        return out * (valid.to(out.dtype) * grad / count).unsqueeze(-1), None, None, None


def vocab_parallel_cross_entropy(logits, targets, start: int, group):
    """Mean cross-entropy of logits [b, s, V/t] (this rank's vocabulary, from `start`) against
    targets [b, s] of the whole vocabulary; targets equal to IGNORE (-100) are skipped."""
    return _VocabParallelCrossEntropy.apply(logits.flatten(0, 1), targets.flatten(), start, group)
