"""The checks of fsdp, run in every rank (2 and 4 ranks): the hand-written sharding against the
whole model on one rank and against PyTorch's own fully_shard (FSDP2) on the same ranks."""

import math

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

from plscale.exercises.harness import Checks, close, expect, watch_collectives

CHECKS = Checks()
GATHERS = ("all_gather_into_tensor", "all_gather", "_all_gather_base")
SCATTERS = ("reduce_scatter_tensor", "reduce_scatter", "_reduce_scatter_base")
COLLECTIVES = GATHERS + SCATTERS + ("all_reduce", "broadcast", "reduce", "scatter", "gather")


def _model() -> nn.Sequential:
    """The same model on every rank: units of 70, 77 and 24 parameters (2 and 4 do not divide them all)."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 10), nn.ReLU(), nn.Linear(10, 7), nn.ReLU(), nn.Linear(7, 3))


def _batch(rank: int, step: int = 0):
    g = torch.Generator().manual_seed(200 + 10 * step + rank)
    return torch.randn(5, 6, generator=g), torch.randn(5, 3, generator=g)


def _units(model):
    return [child for child in model if any(True for _ in child.parameters())]


def _slice(tensors, rank: int, world: int) -> torch.Tensor:
    """This rank's k elements of the tensors, flattened and padded to a multiple of the ranks."""
    flat = torch.cat([t.detach().reshape(-1).float() for t in tensors])
    k = math.ceil(flat.numel() / world)
    return torch.cat([flat, flat.new_zeros(k * world - flat.numel())])[rank * k:(rank + 1) * k]


def _whole(shard: torch.Tensor, world: int) -> torch.Tensor:
    whole = shard.new_empty(shard.numel() * world)
    dist.all_gather_into_tensor(whole, shard.detach().contiguous())
    return whole


@CHECKS.add("shards: one fp32 nn.Parameter per unit, this rank's k = ceil(P/N) elements of its flat weights",
            hint="Flatten a unit's parameters in named_parameters() order, pad with zeros to a multiple of N, "
                 "and keep elements r·k .. (r+1)·k - 1 as a new nn.Parameter.")
def shards(student, rank, world):
    model = _model()
    fsdp = student.FSDP(model)
    got = list(getattr(fsdp, "shards", None) or [])
    expect(len(got) == 3, f"{len(got)} shards for 3 units")
    for i, (shard, unit) in enumerate(zip(got, _units(model))):
        expect(isinstance(shard, nn.Parameter) and shard.dtype == torch.float32 and shard.dim() == 1,
               f"unit {i}'s shard is not a 1-D fp32 nn.Parameter")
        close(shard, _slice(unit.parameters(), rank, world), f"unit {i}'s shard", atol=0)
    expect([id(p) for p in fsdp.parameters()] == [id(s) for s in got], "parameters() is not self.shards")


@CHECKS.add("forward: the output equals the whole model's",
            hint="A unit runs with its whole weights: gather every rank's shard first, then cut the flat "
                 "vector into the parameters' shapes (views) and call the unit with them.")
def forward(student, rank, world):
    model = _model()
    fsdp = student.FSDP(model)
    x, _ = _batch(rank)
    close(fsdp(x), _model()(x), "the output", atol=1e-6)


@CHECKS.add("backward: each shard's gradient is this rank's slice of the whole model's mean gradient",
            hint="The gradient of the gathered vector holds this rank's share only: reduce-scatter it (each rank "
                 "gets the sum over every rank of its own k elements) and divide by N.")
def backward(student, rank, world):
    model = _model()
    fsdp = student.FSDP(model)
    x, y = _batch(rank)
    nn.functional.mse_loss(fsdp(x), y).backward()
    dense = _model()
    (sum(nn.functional.mse_loss(dense(bx), by) for bx, by in map(_batch, range(world))) / world).backward()
    for i, (shard, unit) in enumerate(zip(fsdp.shards, _units(dense))):
        close(shard.grad, _slice([p.grad for p in unit.parameters()], rank, world), f"unit {i}'s shard gradient",
              atol=1e-6)


@CHECKS.add("communication: one all-gather per unit in forward, one reduce-scatter per unit in backward",
            hint="Gather.forward gathers, Gather.backward reduce-scatters: no other collective is needed.")
def communication(student, rank, world):
    fsdp = student.FSDP(_model())
    x, y = _batch(rank)
    with watch_collectives(student, *COLLECTIVES) as forward_calls:
        loss = nn.functional.mse_loss(fsdp(x), y)
    with watch_collectives(student, *COLLECTIVES) as backward_calls:
        loss.backward()
    f = ["all_gather" if c[0] in GATHERS else c[0] for c in forward_calls]
    b = ["reduce_scatter" if c[0] in SCATTERS else c[0] for c in backward_calls]
    expect(f == ["all_gather"] * 3, f"forward called: {', '.join(f) or 'no collective'}")
    expect(b == ["reduce_scatter"] * 3, f"backward called: {', '.join(b) or 'no collective'}")


@CHECKS.add("three SGD steps (momentum 0.9) equal PyTorch's fully_shard (reshard_after_forward=False)",
            hint="Hand parameters() (the shards) to the optimizer: each rank steps its k elements of every unit, "
                 "and the next forward gathers the updated weights.")
def training(student, rank, world):
    fsdp = student.FSDP(_model())
    reference = _model()
    mesh = init_device_mesh("cpu", (world,))
    for unit in _units(reference):
        fully_shard(unit, mesh=mesh, reshard_after_forward=False)
    fully_shard(reference, mesh=mesh, reshard_after_forward=False)
    # SGD, not Adam: Adam's step is blind to a gradient's scale, so a missing / N would pass unseen
    opt = torch.optim.SGD(fsdp.parameters(), lr=0.1, momentum=0.9)
    opt_ref = torch.optim.SGD(reference.parameters(), lr=0.1, momentum=0.9)
    for step in range(3):
        for model, optimizer in ((fsdp, opt), (reference, opt_ref)):
            x, y = _batch(rank, step)
            nn.functional.mse_loss(model(x), y).backward()
            optimizer.step()
            optimizer.zero_grad()
    mine = [_whole(s, world) for s in fsdp.shards]
    theirs = [torch.cat([p.full_tensor().reshape(-1) for p in unit.parameters()]) for unit in _units(reference)]
    for i, (got, want) in enumerate(zip(mine, theirs)):
        close(got[:want.numel()], want, f"unit {i}'s weights after three steps", atol=1e-6)


@CHECKS.add("optimizer state: AdamW's moments are k elements per unit on every rank",
            hint="Only the shards are parameters: the optimizer never sees a whole weight.")
def optimizer_state(student, rank, world):
    fsdp = student.FSDP(_model())
    opt = torch.optim.AdamW(fsdp.parameters(), lr=0.01)
    x, y = _batch(rank)
    nn.functional.mse_loss(fsdp(x), y).backward()
    opt.step()
    sizes = [opt.state[s]["exp_avg"].numel() for s in fsdp.shards]
    want = [math.ceil(sum(p.numel() for p in u.parameters()) / world) for u in _units(_model())]
    expect(sizes == want, f"exp_avg sizes {sizes}, not {want}")
