"""What one CPU rank reaches while N run at once: the figures `plscale plan --here` plans with.

Each of the N processes (one thread each, as the labs run them on CPU) times, all N at once:
- the dense Llama's forward and backward on its micro-batch and on 2 tokens:
  the FLOP/s are a rank's share of the machine under the load of N ranks, and what is left of
  the time at no FLOPs is the fixed cost of a layer (its operators' dispatch);
- torch's AdamW step on a flat fp32 parameter: seconds a parameter (the optimizer term);
- gloo's collectives over all N: a large all-reduce gives the bus bandwidth, a small one the
  latency a ring step (plscale.predict.busbw's factors); a large reduce-scatter and all-gather,
  as ZeRO issues them (gloo runs each its own way, not at the all-reduce's rate);
- a point-to-point exchange round a ring of all N (each rank isend to the next, irecv from the
  previous, as ring attention and the pipeline's sends do): the latency of one hop.
Rank 0 writes them as JSON for the host (plscale.run.machine starts the N processes), which
turns them into a cluster (plscale.predict.cluster.cpu_ranks).

    python -m plscale.rank.calibrate --rank R --world N --port P --out machine.json \
        --config '{"vocab": 2048, ...}' --micro-batch 2 --seq 64           # one process of N
"""

import argparse
import json
import os
import statistics
import sys
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from plscale.predict.busbw import bus_factor
from plscale.predict.presets import ModelConfig
from plscale.predict.recompute import step_flops
from plscale.rank.models.llama import Llama

LARGE, SMALL = 8 * 2**20, 4 * 2**10   # collective bytes: bandwidth, latency
OPTIMIZER_PARAMS = 2**20              # AdamW's step timed on one flat parameter of this many


def _timed(fn, seconds: float) -> float:
    """Seconds a call of fn, the median of the calls that fit in `seconds` (at least 3)."""
    times, start = [], time.perf_counter()
    while len(times) < 3 or time.perf_counter() - start < seconds:
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def model_step(config: ModelConfig, micro_batch: int, seq: int, seconds: float) -> tuple[float, float]:
    """(FLOP/s, seconds a layer) of the dense model's forward and backward: timed on [micro_batch,
    seq] tokens and on [1, 2], so t = overhead + flops / rate (step_flops: the count the planner
    divides by the rate) splits into a rate and a fixed cost a micro-batch, spread over the layers:
    the dispatch of every operator, whatever its size, which a rank of a tp or cp group pays in
    full on its smaller matrices. When the two timings do not split (noise), all of it is rate."""
    torch.manual_seed(0)
    model = Llama(config)
    timed = {}
    for b, s in ((micro_batch, seq), (1, 2)):
        tokens = torch.randint(0, config.vocab, (b, s))

        def step():
            model(tokens, tokens).backward()

        step()   # warm-up: allocations, the first dispatch
        timed[step_flops(config, s).total * b * s] = _timed(step, seconds / 2)
    (big, t_big), (small, t_small) = timed.items()
    if t_big <= t_small or small >= big:
        return big / t_big, 0.0
    rate = (big - small) / (t_big - t_small)
    overhead = t_big - big / rate
    if overhead <= 0:
        return big / t_big, 0.0
    return rate, overhead / config.layers


def optimizer_seconds(seconds: float) -> float:
    """Seconds a parameter of torch's AdamW step (its default, foreach), fp32 master and moments."""
    param = torch.nn.Parameter(torch.randn(OPTIMIZER_PARAMS))
    param.grad = torch.randn(OPTIMIZER_PARAMS)
    opt = torch.optim.AdamW([param], lr=1e-3)
    opt.step()   # warm-up: the moments are allocated on the first step
    return _timed(opt.step, seconds) / OPTIMIZER_PARAMS


def _in_step(fn, calls: int) -> float:
    """Seconds a call of a communication fn: the mean of `calls` after a warm-up and a barrier, the
    same count on every rank (one rank's clock over its own calls would pair them with another's)."""
    fn()
    dist.barrier()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls


def collective_seconds(op: str, nbytes: int, calls: int) -> float:
    """Seconds a collective of nbytes over every rank: the all-reduce's buffer; the reduce-scatter's
    input and the all-gather's output, as lists of per-rank pieces as ZeRO passes them."""
    world = dist.get_world_size()
    x = torch.ones(nbytes // 4 // world * world)   # equal pieces on any number of ranks
    pieces = list(x.chunk(world))
    mine = pieces[0].clone()
    call = {"all_reduce": lambda: dist.all_reduce(x),
            "reduce_scatter": lambda: dist.reduce_scatter(mine, pieces),
            "all_gather": lambda: dist.all_gather(pieces, mine)}[op]
    return _in_step(call, calls)


def hop_seconds(nbytes: int, calls: int) -> float:
    """Seconds one hop round a ring of every rank: isend to the next, irecv from the previous, wait
    for both (ring attention's exchange of a block; a pipeline's send to the next stage)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    out, into = torch.ones(nbytes // 4), torch.empty(nbytes // 4)

    def hop():
        for request in (dist.isend(out, (rank + 1) % world), dist.irecv(into, (rank - 1) % world)):
            request.wait()

    return _in_step(hop, calls)


def measure(rank: int, world: int, port: int, out: str, config: dict, micro_batch: int, seq: int,
            seconds: float) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=120))   # a peer that never came: fail, not hang
    dist.barrier()
    flops, layer_s = model_step(ModelConfig(**config), micro_batch, seq, seconds)
    adam = optimizer_seconds(seconds / 2)
    dist.barrier()
    times = {"large": collective_seconds("all_reduce", LARGE, 5), "small": collective_seconds("all_reduce", SMALL, 20),
             "reduce_scatter": collective_seconds("reduce_scatter", LARGE, 5),
             "all_gather": collective_seconds("all_gather", LARGE, 5), "hop": hop_seconds(SMALL, 20)}
    everyone = [None] * world
    dist.all_gather_object(everyone, (flops, adam, times, layer_s))
    if rank == 0:   # the median rank's FLOP/s and AdamW (the ranks share the cores: one rank's draw is noise)
        slowest = {k: max(t[k] for _, _, t, _ in everyone) for k in times}   # a collective ends with its last rank
        steps = 2 * (world - 1)   # an all-reduce's ring steps (busbw.bus_factor: 2 (n - 1) / n)
        Path(out).write_text(json.dumps({
            "flops": statistics.median(f for f, *_ in everyone),
            "layer_overhead_us": statistics.median(o for *_, o in everyone) * 1e6,
            "busbw_gbs": LARGE * bus_factor("all_reduce", world) / slowest["large"] / 1e9,
            "latency_us": slowest["small"] / steps * 1e6,
            "collective_gbs": {op: LARGE * bus_factor(op, world) / slowest[op] / 1e9
                               for op in ("reduce_scatter", "all_gather")},
            "p2p_latency_us": slowest["hop"] * 1e6,
            "optimizer_ns": statistics.median(a for _, a, *_ in everyone) * 1e9,
            "flops_per_rank": [f for f, *_ in everyone]}))
    dist.barrier()   # no rank tears its connections down while a peer still uses them
    dist.destroy_process_group()


def main() -> None:
    ap = argparse.ArgumentParser(description="One of N CPU ranks measuring this machine (module doc).")
    for name, kind in (("--rank", int), ("--world", int), ("--port", int), ("--out", str), ("--config", str),
                       ("--micro-batch", int), ("--seq", int)):
        ap.add_argument(name, type=kind, required=True)
    ap.add_argument("--seconds", type=float, default=1.0, help="timing of the model's step, per rank")
    a = ap.parse_args()
    measure(a.rank, a.world, a.port, a.out, json.loads(a.config), a.micro_batch, a.seq, a.seconds)
    sys.stdout.flush()
    os._exit(0)   # skip interpreter teardown, where gloo's threads have aborted a rank that had finished


if __name__ == "__main__":
    main()
