"""Exercise tp-column: Megatron's f and g operators, and a column-parallel linear layer.

Lab 07 (labs/07_tensor_parallel) builds a whole tensor-parallel model from these. Check with

    plscale exercise check tp-column

t ranks share one linear layer Y = X Wᵀ + b, W of shape [out, in]. Column parallelism cuts
the output features: rank r holds rows r·out/t .. (r+1)·out/t - 1 of W and the same slice of
b, sees the whole input X and computes its slice of Y, [..., out/t]. Two operators glue such
layers together (Shoeybi et al., Megatron-LM, 2019, section 3), each the other's mirror:

    f   forward: identity                     backward: all-reduce (sum) the gradient
    g   forward: all-reduce (sum) the input   backward: identity

f goes in front of a column-parallel layer: every rank's slice of Y depends on all of X, so
the gradient of X is the sum of every rank's contribution. g goes after a row-parallel
layer, whose ranks each hold a partial sum of Y.

Write, over torch.distributed's default group (dist.get_world_size(), dist.get_rank(),
dist.all_reduce; all-reduce a copy, never a tensor autograd gave you):
- CopyToParallel (f) and ReduceFromParallel (g): torch.autograd.Function, forward and backward
- ColumnParallelLinear:
    __init__(in_features, out_features): self.weight, an nn.Parameter of shape [out/t, in],
        and self.bias, an nn.Parameter of shape [out/t] (any initial values)
    load_shard(full_weight, full_bias): copy this rank's rows of the whole layer's weight
        [out, in] and its slice of the bias [out] into self.weight and self.bias
    forward(x): f, then this rank's linear: x [..., in] -> this rank's slice of Y [..., out/t]

What the checks test, on 2 and 4 ranks: f and g forward and backward against a sum over
the ranks (the tensors autograd hands them left unchanged); the layer's shapes; its output slice and its gradients (input, weight, bias)
against the whole nn.Linear on one rank; one all-reduce per layer in backward, none forward.
"""

import torch
import torch.distributed as dist  # noqa: F401  (you will need it)
from torch import nn


class CopyToParallel(torch.autograd.Function):
    """f: identity forward, all-reduce backward."""

    @staticmethod
    def forward(ctx, x):
        # TODO: your code here
        raise NotImplementedError("CopyToParallel.forward")

    @staticmethod
    def backward(ctx, grad):
        # TODO: your code here
        raise NotImplementedError("CopyToParallel.backward")


class ReduceFromParallel(torch.autograd.Function):
    """g: all-reduce forward, identity backward."""

    @staticmethod
    def forward(ctx, x):
        # TODO: your code here
        raise NotImplementedError("ReduceFromParallel.forward")

    @staticmethod
    def backward(ctx, grad):
        # TODO: your code here
        raise NotImplementedError("ReduceFromParallel.backward")


def copy_to(x):
    """f (given)."""
    return CopyToParallel.apply(x)


def reduce_from(x):
    """g (given)."""
    return ReduceFromParallel.apply(x)


class ColumnParallelLinear(nn.Module):
    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        # TODO: self.weight [out/t, in] and self.bias [out/t], both nn.Parameter
        raise NotImplementedError("ColumnParallelLinear.__init__")

    @torch.no_grad()
    def load_shard(self, full_weight: torch.Tensor, full_bias: torch.Tensor) -> None:
        # TODO: this rank's rows of full_weight [out, in] and slice of full_bias [out]
        raise NotImplementedError("ColumnParallelLinear.load_shard")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # TODO: f, then this rank's slice of the linear layer
        raise NotImplementedError("ColumnParallelLinear.forward")
