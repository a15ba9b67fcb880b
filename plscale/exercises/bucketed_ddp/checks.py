"""The checks of bucketed-ddp, run in every rank (2 and 4 ranks): the student's buckets, and
their gradients against torch's own DistributedDataParallel on the same model and batches."""

import torch
import torch.distributed as dist
from torch import nn

from plscale.exercises.harness import Checks, close, expect, watch_collectives

CHECKS = Checks()
CAP = 600   # bytes: three buckets of the MLP below, one of them a lone parameter larger than the cap


def _model() -> nn.Module:
    """The same MLP on every rank: 8 -> 16 -> 16 -> 4, six parameters of 128, 16, 256, 16, 64, 4."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 4))


def _batch(rank: int, step: int = 0):
    """This rank's own batch: data parallelism reads different data on every rank."""
    g = torch.Generator().manual_seed(100 + 10 * step + rank)
    return torch.randn(6, 8, generator=g), torch.randn(6, 4, generator=g)


def _loss(model, rank: int, step: int = 0):
    x, y = _batch(rank, step)
    return nn.functional.mse_loss(model(x), y)


def _torch_ddp_grads(rank: int) -> dict:
    """torch's DDP on a copy: the averaged gradient of every parameter, by name."""
    model = _model()
    ddp = nn.parallel.DistributedDataParallel(model)
    _loss(ddp, rank).backward()
    return {n: p.grad.clone() for n, p in model.named_parameters()}


def _expected_buckets(model: nn.Module, cap: int) -> list[list[str]]:
    """The rule of the task, by name: reverse order, a new bucket when the next would overflow."""
    buckets, size = [[]], 0
    for name, p in reversed([(n, p) for n, p in model.named_parameters() if p.requires_grad]):
        if buckets[-1] and size + 4 * p.numel() > cap:
            buckets.append([])
            size = 0
        buckets[-1].append(name)
        size += 4 * p.numel()
    return buckets


def _names(model: nn.Module, buckets) -> list[list[str]]:
    by_id = {id(p): n for n, p in model.named_parameters()}
    return [[by_id.get(id(p), "(not a parameter of the module)") for p in bucket] for bucket in buckets]


@CHECKS.add("buckets: parameters in reverse order, at most bucket_bytes of fp32 gradient each",
            hint="Walk the parameters from the last layer to the first; start a new bucket when the next "
                 "parameter would not fit, so a parameter bigger than the cap gets a bucket of its own.")
def buckets(student, rank, world):
    for cap in (CAP, 10**6):
        model = _model()
        ddp = student.BucketedDDP(model, bucket_bytes=cap)
        got = _names(model, getattr(ddp, "buckets", None) or [])
        expect(got == _expected_buckets(model, cap), f"bucket_bytes {cap}: buckets {got}")


@CHECKS.add("gradients after finish() equal torch's DistributedDataParallel's (the mean over the ranks)",
            hint="all_reduce sums: divide by the number of ranks, and copy each slice of the flat bucket "
                 "back into the gradient of the parameter it came from.")
def gradients(student, rank, world):
    want = _torch_ddp_grads(rank)
    model = _model()
    ddp = student.BucketedDDP(model, bucket_bytes=CAP)
    _loss(ddp, rank).backward()
    ddp.finish()
    for name, p in model.named_parameters():
        close(p.grad, want[name], f"{name}'s gradient", atol=1e-6)


@CHECKS.add("overlap: one async all-reduce per bucket, each started during the backward",
            hint="Start a bucket's all-reduce from the hook of its last gradient, with async_op=True, and keep "
                 "the handle: the backward goes on while it runs.")
def overlap(student, rank, world):
    model = _model()
    ddp = student.BucketedDDP(model, bucket_bytes=CAP)
    loss = _loss(ddp, rank)
    with watch_collectives(student, "all_reduce", "all_reduce_coalesced") as calls:
        loss.backward()
    ddp.finish()
    expect(len(calls) == 3, f"{len(calls)} all-reduce(s) during the backward; the buckets are 3")
    asynchronous = [c for c in calls if c[2].get("async_op") or (len(c[1]) > 3 and c[1][3])]
    expect(len(asynchronous) == len(calls), f"{len(calls) - len(asynchronous)} all-reduce(s) not async_op=True")


@CHECKS.add("finish() waits and copies: no collective of its own",
            hint="Every all-reduce was started in the backward; finish() only waits for the handles.")
def finish_sends_nothing(student, rank, world):
    model = _model()
    ddp = student.BucketedDDP(model, bucket_bytes=CAP)
    _loss(ddp, rank).backward()
    with watch_collectives(student, "all_reduce", "all_reduce_coalesced", "broadcast", "all_gather",
                           "reduce_scatter") as calls:
        ddp.finish()
    expect(not calls, f"finish() called {', '.join(c[0] for c in calls)}")


@CHECKS.add("three SGD steps equal torch's DDP's, and every rank holds the same parameters",
            hint="After finish(), get ready for the next backward: every bucket's count of ready gradients "
                 "starts again from zero.")
def training(student, rank, world):
    reference = _model()
    ddp_ref = nn.parallel.DistributedDataParallel(reference)
    opt_ref = torch.optim.SGD(reference.parameters(), lr=0.1)
    model = _model()
    ddp = student.BucketedDDP(model, bucket_bytes=CAP)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(3):
        _loss(ddp_ref, rank, step).backward()
        opt_ref.step()
        opt_ref.zero_grad()
        _loss(ddp, rank, step).backward()
        ddp.finish()
        opt.step()
        opt.zero_grad()
    mine = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    everyone = [torch.empty_like(mine) for _ in range(world)]
    dist.all_gather(everyone, mine)
    close(mine, torch.cat([p.detach().reshape(-1) for p in reference.parameters()]), "the parameters after 3 steps",
          atol=1e-6)
    expect(all(torch.equal(e, everyone[0]) for e in everyone), "the ranks' parameters differ after 3 steps")


@CHECKS.add("frozen parameters: in no bucket, their .grad left None; the rest as DDP's",
            hint="Only parameters that require a gradient get a hook and a place in a bucket: a frozen one "
                 "never becomes ready, and a bucket waiting for it would never be sent.")
def frozen(student, rank, world):
    reference = _model()
    reference[0].weight.requires_grad_(False)
    ddp_ref = nn.parallel.DistributedDataParallel(reference)   # kept: its reducer's hooks live with it
    _loss(ddp_ref, rank).backward()
    model = _model()
    model[0].weight.requires_grad_(False)
    ddp = student.BucketedDDP(model, bucket_bytes=CAP)
    got = _names(model, getattr(ddp, "buckets", None) or [])
    _loss(ddp, rank).backward()
    ddp.finish()
    expect(got == _expected_buckets(model, CAP), f"buckets {got} with 0.weight frozen")
    expect(model[0].weight.grad is None, "the frozen 0.weight has a gradient")
    for name, p in list(model.named_parameters())[1:]:
        close(p.grad, dict(reference.named_parameters())[name].grad, f"{name}'s gradient", atol=1e-6)
