"""Hand-written collectives against the library's: the same result bit for bit, and the time
each takes beside dist.all_reduce on the same message, nccl-tests style.

    x = exact_integers(1000, torch.bfloat16, world_size, seed=rank)     # partial sums stay exact
    ring_ok, naive_ok = equal_to_library(x.to(dev), ring_all_reduce, naive_all_reduce)
    row = timed_beside_library("all_reduce", 2**20, "float32", dev, ["ring"], warmup, iters, budget_s)
    ratio = ring_ratio(rows)       # the row the lab reports: 64 MiB, else the largest; None without the ring

A row has the library's time_us and busbw, and for each hand-written all-reduce NAME
NAME_time_us and NAME_busbw; "ratio" is ring_time_us / time_us.
"""

import torch
import torch.distributed as dist

from plscale.strategies.collectives.timing import measure


def exact_integers(numel: int, dtype, ranks: int, seed: int) -> torch.Tensor:
    """Integers small enough that a sum over `ranks` stays exact in `dtype` (bfloat16 included) and
    in range (int8; uint8 non-negative): every way of adding them gives the same bits."""
    limit = min(30, 120 // ranks)
    low = 0 if dtype == torch.uint8 else -limit
    return torch.randint(low, limit + 1, (numel,), generator=torch.Generator().manual_seed(seed)).to(dtype)


def equal_to_library(x: torch.Tensor, *all_reduces) -> list[bool]:
    """For each hand-written all-reduce (in place, like dist.all_reduce), whether it leaves this
    rank's copy of `x` equal, bit for bit, to what dist.all_reduce leaves."""
    library = x.clone()
    dist.all_reduce(library)
    out = []
    for fn in all_reduces:
        mine = x.clone()
        fn(mine)
        out.append(torch.equal(mine, library))
    return out


def timed_beside_library(op: str, size: int, dtype: str, device, hand: list[str], warmup: int, iters: int,
                         budget_s: float) -> dict:
    """One size of `op`: its row, and for all_reduce the hand-written ones (`hand`: "ring", "naive")
    timed in turns with the library's, their times and bus bandwidths in the same row."""
    side = [op] + [f"{name}_all_reduce" for name in hand if op == "all_reduce"]
    row, *mine = measure(side, size, dtype, device, warmup, iters, budget_s)
    for other in mine:
        name = other["op"].split("_")[0]
        row.update({f"{name}_time_us": other["time_us"], f"{name}_busbw": other["busbw"]})
        row["wrong"] += other["wrong"]
    if "ring_time_us" in row:
        row["ratio"] = row["ring_time_us"] / row["time_us"]
    return row


def ring_ratio(rows: list[dict], at: int = 64 * 2**20) -> dict | None:
    """The row whose ring / library time ratio a lab reports: at `at` bytes, else the largest
    size timed; None when the ring was not timed."""
    timed = [r for r in rows if r.get("ratio")]
    return next((r for r in timed if r["size"] == at), timed[-1]) if timed else None
