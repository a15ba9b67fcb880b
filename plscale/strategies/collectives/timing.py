"""One point of a collectives benchmark, the nccl-tests way: warm up, time a loop of calls,
average the time over ranks, then check one call's result (#wrong).

Inputs are filled with rank + 1, so every collective's answer is known in advance.
"""

import time

import torch
import torch.distributed as dist

from plscale.predict.busbw import bandwidths, element_count
from plscale.rank.distributed import all_gather_single, reduce_scatter_single
from plscale.strategies.collectives.naive import naive_all_reduce
from plscale.strategies.collectives.ring import ring_all_reduce


def buffers(op: str, count: int, dtype: torch.dtype, device) -> tuple:
    """(input, output) for one call over `count` elements; output is None for in-place calls."""
    n, rank = dist.get_world_size(), dist.get_rank()
    size_in = count // n if op == "all_gather" else count
    size_out = {"all_gather": count, "reduce_scatter": count // n, "all_to_all": count}.get(op)
    x = torch.full((size_in,), rank + 1, dtype=dtype, device=device)
    return x, None if size_out is None else torch.empty(size_out, dtype=dtype, device=device)


def call(op: str, x: torch.Tensor, out: torch.Tensor | None) -> None:
    if op == "all_reduce":
        dist.all_reduce(x)
    elif op == "ring_all_reduce":
        ring_all_reduce(x)
    elif op == "naive_all_reduce":
        naive_all_reduce(x)
    elif op == "all_gather":
        all_gather_single(out, x)
    elif op == "reduce_scatter":
        reduce_scatter_single(out, x)
    elif op == "all_to_all":
        dist.all_to_all_single(out, x)
    elif op == "broadcast":
        dist.broadcast(x, src=0)
    elif op == "reduce":
        dist.reduce(x, dst=0)
    else:
        raise ValueError(op)


def expected(op: str, count: int, dtype: torch.dtype, device) -> torch.Tensor | None:
    """This rank's correct result after one call on fresh buffers (None: nothing to check)."""
    n, rank = dist.get_world_size(), dist.get_rank()
    total = n * (n + 1) // 2
    if op in ("all_reduce", "ring_all_reduce", "naive_all_reduce"):
        return torch.full((count,), total, dtype=dtype, device=device)
    if op == "reduce_scatter":
        return torch.full((count // n,), total, dtype=dtype, device=device)
    if op in ("all_gather", "all_to_all"):  # part j came from rank j, which holds j + 1
        return torch.arange(1, n + 1, device=device).repeat_interleave(count // n).to(dtype)
    if op == "broadcast":
        return torch.full((count,), 1, dtype=dtype, device=device)
    return torch.full((count,), total, dtype=dtype, device=device) if rank == 0 else None  # reduce


def _sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure(ops: list[str], size: int, dtype_name: str, device, warmup: int, max_iters: int,
            budget_s: float, rounds: int = 4) -> list[dict]:
    """Time each of `ops` (one collective, or the library's all-reduce beside the hand-written
    ones) on a message of `size` bytes. The ops take turns in `rounds` blocks of calls, so that a
    busy machine slows them alike. Returns one row per op for busbw.format_row."""
    n = dist.get_world_size()
    dtype = getattr(torch, dtype_name)
    base = "all_reduce" if ops[0].endswith("all_reduce") else ops[0]
    count = element_count(base, size, dtype_name, n)
    bufs = {op: buffers(base, count, dtype, device) for op in ops}
    one = torch.zeros(len(ops), dtype=torch.float64, device=device)
    for i, op in enumerate(ops):
        for _ in range(warmup):
            call(op, *bufs[op])
        _sync(device)
        start = time.perf_counter()
        call(op, *bufs[op])
        _sync(device)
        one[i] = time.perf_counter() - start
    # Every rank must make the same calls: agree on the slowest rank's estimates.
    dist.all_reduce(one, op=dist.ReduceOp.MAX)
    iters = [int(max(1, min(max_iters, budget_s / max(t, 1e-9)))) for t in one.tolist()]
    rounds = min(rounds, *iters)
    per_round = [k // rounds for k in iters]  # at most max_iters calls in all
    elapsed = torch.zeros(len(ops), dtype=torch.float64, device=device)
    for _ in range(rounds):
        for i, op in enumerate(ops):
            dist.barrier()
            start = time.perf_counter()
            for _ in range(per_round[i]):
                call(op, *bufs[op])
            _sync(device)
            elapsed[i] += time.perf_counter() - start
    dist.all_reduce(elapsed)  # nccl-tests averages the time over ranks
    del bufs

    rows = []
    for i, op in enumerate(ops):
        x, out = buffers(base, count, dtype, device)  # one more call on fresh buffers, checked
        call(op, x, out)
        want = expected(op, count, dtype, device)
        wrong = torch.zeros(1, dtype=torch.int64, device=device)
        if want is not None:
            wrong += ((out if out is not None else x) != want).sum()
        dist.all_reduce(wrong)
        seconds = elapsed[i].item() / n / (rounds * per_round[i])
        real_size = count * x.element_size()
        algbw, busbw = bandwidths(base, real_size, seconds, n)
        rows.append({"op": op, "size": real_size, "count": count, "dtype": dtype_name, "ranks": n,
                     "iters": rounds * per_round[i], "time_us": seconds * 1e6, "algbw": algbw, "busbw": busbw,
                     "wrong": int(wrong.item())})
    return rows
