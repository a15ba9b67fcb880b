"""Attention over a growing sequence: on one rank against context parallelism (ring attention,
plain and zig-zag split, and DeepSpeed-Ulysses); time, balance and memory per rank.

    python benchmarks/context_parallel_attention.py [--seqs 1024 2048 4096 8192] [--cp 2] [--rounds 2]
                                                    [--heads 4] [--head-dim 64] [--batch 1]

Attention alone, not the model: causal, forward + backward (a random output gradient), of
q, k, v [batch, heads, seq, head_dim] (as many key/value heads as query heads), float32 on
CPU, bfloat16 on cuda. The script re-launches itself under torchrun on --cp ranks, 1 thread
per rank; DS_ACCELERATOR=cpu and gloo unless --cp GPUs are visible (then NCCL). Methods:

    one rank     F.scaled_dot_product_attention(q, k, v, is_causal=True) on the whole sequence,
                 on rank 0 while the others wait at a barrier
    ring plain   plscale ring_attention, rank r holding chunk r of cp
    ring zigzag  the same with chunks r and 2cp - 1 - r of 2cp
                 (positions: plscale.predict.context_parallel.positions(seq, cp, rank, split))
    ulysses      plscale ulysses_attention (DeepSpeed's DistributedAttention; plain split)

Each (seq, method) row first runs once untimed, measuring memory (and warming up); then
--rounds rounds time every row, rows in order then reversed, so slow spells fall on every
row alike. Per row, the median over every timed call of:

    step ms       the slowest rank's wall time (all ranks start after a barrier) = the step
    vs one rank   one rank's time over this one's: the speed-up (above 1x: faster)
    wall max/min  slowest over fastest rank, wall time
    comp max/min  ring only: slowest over fastest rank of ring_attention.TALLY.compute_seconds
                  (time computing on blocks, not waiting), with the work's max/min predicted by
                  plscale.predict.context_parallel.attention_work in brackets: the imbalance
    sys CPU       the kernel's share of the ranks' CPU seconds (getrusage: system / (user + system))
    saved MiB     bytes autograd saves for backward (plscale.rank.census.saved_activations),
                  largest rank, and over one rank's
    peak MiB      peak of live tensor bytes during forward + backward above the inputs (cuda:
                  torch.cuda.max_memory_allocated's delta; CPU: allocations and frees recorded
                  by torch.profiler with profile_memory), largest rank, and over one rank's
Short sequences get more timed calls per round (8 at seq <= max/8, 4 at max/4, else 1).

Measured on this machine (2 CPU cores, shared; 2026-11-23), the defaults, 42 s in all, with
the machine otherwise idle (other processes: 2% of the CPU). Ring attention's chunk pairs run
PyTorch's fused CPU flash-attention kernel (plscale/strategies/context_parallel/ring_attention.py):

    causal attention, forward + backward: batch 1 x 4 heads x head_dim 64, cpu, float32, 1 thread per rank; cp 2 over 2 gloo ranks; median of every timed call (2 rounds of 8 at 1024, 4 at 2048, 1 at 4096, 1 at 8192)
        seq  method        step ms  vs one rank  wall max/min  comp max/min (pred)  sys CPU   ms per rank: wall (compute)
       1024  one rank         44.8        1.00x             -                    -      0%   45
       1024  ring plain       43.2        1.04x          1.02          1.90 (3.00)     14%   43/43 (18/34)
       1024  ring zigzag      37.0        1.21x          1.03          1.05 (1.00)     18%   37/36 (25/24)
       1024  ulysses          38.4        1.16x          1.02                    -     11%   37/38
       2048  one rank        137.2        1.00x             -                    -      0%   137
       2048  ring plain      117.1        1.17x          1.01          2.32 (3.00)      7%   115/117 (46/105)
       2048  ring zigzag     102.6        1.34x          1.02          1.06 (1.00)      8%   101/102 (86/83)
       2048  ulysses          87.4        1.57x          1.00                    -      7%   87/87
       4096  one rank        496.1        1.00x             -                    -      0%   496
       4096  ring plain      422.0        1.18x          1.00          2.59 (3.00)      4%   422/422 (155/402)
       4096  ring zigzag     295.5        1.68x          1.00          1.08 (1.00)      1%   295/296 (277/260)
       4096  ulysses         332.8        1.49x          1.00                    -      2%   331/333
       8192  one rank       2125.4        1.00x             -                    -      6%   2125
       8192  ring plain     1559.4        1.36x          1.00          2.78 (3.00)      3%   1558/1559 (546/1519)
       8192  ring zigzag    1185.1        1.79x          1.00          1.02 (1.00)      2%   1184/1185 (1098/1094)
       8192  ulysses        1129.0        1.88x          1.00                    -      2%   1129/1126
      step: the slowest rank's wall time; vs one rank: one rank's step over the method's (above 1x: faster);
      comp: ring_attention.TALLY.compute_seconds, (pred): attention_work's max/min (scores that count); sys CPU: the kernel's share
      of the taking-part ranks' CPU seconds (page faults, gloo's sockets)

      memory per rank, the largest rank: saved for backward (saved_activations), and the peak during forward + backward above the inputs (live tensor bytes from torch.profiler's allocations and frees)
        seq  method        saved MiB  vs one  peak MiB  vs one
       1024  one rank            4.0   1.00x       6.0   1.00x
       1024  ring plain          2.0   0.50x       7.8   1.29x
       1024  ring zigzag         2.0   0.50x       5.9   0.98x
       1024  ulysses             2.0   0.50x       6.5   1.08x
       2048  one rank            8.0   1.00x      11.0   1.00x
       2048  ring plain          4.0   0.50x      16.0   1.45x
       2048  ring zigzag         4.0   0.50x      11.8   1.07x
       2048  ulysses             4.0   0.50x      11.0   1.00x
       4096  one rank           16.1   1.00x      21.1   1.00x
       4096  ring plain          8.0   0.50x      31.1   1.47x
       4096  ring zigzag         8.0   0.50x      24.1   1.14x
       4096  ulysses             8.0   0.50x      21.0   1.00x
       8192  one rank           32.1   1.00x      41.1   1.00x
       8192  ring plain         16.1   0.50x      61.1   1.49x
       8192  ring zigzag        16.1   0.50x      47.1   1.15x
       8192  ulysses            16.1   0.50x      41.1   1.00x

Context parallelism now pays on CPU from 2048 tokens: at cp 2 zig-zag ring attention is
1.34-1.79x one rank's speed (ideal 2x) and Ulysses 1.49-1.88x; the plain split 1.17-1.36x,
held back by its last rank, which has 3x the first rank's scores (compute max/min 2.3-2.8,
approaching the predicted 3.0 as the diagonal blocks' share shrinks). The wall max/min stays
1.00-1.03 for both splits: the ring runs in lock step (every step waits for the next block,
and the backward's dk/dv hop), so the light rank waits and both finish together; the
imbalance costs step time, not a visible gap. Every method saves exactly half of one rank's
bytes for backward (the memory model's s/cp). The peak per rank stays at 1.0-1.5x one rank's
at cp 2: the received key/value blocks, the float32 output and lse being merged, and the dk/dv
accumulators travelling with their block sit beside the halved activations.

Before the fused kernel (each chunk pair as einsums on materialised [s/cp, s/cp] score
blocks, still `kernel="math"`), the same run measured ring plain 0.25x and zig-zag 0.41x one
rank's speed at 8192, with peaks of 32x and 8.6x one rank's: attention written out is the
lesson, not the way to run it. On cuda (NCCL, bfloat16) nothing was measured here (no GPUs on
this machine); there the chunk pairs take the math path (see ring_attention.kernel_for).
"""

import argparse
import contextlib
import logging
import os
import resource
import statistics
import subprocess
import sys
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from run_watch import Others  # noqa: E402

METHODS = ("one rank", "ring plain", "ring zigzag", "ulysses")
MiB, SEED = 2**20, 0


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seqs", type=int, nargs="+", default=[1024, 2048, 4096, 8192])
    parser.add_argument("--cp", type=int, default=2, help="context-parallel ranks")
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=2,
                        help="timed rounds of every row, in alternating order; the median per row is reported")
    parser.add_argument("--ranks", action="store_true", help=argparse.SUPPRESS)  # set by the re-launch
    args = parser.parse_args()
    if args.cp < 2:
        parser.error("--cp: 2 or more ranks")
    if args.heads % args.cp:
        parser.error(f"--heads {args.heads}: Ulysses needs the heads divisible by --cp {args.cp}")
    for seq in args.seqs:
        if seq % (2 * args.cp):
            parser.error(f"--seqs {seq}: the zig-zag split cuts the sequence into 2 x cp = {2 * args.cp} chunks")
    return args


def quiet() -> None:
    warnings.filterwarnings("ignore")
    for name in ("DeepSpeed", "deepspeed", "torch.distributed"):
        logging.getLogger(name).setLevel(logging.ERROR)


@contextlib.contextmanager
def muted_stderr():
    """File descriptor 2 to /dev/null: the profiler's C++ side prints a line as it starts and stops."""
    sys.stderr.flush()
    kept, null = os.dup(2), os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 2)
    os.close(null)
    try:
        yield
    finally:
        sys.stderr.flush()
        os.dup2(kept, 2)
        os.close(kept)


def peak_cpu_bytes(prof) -> int:
    """Peak of live bytes over a profiled block: its allocations and frees in time order."""
    with muted_stderr():
        events = [e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"]
    events.sort(key=lambda e: e.start_ns())
    now = peak = 0
    for e in events:
        now += e.nbytes()
        peak = max(peak, now)
    return peak


# ---- Inside each rank -------------------------------------------------------------------
def ranks(args) -> None:
    quiet()
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.profiler import ProfilerActivity, profile

    from plscale.predict.context_parallel import positions
    from plscale.rank import distributed
    from plscale.rank.census import saved_activations
    from plscale.strategies.context_parallel import ring_attention as ring
    from plscale.strategies.context_parallel import ulysses
    from plscale.rank.mesh import Mesh

    d = distributed.init()  # deepspeed.init_distributed too: Ulysses talks through DeepSpeed's comm
    cp = d.world_size
    mesh = Mesh.build(cp=cp, dims=("cp",))
    group, me = mesh.group("cp"), mesh.rank_in("cp")
    cuda = d.device.type == "cuda"
    dtype = torch.bfloat16 if cuda else torch.float32

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize()

    def tensors(seq: int) -> tuple:
        """q, k, v and the output gradient over the whole sequence, the same on every rank."""
        g = torch.Generator().manual_seed(SEED + seq)
        shape = (args.batch, args.heads, seq, args.head_dim)
        return tuple(torch.randn(shape, generator=g).to(d.device, dtype) for _ in range(4))

    def attend(method: str, seq: int, whole: tuple):
        """(forward, output gradient) for this rank's part of the method: forward() attends over
        leaf copies of this rank's slice of q, k, v, cut here, before any clock starts."""
        q, k, v, dout = whole
        if method == "one rank":
            mine = list(range(seq))
        else:
            mine = positions(seq, cp, me, method.split()[1] if method.startswith("ring") else "plain")
        index = torch.tensor(mine, device=d.device)
        local = [t[:, :, index].detach().requires_grad_() for t in (q, k, v)]
        grad = dout[:, :, index].contiguous()

        def forward():
            if method == "one rank":
                return F.scaled_dot_product_attention(*local, is_causal=True)
            if method == "ulysses":
                return ulysses.ulysses_attention(*local, group, causal=True)
            return ring.ring_attention(*local, group, mine, causal=True)
        return forward, grad

    def takes_part(method: str) -> bool:
        return method != "one rank" or me == 0

    def memory(method: str, seq: int, whole: tuple) -> tuple[int, int]:
        """(saved bytes, peak bytes) of one forward + backward on this rank; (0, 0) if idle."""
        dist.barrier()
        if not takes_part(method):
            dist.barrier()
            return 0, 0
        forward, grad = attend(method, seq, whole)
        sync()
        if cuda:
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
            with saved_activations() as saved:
                out = forward()
            out.backward(grad)
            sync()
            peak = torch.cuda.max_memory_allocated() - base
        else:
            with muted_stderr(), profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
                with saved_activations() as saved:
                    out = forward()
                out.backward(grad)
            peak = peak_cpu_bytes(prof)
        dist.barrier()
        return saved.bytes, peak

    def timed(method: str, seq: int, whole: tuple) -> tuple:
        """(wall s, ring compute s, user CPU s, system CPU s) of one forward + backward on this rank."""
        active = takes_part(method)
        if active:
            forward, grad = attend(method, seq, whole)
            ring.TALLY.reset()
        sync()
        dist.barrier()
        if not active:
            dist.barrier()
            return 0.0, 0.0, 0.0, 0.0
        cpu, start = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
        forward().backward(grad)
        sync()
        wall, spent = time.perf_counter() - start, resource.getrusage(resource.RUSAGE_SELF)
        if method == "one rank":
            dist.barrier()
        return (wall, sum(ring.TALLY.compute_seconds.values()), spent.ru_utime - cpu.ru_utime,
                spent.ru_stime - cpu.ru_stime)

    rows = [(seq, method) for seq in args.seqs for method in METHODS]
    mem, calls = {}, {row: [] for row in rows}
    say = print if d.rank == 0 else (lambda *a, **k: None)
    for seq in args.seqs:
        whole = tensors(seq)
        for method in METHODS:
            mem[(seq, method)] = memory(method, seq, whole)
    say(f"memory measured (and every row warmed up); {args.rounds} timed rounds "
        f"({', '.join(f'{reps(args, seq)} x seq {seq}' for seq in args.seqs)} per row) ...", flush=True)
    for r in range(args.rounds):
        order = rows if r % 2 == 0 else rows[::-1]
        at = None
        for seq, method in order:
            if at != seq:
                whole, at = tensors(seq), seq
            for _ in range(reps(args, seq)):
                calls[(seq, method)].append(timed(method, seq, whole))
        say(f"  round {r + 1}/{args.rounds} done", flush=True)
    everyone = [None] * cp
    dist.all_gather_object(everyone, (mem, calls), group=group)
    if d.rank == 0:
        report(args, cp, d.backend, cuda, everyone)
    distributed.shutdown()


def reps(args, seq: int) -> int:
    """Timed calls per row and round: more for the short sequences (the cost grows as seq^2),
    which are over in milliseconds and so at the mercy of any other process."""
    return max(1, min(8, (max(args.seqs) // seq) ** 2 // 4))


def report(args, cp: int, backend: str, cuda: bool, everyone: list) -> None:
    from plscale.predict.context_parallel import attention_work, imbalance

    WALL, COMP, USER, SYS = range(4)

    def ranks_of(method: str) -> range:
        return range(1) if method == "one rank" else range(cp)

    def calls(seq: int, method: str) -> list:
        """Per timed call, the tuple of each taking-part rank's (wall, compute, user, sys)."""
        return list(zip(*(everyone[r][1][(seq, method)] for r in ranks_of(method))))

    def step(seq: int, method: str) -> float:  # median over calls of the slowest rank
        return statistics.median(max(rank[WALL] for rank in call) for call in calls(seq, method))

    def spread(seq: int, method: str, kind: int) -> float:  # median over calls of max/min over ranks
        return statistics.median(max(rank[kind] for rank in call) / min(rank[kind] for rank in call)
                                 for call in calls(seq, method))

    def rank_ms(seq: int, method: str, kind: int) -> str:
        return "/".join(f"{1e3 * statistics.median(call[r][kind] for call in calls(seq, method)):.0f}"
                        for r in ranks_of(method))

    def sys_share(seq: int, method: str) -> str:
        got = [rank for call in calls(seq, method) for rank in call]
        total = sum(rank[USER] + rank[SYS] for rank in got)
        return f"{sum(rank[SYS] for rank in got) / total:8.0%}" if total else f"{'-':>8}"

    def memory(seq: int, method: str) -> tuple[int, int]:  # the largest rank's saved and peak bytes
        return tuple(max(everyone[r][0][(seq, method)][i] for r in ranks_of(method)) for i in (0, 1))

    where = "cuda, bfloat16" if cuda else "cpu, float32, 1 thread per rank"
    print(f"\ncausal attention, forward + backward: batch {args.batch} x {args.heads} heads x head_dim "
          f"{args.head_dim}, {where}; cp {cp} over {cp} {backend} ranks; median of every timed call "
          f"({args.rounds} rounds of {', '.join(f'{reps(args, seq)} at {seq}' for seq in args.seqs)})")
    print(f"  {'seq':>5}  {'method':12}{'step ms':>9}{'vs one rank':>13}{'wall max/min':>14}"
          f"{'comp max/min (pred)':>21}{'sys CPU':>9}   ms per rank: wall (compute)")
    for seq in args.seqs:
        one = step(seq, "one rank")
        for method in METHODS:
            t = step(seq, method)
            wall = comp = "-"
            detail = rank_ms(seq, method, WALL)
            if method != "one rank":
                wall = f"{spread(seq, method, WALL):.2f}"
            if method.startswith("ring"):
                work = imbalance(attention_work(seq, cp, method.split()[1]))
                comp = f"{spread(seq, method, COMP):.2f} ({work:.2f})"
                detail += f" ({rank_ms(seq, method, COMP)})"
            print(f"  {seq:5}  {method:12}{1e3 * t:9.1f}{one / t:12.2f}x{wall:>14}{comp:>21}"
                  f"{sys_share(seq, method)}   {detail}")
    print("  step: the slowest rank's wall time; vs one rank: one rank's step over the method's (above 1x: "
          "faster);\n  comp: ring_attention.TALLY.compute_seconds, (pred): attention_work's max/min (scores that "
          "count); sys CPU: the kernel's share\n  of the taking-part ranks' CPU seconds (page faults, gloo's sockets)")
    peak_how = ("torch.cuda.max_memory_allocated delta" if cuda
                else "live tensor bytes from torch.profiler's allocations and frees")
    print(f"\n  memory per rank, the largest rank: saved for backward (saved_activations), and the peak during "
          f"forward + backward above the inputs ({peak_how})")
    print(f"  {'seq':>5}  {'method':12}{'saved MiB':>11}{'vs one':>8}{'peak MiB':>10}{'vs one':>8}")
    for seq in args.seqs:
        one_saved, one_peak = memory(seq, "one rank")
        for method in METHODS:
            saved, peak = memory(seq, method)
            print(f"  {seq:5}  {method:12}{saved / MiB:11.1f}{saved / one_saved:7.2f}x{peak / MiB:10.1f}"
                  f"{peak / one_peak:7.2f}x")
    if args.rounds > 1:
        print("\n  step ms per round (median of the round's calls):")
        for seq in args.seqs:
            n = reps(args, seq)
            print(f"  {seq:5}  " + "   ".join(
                f"{method} " + ", ".join(f"{1e3 * statistics.median(max(rank[WALL] for rank in call) for call in got[i:i + n]):.0f}"
                                         for i in range(0, len(got), n))
                for method in METHODS for got in [calls(seq, method)]))


def launch(args) -> int:
    """Re-run this file under torchrun on --cp ranks (CPU over gloo unless --cp GPUs are visible)."""
    import torch

    from plscale.hardware import free_port

    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    if torch.cuda.device_count() < args.cp:
        env.update(DS_ACCELERATOR="cpu", CUDA_VISIBLE_DEVICES="")
    argv = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(args.cp), "--master_port",
            str(free_port()), __file__, "--ranks", "--seqs", *map(str, args.seqs), "--cp", str(args.cp),
            "--heads", str(args.heads), "--head-dim", str(args.head_dim), "--batch", str(args.batch),
            "--rounds", str(args.rounds)]
    return subprocess.run(argv, env=env).returncode


def main() -> None:
    args = parse()
    if args.ranks:
        ranks(args)
        return
    start = time.perf_counter()
    with Others() as others:
        code = launch(args)
    if code:
        sys.exit(f"the {args.cp}-rank run failed (exit {code})")
    print(f"  other processes used {100 * others.share:.0f}% of the machine's CPU meanwhile; "
          f"{time.perf_counter() - start:.0f} s in all")


if __name__ == "__main__":
    main()
