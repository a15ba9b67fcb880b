"""What one CPU rank reaches while N run at once: the figures `plscale plan --here` plans with.

Each of the N processes (one thread each, as the labs run them on CPU) times the dense Llama's
forward and backward on its micro-batch, all N at once, so the FLOP/s are a rank's share of the
machine under the load of N ranks; then gloo's all-reduce over all N: a large message gives the
bus bandwidth, a small one the latency a ring step (plscale.predict.busbw's factors). Rank 0
writes them as JSON for the host (plscale.run.machine starts the N processes), which turns them
into a cluster (plscale.predict.cluster.cpu_ranks).

    python -m plscale.rank.calibrate --rank R --world N --port P --out machine.json \
        --config '{"vocab": 2048, ...}' --micro-batch 2 --seq 64           # one process of N
"""

import argparse
import json
import statistics
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from plscale.predict.busbw import bus_factor
from plscale.predict.presets import ModelConfig
from plscale.predict.recompute import step_flops
from plscale.rank.models.llama import Llama

LARGE, SMALL = 8 * 2**20, 4 * 2**10   # all-reduce bytes: bandwidth, latency


def _timed(fn, seconds: float) -> float:
    """Seconds a call of fn, the median of the calls that fit in `seconds` (at least 3)."""
    times, start = [], time.perf_counter()
    while len(times) < 3 or time.perf_counter() - start < seconds:
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def model_step(config: ModelConfig, micro_batch: int, seq: int, seconds: float) -> float:
    """FLOP/s of the dense model's forward and backward on [micro_batch, seq] tokens (step_flops:
    the count the planner divides by them)."""
    torch.manual_seed(0)
    model = Llama(config)
    tokens = torch.randint(0, config.vocab, (micro_batch, seq))

    def step():
        model(tokens, tokens).backward()

    step()   # warm-up: allocations, the first dispatch
    return step_flops(config, seq).total * micro_batch * seq / _timed(step, seconds)


def all_reduce_seconds(nbytes: int, calls: int) -> float:
    """Seconds an all-reduce of nbytes over every rank: the mean of `calls`, the same count on every
    rank (a collective each rank timed by its own clock would pair one rank's call with another's)."""
    x = torch.ones(nbytes // 4)
    dist.all_reduce(x)
    dist.barrier()
    start = time.perf_counter()
    for _ in range(calls):
        dist.all_reduce(x)
    return (time.perf_counter() - start) / calls


def measure(rank: int, world: int, port: int, out: str, config: dict, micro_batch: int, seq: int,
            seconds: float) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=120))   # a peer that never came: fail, not hang
    dist.barrier()
    flops = model_step(ModelConfig(**config), micro_batch, seq, seconds)
    dist.barrier()
    large, small = all_reduce_seconds(LARGE, 5), all_reduce_seconds(SMALL, 20)
    everyone = [None] * world
    dist.all_gather_object(everyone, (flops, large, small))
    if rank == 0:   # the median rank's FLOP/s (the ranks share the cores: one rank's draw is noise)
        steps = 2 * (world - 1)   # an all-reduce's ring steps (busbw.bus_factor: 2 (n - 1) / n)
        Path(out).write_text(json.dumps({
            "flops": statistics.median(f for f, _, _ in everyone),
            "busbw_gbs": LARGE * bus_factor("all_reduce", world) / max(t for _, t, _ in everyone) / 1e9,
            "latency_us": max(t for *_, t in everyone) / steps * 1e6,
            "flops_per_rank": [f for f, _, _ in everyone]}))
    dist.destroy_process_group()


def main() -> None:
    ap = argparse.ArgumentParser(description="One of N CPU ranks measuring this machine (module doc).")
    for name, kind in (("--rank", int), ("--world", int), ("--port", int), ("--out", str), ("--config", str),
                       ("--micro-batch", int), ("--seq", int)):
        ap.add_argument(name, type=kind, required=True)
    ap.add_argument("--seconds", type=float, default=1.0, help="timing of the model's step, per rank")
    a = ap.parse_args()
    measure(a.rank, a.world, a.port, a.out, json.loads(a.config), a.micro_batch, a.seq, a.seconds)


if __name__ == "__main__":
    main()
