"""The checks of tp-column, run in every rank (2 and 4 ranks): f and g against sums over the
ranks, the column-parallel layer against the whole nn.Linear computed on one rank."""

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from plscale.exercises.harness import Checks, close, expect, watch_collectives

CHECKS = Checks()
IN, OUT = 6, 8          # the layer: divides over 2 and 4 ranks
COLLECTIVES = ("all_reduce", "all_gather", "all_gather_into_tensor", "all_gather_single", "reduce_scatter",
               "reduce_scatter_tensor", "reduce_scatter_single", "broadcast", "reduce", "send", "recv")


def _shared(*shape) -> torch.Tensor:
    """The same values on every rank."""
    return torch.randn(shape, generator=torch.Generator().manual_seed(7))


def _own(rank: int, *shape) -> torch.Tensor:
    """Different values on every rank."""
    return torch.randn(shape, generator=torch.Generator().manual_seed(100 + rank))


def _summed(x: torch.Tensor) -> torch.Tensor:
    x = x.clone()
    dist.all_reduce(x)
    return x


def _slice(rank: int, world: int) -> slice:
    width = OUT // world
    return slice(rank * width, (rank + 1) * width)


def _full_layer():
    """The whole layer's weight [OUT, IN] and bias [OUT], the same on every rank."""
    g = torch.Generator().manual_seed(11)
    return torch.randn(OUT, IN, generator=g), torch.randn(OUT, generator=g)


@CHECKS.add("f forward: identity (same values, same shape)",
            hint="In the forward pass f changes nothing: every rank already holds the whole input.")
def f_forward(student, rank, world):
    x = _own(rank, 3, 4).requires_grad_()
    close(student.copy_to(x), x.detach(), "f(x)")


@CHECKS.add("f backward: the gradient summed over the ranks",
            hint="Every rank's output slice depends on the whole input, so the input's gradient must add up "
                 "every rank's contribution (on a copy of the gradient autograd passes you).")
def f_backward(student, rank, world):
    upstream = _own(rank, 3, 4)
    expected = _summed(upstream)
    x = _shared(3, 4).requires_grad_()
    given = upstream.clone()  # autograd hands this very tensor to f's backward
    student.copy_to(x).backward(given)
    close(x.grad, expected, "the gradient of f's input")
    expect(torch.equal(given, upstream), "the gradient autograd passed to f's backward was changed in place "
           "(all-reduced?): autograd may still use that tensor elsewhere")


@CHECKS.add("g forward: the sum over the ranks, the input left unchanged",
            hint="g sums the ranks' partial results; all-reduce a copy, so the tensor you were given stays as it was.")
def g_forward(student, rank, world):
    x = _own(rank, 3, 4)
    expected = _summed(x)
    before = x.clone()
    y = student.reduce_from(x.requires_grad_())
    close(y, expected, "g(x)")
    close(x, before, "g's input after the forward (was it all-reduced in place?)")


@CHECKS.add("g backward: identity",
            hint="After g every rank holds the same sum, and each rank's loss uses its own copy: the gradient "
                 "passes through unchanged.")
def g_backward(student, rank, world):
    x = _own(rank, 3, 4).requires_grad_()
    upstream = _own(rank + world, 3, 4)
    (student.reduce_from(x) * upstream).sum().backward()
    close(x.grad, upstream, "the gradient of g's input")


@CHECKS.add(f"column layer shapes: weight [out/t, in], bias [out/t], output [..., out/t] (in {IN}, out {OUT})",
            hint="Column parallelism splits the output features over the t ranks; the input features stay whole.")
def shapes(student, rank, world):
    layer = student.ColumnParallelLinear(IN, OUT)
    for name, shape in (("weight", [OUT // world, IN]), ("bias", [OUT // world])):
        p = getattr(layer, name, None)
        expect(isinstance(p, nn.Parameter), f"layer.{name} is {type(p).__name__}, not an nn.Parameter")
        expect(list(p.shape) == shape, f"layer.{name} has shape {list(p.shape)}, expected {shape}")
    layer.load_shard(*_full_layer())
    y = layer(_shared(2, 5, IN))
    expect(isinstance(y, torch.Tensor) and list(y.shape) == [2, 5, OUT // world],
           f"output shape {list(getattr(y, 'shape', []))} for input [2, 5, {IN}], expected [2, 5, {OUT // world}]")


@CHECKS.add("column layer forward: this rank's slice of the whole layer's output",
            hint="Rank r holds the r-th block of rows of the weight (and of the bias), in rank order.")
def forward_parity(student, rank, world):
    weight, bias = _full_layer()
    layer = student.ColumnParallelLinear(IN, OUT)
    layer.load_shard(weight, bias)
    x = _shared(2, 5, IN)
    close(layer(x), F.linear(x, weight, bias)[..., _slice(rank, world)], "output")


@CHECKS.add("column layer backward: input, weight and bias gradients equal the whole layer's",
            hint="The weight and bias gradients are this rank's business; the input's gradient is not: which "
                 "operator sums it, and where in forward() does it belong?")
def backward_parity(student, rank, world):
    weight, bias = _full_layer()
    upstream = _shared(2, 5, OUT) * 0.5 + 1
    x_full = _shared(2, 5, IN).requires_grad_()
    w_full, b_full = weight.clone().requires_grad_(), bias.clone().requires_grad_()
    (F.linear(x_full, w_full, b_full) * upstream).sum().backward()

    layer = student.ColumnParallelLinear(IN, OUT)
    layer.load_shard(weight, bias)
    x = _shared(2, 5, IN).requires_grad_()
    (layer(x) * upstream[..., _slice(rank, world)]).sum().backward()
    close(x.grad, x_full.grad, "the input's gradient")
    close(layer.weight.grad, w_full.grad[_slice(rank, world)], "the weight's gradient")
    close(layer.bias.grad, b_full.grad[_slice(rank, world)], "the bias's gradient")


@CHECKS.add("communication: the layer's forward sends nothing, its backward one all-reduce",
            hint="f is the layer's only communication: count what it does forward and backward.")
def communication(student, rank, world):
    layer = student.ColumnParallelLinear(IN, OUT)
    layer.load_shard(*_full_layer())
    x = _shared(2, 5, IN).requires_grad_()
    with watch_collectives(student, *COLLECTIVES) as forward_calls:
        y = layer(x)
    with watch_collectives(student, *COLLECTIVES) as backward_calls:
        y.sum().backward()
    expect(not forward_calls, f"forward called dist.{', dist.'.join(c[0] for c in forward_calls)}")
    names = [c[0] for c in backward_calls]
    expect(names == ["all_reduce"], f"backward called {len(names)} collectives: {', '.join(names) or 'none'}")
