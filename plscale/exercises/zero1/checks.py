"""The checks of zero1, run in every rank (2 and 4 ranks): the sharded optimizer against
torch's Adam stepping the whole model on one rank.

torch's Adam is called as `torch.optim.adam.adam`, the function torch.optim.Adam.step runs
(single-tensor path): building a torch.optim.Adam imports torch._dynamo, 3 s per rank."""

import math

import torch
import torch.distributed as dist
from torch.optim.adam import adam

from plscale.exercises.harness import Checks, close, expect, watch_collectives

CHECKS = Checks()
SHAPES = ((3, 5), (7,), (5,))   # P = 27 parameters: no multiple of 2 or 4, so the last shard is padded
LR = 0.01
GATHERS = ("all_gather", "all_gather_into_tensor", "all_gather_single")
COLLECTIVES = GATHERS + ("all_reduce", "reduce_scatter", "reduce_scatter_tensor", "reduce_scatter_single",
                         "broadcast", "reduce", "scatter", "gather", "all_to_all", "all_to_all_single")


def _params() -> list[torch.Tensor]:
    """The model's parameters, the same on every rank."""
    g = torch.Generator().manual_seed(3)
    return [torch.randn(shape, generator=g).requires_grad_() for shape in SHAPES]


def _set_grads(params, step: int) -> None:
    """Gradients as after data parallelism's all-reduce: the same on every rank."""
    g = torch.Generator().manual_seed(50 + step)
    for p in params:
        p.grad = torch.randn(p.shape, generator=g)


class TorchAdam:
    """torch.optim.Adam(params, lr) (weight decay 0), through the function its step runs."""

    def __init__(self, params, lr: float):
        self.params, self.lr = params, lr
        self.state = {p: {"exp_avg": torch.zeros_like(p), "exp_avg_sq": torch.zeros_like(p)} for p in params}
        self.steps = [torch.tensor(0.0) for _ in params]

    @torch.no_grad()
    def step(self) -> None:
        adam(self.params, [p.grad for p in self.params], [self.state[p]["exp_avg"] for p in self.params],
             [self.state[p]["exp_avg_sq"] for p in self.params], [], self.steps, foreach=False, capturable=False,
             differentiable=False, fused=None, grad_scale=None, found_inf=None, has_complex=False, amsgrad=False,
             beta1=0.9, beta2=0.999, lr=self.lr, weight_decay=0.0, eps=1e-8, maximize=False)


def _flat(tensors) -> torch.Tensor:
    return torch.cat([t.detach().reshape(-1) for t in tensors])


def _k(world: int) -> int:
    return math.ceil(sum(math.prod(s) for s in SHAPES) / world)


def _train(student, steps: int):
    """(the student's parameters, its optimizer, torch's Adam on a copy) after `steps` steps."""
    params, reference = _params(), _params()
    opt = student.Zero1Adam(params, lr=LR)
    torch_adam = TorchAdam(reference, lr=LR)
    for step in range(steps):
        _set_grads(params, step)
        _set_grads(reference, step)
        opt.step()
        torch_adam.step()
    return params, opt, reference, torch_adam


@CHECKS.add("shard bounds: rank r owns elements [r·k, (r+1)·k) of the padded vector, k = ceil(P/N)",
            hint="Pad the flat vector up to a multiple of N, so every rank owns the same number of elements.")
def bounds(student, rank, world):
    opt = student.Zero1Adam(_params(), lr=LR)
    k = _k(world)
    got = (getattr(opt, "start", None), getattr(opt, "end", None))
    expect(got == (rank * k, (rank + 1) * k), f"(start, end) = {got} for P = 27 parameters")


@CHECKS.add("optimizer states sharded: exp_avg and exp_avg_sq are 1-D fp32 tensors of k elements",
            hint="Each rank keeps Adam's moments for its own slice only: that is the whole saving of ZeRO-1.")
def states_sharded(student, rank, world):
    opt = student.Zero1Adam(_params(), lr=LR)
    for name in ("exp_avg", "exp_avg_sq"):
        state = getattr(opt, name, None)
        expect(isinstance(state, torch.Tensor), f"opt.{name} is {type(state).__name__}, not a tensor")
        expect(state.dim() == 1 and state.numel() == _k(world) and state.dtype == torch.float32,
               f"opt.{name}: {state.dtype}, shape {list(state.shape)} (P = 27 parameters)")


@CHECKS.add("one step: parameters equal torch.optim.Adam's on the whole model",
            hint="Take this rank's slice of the flat parameters and of the flat gradients at the same offsets, "
                 "update it with Adam, and bring every rank's updated slice back into the parameters.")
def one_step(student, rank, world):
    params, _, reference, _ = _train(student, 1)
    close(_flat(params), _flat(reference), "the parameters after one step", atol=1e-6)


@CHECKS.add("five steps: parameters, and this rank's exp_avg and exp_avg_sq, equal torch's Adam",
            hint="Adam's bias corrections use the step count t = 1, 2, ...; the moments persist between steps.")
def five_steps(student, rank, world):
    params, opt, reference, torch_adam = _train(student, 5)
    close(_flat(params), _flat(reference), "the parameters after five steps", atol=1e-6)
    k = _k(world)
    for name in ("exp_avg", "exp_avg_sq"):
        full = _flat(torch_adam.state[p][name] for p in reference)
        mine = torch.cat([full, full.new_zeros(k * world - full.numel())])[rank * k:(rank + 1) * k]
        close(getattr(opt, name, None), mine, f"opt.{name} after five steps", atol=1e-6)


@CHECKS.add("replicas: every rank holds the same parameters after a step",
            hint="After each rank updates its slice, the others still hold the old values of it: which "
                 "collective gives every rank every slice?")
def replicas(student, rank, world):
    params, *_ = _train(student, 1)
    mine = _flat(params)
    everyone = [torch.empty_like(mine) for _ in range(world)]
    dist.all_gather(everyone, mine)
    for other, theirs in enumerate(everyone):
        expect(torch.equal(theirs, everyone[0]), f"rank {other}'s parameters differ from rank 0's")


@CHECKS.add("communication: one all-gather per step, no other collective",
            hint="The gradients are already averaged: a step needs only the gathering of the updated slices.")
def communication(student, rank, world):
    params = _params()
    opt = student.Zero1Adam(params, lr=LR)
    with watch_collectives(student, *COLLECTIVES) as calls:
        for step in range(2):
            _set_grads(params, step)
            opt.step()
    names = ["all_gather" if c[0] in GATHERS else c[0] for c in calls]
    expect(names == ["all_gather", "all_gather"], f"two steps called: {', '.join(names) or 'no collective'}")
