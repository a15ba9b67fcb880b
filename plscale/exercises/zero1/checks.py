"""The checks of zero1, run in every rank (2 and 4 ranks): the sharded wrapper against torch's
own optimizers stepping the whole model on one rank, bit for bit."""

import math

import torch
import torch.distributed as dist

from plscale.exercises.harness import Checks, expect, watch_collectives

CHECKS = Checks()
SHAPES = ((3, 5), (7,), (5,))   # P = 27 parameters: no multiple of 2 or 4, so the last shard is padded
ADAMW = (torch.optim.AdamW, {"lr": 0.01, "weight_decay": 0.1})
SGD = (torch.optim.SGD, {"lr": 0.05, "momentum": 0.9})
GATHERS = ("all_gather", "all_gather_into_tensor", "all_gather_single")
COLLECTIVES = GATHERS + ("all_reduce", "reduce_scatter", "reduce_scatter_tensor", "reduce_scatter_single",
                         "broadcast", "reduce", "scatter", "gather", "all_to_all", "all_to_all_single")


def _params(frozen: bool = False) -> list[torch.Tensor]:
    """The model's parameters, the same on every rank; `frozen`: one more, in the middle, that
    does not require a gradient."""
    g = torch.Generator().manual_seed(3)
    params = [torch.randn(shape, generator=g).requires_grad_() for shape in SHAPES]
    if frozen:
        params.insert(1, torch.randn(4, generator=g))
    return params


def _set_grads(params, step: int) -> None:
    """Gradients as after data parallelism's all-reduce: the same on every rank."""
    g = torch.Generator().manual_seed(50 + step)
    for p in params:
        if p.requires_grad:
            p.grad = torch.randn(p.shape, generator=g)


def _flat(tensors) -> torch.Tensor:
    return torch.cat([t.detach().reshape(-1) for t in tensors])


def _k(world: int) -> int:
    return math.ceil(sum(math.prod(s) for s in SHAPES) / world)


def _train(student, steps: int, kind=ADAMW, frozen: bool = False):
    """(the student's parameters, its wrapper, the parameters torch's optimizer stepped whole)."""
    params, reference = _params(frozen), _params(frozen)
    cls, kwargs = kind
    opt = student.Zero1(params, cls, **kwargs)
    whole = cls([p for p in reference if p.requires_grad], **kwargs)
    for step in range(steps):
        _set_grads(params, step)
        _set_grads(reference, step)
        opt.step()
        whole.step()
        opt.zero_grad()
        whole.zero_grad()
    return params, opt, reference


def _same(got, want, what: str) -> None:
    gap = (got - want).abs().max().item()
    expect(torch.equal(got, want), f"{what} differ from torch's own (largest difference {gap:.3g})")


@CHECKS.add("shard bounds: rank r owns elements [r·k, (r+1)·k) of the padded vector, k = ceil(P/N)",
            hint="Pad the flat vector up to a multiple of N, so every rank owns the same number of elements.")
def bounds(student, rank, world):
    opt = student.Zero1(_params(), *ADAMW[:1], **ADAMW[1])
    k = _k(world)
    got = (getattr(opt, "start", None), getattr(opt, "end", None))
    expect(got == (rank * k, (rank + 1) * k), f"(start, end) = {got} for P = 27 parameters")


@CHECKS.add("the shard and the optimizer: k fp32 elements on the parameters' device, the state of k only",
            hint="Hand the optimizer one tensor, this rank's slice, as a leaf that requires a gradient: its "
                 "state (Adam's two moments) is then the slice's size, which is the whole saving of ZeRO-1.")
def sharded(student, rank, world):
    params, opt, _ = _train(student, 1)
    shard, k = getattr(opt, "shard", None), _k(world)
    expect(isinstance(shard, torch.Tensor), f"opt.shard is {type(shard).__name__}, not a tensor")
    expect(shard.dim() == 1 and shard.numel() == k and shard.dtype == torch.float32
           and shard.device == params[0].device, f"opt.shard: {shard.dtype}, shape {list(shard.shape)} on "
                                                 f"{shard.device}, for k = {k}")
    expect(isinstance(getattr(opt, "optimizer", None), torch.optim.AdamW), "opt.optimizer is not the AdamW asked for")
    state = [t for s in opt.optimizer.state.values() for n, t in s.items() if n in ("exp_avg", "exp_avg_sq")]
    expect(len(state) == 2 and all(t.numel() == k for t in state),
           f"the optimizer's moments: {[t.numel() for t in state]} elements, not two of {k}")


@CHECKS.add("one step: parameters equal torch's AdamW (weight decay 0.1) stepping the whole model, bit for bit",
            hint="Take this rank's slice of the flat parameters and of the flat gradients at the same offsets, "
                 "let the optimizer step the slice, and bring every rank's updated slice back into the parameters.")
def one_step(student, rank, world):
    params, _, reference = _train(student, 1)
    _same(_flat(params), _flat(reference), "the parameters after one step")


@CHECKS.add("five steps: AdamW's, and SGD with momentum's, bit for bit",
            hint="One optimizer for the whole run: its state (moments, step count, momentum buffer) persists "
                 "between steps, and the shard it steps must be the same tensor every step.")
def five_steps(student, rank, world):
    for kind in (ADAMW, SGD):
        params, _, reference = _train(student, 5, kind)
        _same(_flat(params), _flat(reference), f"{kind[0].__name__}: the parameters after five steps")


@CHECKS.add("frozen parameters: left as they were, outside the shards",
            hint="A parameter without requires_grad has no gradient and nothing to step: keep it out of "
                 "the flat vector, so P counts the trainable parameters only.")
def frozen(student, rank, world):
    params, opt, reference = _train(student, 2, frozen=True)
    expect(getattr(opt, "end", None) == (rank + 1) * _k(world), f"opt.end {getattr(opt, 'end', None)}: the frozen "
                                                                f"parameter was counted in P")
    _same(params[1], reference[1], "the frozen parameter")
    _same(_flat(params), _flat(reference), "the parameters after two steps")


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
    opt = student.Zero1(params, *ADAMW[:1], **ADAMW[1])
    with watch_collectives(student, *COLLECTIVES) as calls:
        for step in range(2):
            _set_grads(params, step)
            opt.step()
            opt.zero_grad()
    names = ["all_gather" if c[0] in GATHERS else c[0] for c in calls]
    expect(names == ["all_gather", "all_gather"], f"two steps called: {', '.join(names) or 'no collective'}")
