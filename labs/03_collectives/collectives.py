"""Lab 03: collective communication, by hand and measured.

    tour   every primitive on small tensors: each rank's tensor before and after
    ring   the ring all-reduce written with send/recv, step by step, checked against the library
    bench  time, algbw and busbw per message size, nccl-tests style (CSV and PNG in the run dir)

    plscale lab run collectives --gpus 4                      (the tour)
    plscale lab run ring-allreduce --gpus 4
    plscale bench collectives --gpus 2 --sizes 32K-64M        (or: plscale lab run collectives-bench)
    torchrun --nproc_per_node 4 labs/03_collectives/collectives.py --variant ring
"""

import time

import torch
import torch.distributed as dist

from plscale.hardware import memory_available
from plscale.charts import busbw as busbw_chart
from plscale.predict import busbw
from plscale.rank import runtime
from plscale.strategies.collectives.against_library import equal_to_library, exact_integers, ring_ratio, timed_beside_library
from plscale.rank.rank_tables import every_rank as gathered, numbers as text, show
from plscale.rank.distributed import all_gather_single, reduce_scatter_single
from plscale.strategies.collectives.naive import naive_all_reduce
from plscale.strategies.collectives.ring import ring_all_reduce
from plscale.rank.metrics import figure

ctx = runtime.start(__file__)
S, dev, N, rank = ctx.settings, ctx.device, ctx.world_size, ctx.rank
figures, extra = [], {}


# ---- The tour: every primitive, every rank's tensor before and after --------------------
K = S["tour"]["numel"]
BASE = 10 if N * K < 10 else 100


def part(r, parts=1):
    """Rank r's input: easy to trace (rank 2 holds 21 22 ... when BASE is 10)."""
    return torch.arange(1, parts * K + 1, dtype=torch.float32, device=dev) + BASE * r


def chunk(t, i):
    return t[i * K:(i + 1) * K]


def everyone_sum(parts=1):
    return sum(part(r, parts) for r in range(N))


def broadcast():
    x = part(rank)
    dist.broadcast(x, src=0)
    return x, part(0)


def reduce():
    x = part(rank)
    dist.reduce(x, dst=0)
    return (x, everyone_sum()) if rank == 0 else (None, None)  # other ranks' buffers: undefined


def all_reduce():
    x = part(rank)
    dist.all_reduce(x)
    return x, everyone_sum()


def all_gather():
    out = torch.empty(N * K, device=dev)
    all_gather_single(out, part(rank))
    return out, torch.cat([part(r) for r in range(N)])


def reduce_scatter():
    out = torch.empty(K, device=dev)
    reduce_scatter_single(out, part(rank, N))
    return out, chunk(everyone_sum(N), rank)


def all_to_all():
    out = torch.empty(N * K, device=dev)
    dist.all_to_all_single(out, part(rank, N))  # chunk j of rank i lands as chunk i on rank j
    return out, torch.cat([chunk(part(r, N), rank) for r in range(N)])


def scatter():
    out = torch.empty(K, device=dev)
    dist.scatter(out, list(part(0, N).split(K)) if rank == 0 else None, src=0)
    return out, chunk(part(0, N), rank)


def gather():
    out = [torch.empty(K, device=dev) for _ in range(N)] if rank == 0 else None
    dist.gather(part(rank), out, dst=0)
    return (torch.cat(out), torch.cat([part(r) for r in range(N)])) if rank == 0 else (None, None)


TOUR = {  # name: (function, input parts per rank, what training uses it for)
    "broadcast": (broadcast, 1, "initial weights: every replica starts from rank 0's (DDP does it at wrap time)"),
    "reduce": (reduce, 1, "a metric summed onto the one rank that logs it"),
    "all_reduce": (all_reduce, 1, "DDP / ZeRO-0: every rank's gradients summed (then averaged) on every rank"),
    "all_gather": (all_gather, 1, "ZeRO-3 gathers a layer's parameter shards before using it; sequence "
                                  "parallelism gathers the sequence before attention"),
    "reduce_scatter": (reduce_scatter, N, "ZeRO-2/3: each rank receives the summed gradients of its own shard; "
                                          "sequence parallelism after a row-parallel layer"),
    "all_to_all": (all_to_all, N, "expert parallelism: tokens travel to the rank that holds their expert "
                                  "(and back); Ulysses sequence parallelism"),
    "scatter": (scatter, N, "hand each rank its part of rank 0's data"),
    "gather": (gather, 1, "collect every rank's results (evaluation outputs) on one rank"),
}


def tour_barrier():
    """Rank r arrives r x 100 ms late; nobody leaves before the last one arrives."""
    dist.barrier()
    start = time.perf_counter()
    time.sleep(0.1 * rank)
    arrived = time.perf_counter() - start
    dist.barrier()
    left = time.perf_counter() - start
    times = gathered(torch.tensor([arrived, left], dtype=torch.float64))
    show(ctx, "barrier", "wait for everyone: before reading a checkpoint another rank wrote, before timing a step",
         ["rank", "arrived (ms)", "left (ms)"], [[str(r), f"{1e3 * a:.0f}", f"{1e3 * l:.0f}"] for r, (a, l) in enumerate(times)])
    last = max(a for a, _ in times)
    ctx.check("barrier", min(l for _, l in times) >= last - 0.02,
              f"every rank left after the last arrived ({1e3 * last:.0f} ms)")
    figures.append(figure("rank 0's wait at the barrier", round(1e3 * (times[0][1] - times[0][0])), "ms",
                          100 * (N - 1), "the last rank arrives 100 ms x (N-1) late"))


def tour():
    ops = S["tour"]["ops"].split(",")  # check.py has vetted the names
    ctx.log(f"{N} ranks over {ctx.backend}; rank r's input is {text(part(0).tolist())} plus {BASE} x r "
            f"('—': nothing defined there)")
    passed = 0
    for name in ops:
        if name == "barrier":
            tour_barrier()
            continue
        fn, parts, use = TOUR[name]
        used = rank == 0 or name != "scatter"  # scatter reads rank 0's tensor only
        before, (after, want) = gathered(part(rank, parts) if used else None), fn()
        after_all, ok = gathered(after), gathered(torch.tensor([want is None or torch.equal(after, want)]))
        show(ctx, name, use, ["rank", "before", "after"], [[str(r), text(before[r]), text(after_all[r])] for r in range(N)])
        ctx.check(name, all(flag[0] for flag in ok), "every rank holds what the definition says")
        passed += all(flag[0] for flag in ok)
    # The identity the ring is built on: all-reduce = reduce-scatter, then all-gather.
    shard, full = torch.empty(K, device=dev), torch.empty(N * K, device=dev)
    reduce_scatter_single(shard, part(rank, N))
    all_gather_single(full, shard)
    ctx.check("all_reduce == reduce_scatter + all_gather", torch.equal(full, everyone_sum(N)), text(full.tolist()))
    tensors = [name for name in ops if name != "barrier"]
    figures.append(figure("primitives that match their definition", passed, f"of {len(tensors)}", len(tensors)))


# ---- The ring, by hand --------------------------------------------------------------------
def ring():
    # 1. Watch it: N chunks of one element; rank r contributes 10^r, so the digits of a partial
    #    sum say which ranks it already holds (1111 = all four).
    x = torch.full((N,), 10 ** rank, dtype=torch.int64, device=dev)
    rows = [["start", *map(text, gathered(x))]]
    ring_all_reduce(x, on_step=lambda phase, step: rows.append([f"{phase} {step + 1}", *map(text, gathered(x))]))
    show(ctx, "ring all-reduce", f"every rank's {N} chunks after each step; rank r adds 10^r, so the digits of a "
         f"partial sum say whose parts it holds", ["step", *[f"rank {r}" for r in range(N)]], rows)
    ctx.check("ring trace", bool((x == int("1" * N)).all()), f"every chunk holds {'1' * N} on every rank")

    # 2. Check it: against dist.all_reduce, for sizes not divisible by N and every dtype. Integer
    #    values keep every partial sum exact, so the three must agree bit for bit.
    sizes = [int(n) for n in str(S["ring"]["sizes"]).split(",")]
    rows, cases, passed = [], 0, 0
    for dtype_name in S["ring"]["dtypes"].split(","):
        dtype = getattr(torch, busbw.check_dtype(dtype_name.strip()))
        ring_ok = naive_ok = True
        for numel in sizes:
            x = exact_integers(numel, dtype, N, S["seed"] * 1000 + rank).to(dev)
            same = gathered(torch.tensor(equal_to_library(x, ring_all_reduce, naive_all_reduce)))
            ring_ok &= all(s[0] for s in same)
            naive_ok &= all(s[1] for s in same)
            cases += 1
            passed += all(s[0] and s[1] for s in same)
        rows.append([dtype_name, ", ".join(map(str, sizes)), "yes" if ring_ok else "NO", "yes" if naive_ok else "NO"])
    show(ctx, "parity", f"the ring and the naive all-reduce against dist.all_reduce on {N} ranks ({ctx.backend})",
         ["dtype", "elements", "ring == library", "naive == library"], rows)
    ctx.check("ring and naive == dist.all_reduce", passed == cases, f"{passed} of {cases} (dtype, size) cases, "
              f"bit for bit")

    # 3. Count the traffic: the ring spreads it evenly, the naive scheme piles it onto rank 0.
    x = torch.ones(3 * 2**18, device=dev)  # 3 MiB of float32, divisible by 2, 3, 4 and 8 ranks
    size = x.numel() * x.element_size()
    sent = gathered(torch.tensor([ring_all_reduce(x.clone()), naive_all_reduce(x.clone())]))
    want = list(zip(busbw.ring_bytes_sent(x.numel(), x.element_size(), N), busbw.naive_bytes_sent(size, N)))
    show(ctx, "traffic", f"bytes each rank sends for S = {size:,} B (ring: 2(N-1)/N x S on every rank; naive: "
         f"(N-1) x S on rank 0)", ["rank", "ring sent", "ring / S", "naive sent", "naive / S"],
         [[str(r), f"{a:,} B", f"{a / size:.3f}", f"{b:,} B", f"{b / size:.3f}"] for r, (a, b) in enumerate(sent)])
    ctx.check("traffic", [tuple(r) for r in sent] == want,  # plscale/predict/busbw.py
              f"ring {busbw.bus_factor('all_reduce', N):.3f} S per rank, naive {want[0][1] // size} S from rank 0")
    figures.extend([
        figure("parity cases equal to dist.all_reduce", passed, f"of {cases}", cases, "bit for bit"),
        figure("ring: bytes sent per rank / S", max(b for b, _ in sent) / size, "x",
               round(max(b for b, _ in want) / size, 4), "2(N-1)/N, the same on every rank"),
        figure("naive: bytes sent by rank 0 / S", sent[0][1] / size, "x", want[0][1] // size,
               "N-1: rank 0 is the bottleneck"),
    ])


# ---- The benchmark, nccl-tests style ------------------------------------------------------
def bench():
    B = S["bench"]
    ops, dtype = busbw.parse_ops(B["ops"]), busbw.check_dtype(B["dtype"])
    sizes = busbw.resolve_sizes(B["sizes"], ops, dtype, N, dev.type, memory_available(dev.type))
    rows, total, done = [], len(ops) * len(sizes), 0
    ctx.log(f"{N} ranks over {ctx.backend} ({dev.type}), {dtype}, sizes {busbw.human(sizes[0])}-"
            f"{busbw.human(sizes[-1])}; GB = 1e9 bytes")
    for op in ops:
        block = []
        for size in sizes:  # the hand-written all-reduces timed in turns with the library's
            row = timed_beside_library(op, size, dtype, dev, [name for name in ("ring", "naive") if B[name]],
                                       B["warmup"], B["iters"], B["budget_s"])
            row["backend"] = ctx.backend
            block.append(row)
            ctx.metrics.step(**row)
            done += 1
            ctx.metrics.progress("bench", done, total, f"{op} {busbw.human(size)}")
        ctx.log("\n".join(["", *busbw.format_table(op, block, N, ctx.backend)]))
        rows += block
        peak = max(block, key=lambda r: r["busbw"])
        figures.append(figure(f"{op} peak busbw", round(peak["busbw"], 3), "GB/s", None,
                              f"at {busbw.human(peak['size'])}, {N} ranks, {ctx.backend}"))
    ctx.check("no wrong results", all(r["wrong"] == 0 for r in rows), "every call checked once on fresh buffers")
    at = ring_ratio(rows)
    if at:
        target = 1.5 if ctx.backend == "gloo" and N == 2 and at["size"] == 64 * 2**20 else None
        figures.append(figure(f"ring / library time at {busbw.human(at['size'])}", round(at["ratio"], 3), "x",
                              f"<= {target}" if target else None, f"{N} ranks, {ctx.backend}"))
        ctx.log(f"\nhand-written ring vs dist.all_reduce ({ctx.backend}), time ratio per size: " +
                ", ".join(f"{busbw.human(r['size'])} {r['ratio']:.2f}x" for r in rows if r.get("ratio")))
        if ctx.backend != "nccl":
            ctx.log("no GPU here: the NCCL comparison needs a GPU machine (run the same command there)")
    if ctx.is_main:
        busbw.write_csv(ctx.run_dir / "busbw.csv", rows)
        busbw_chart.plot(ctx.run_dir / "busbw.png", rows, f"bus bandwidth, {N} ranks over {ctx.backend} ({dtype})")
    extra.update(plots=["busbw.png"], csv="busbw.csv", sizes=sizes, ops=ops)


{"ring": ring, "bench": bench}.get(ctx.variant, tour)()
ctx.finish(figures, **extra)
