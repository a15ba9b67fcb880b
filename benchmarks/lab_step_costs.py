"""What the ZeRO lab (labs/04_zero/train.py) does each step besides forward, backward and
step, timed call by call on 2 CPU ranks over gloo:

    torchrun --nproc_per_node 2 benchmarks/lab_step_costs.py           (OMP_NUM_THREADS=1)
    torchrun --nproc_per_node 2 benchmarks/lab_step_costs.py --calls 2000

    loss_sum += loss.detach().float()        per micro-batch
    dist.all_reduce(loss_sum); .item()       per step: a scalar collective, a sync point
    ctx.metrics.step(...)                     per step: one JSON line to metrics.jsonl (rank 0)
    ctx.metrics.progress(...)                 per step: one PLSCALE_PROGRESS line on stdout (rank 0)

Prints the median and 90th percentile microseconds per call on rank 0, and what each is
worth against a step of the lab (`--step-ms`, about 560 ms for ZeRO-2 on 2 CPU ranks).
The collective is timed with both ranks arriving together (a barrier first), which is its
own cost; inside the lab a rank that arrives first also waits for the other, but the
next collective inside engine.step() would make it wait anyway.
"""

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist


def timed(fn, calls: int, barrier: bool = False) -> list[float]:
    out = []
    for _ in range(calls):
        if barrier:
            dist.barrier()
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=500)
    parser.add_argument("--step-ms", type=float, default=560.0)
    args = parser.parse_args()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    dist.init_process_group("gloo")
    rank = dist.get_rank()

    from plscale.rank.metrics import Metrics

    run_dir = Path(tempfile.mkdtemp(prefix="step-costs-"))
    os.environ["PLSCALE_CLI"] = "1"  # progress as under `plscale lab run`: a JSON line per step
    metrics = Metrics(run_dir, rank)
    devnull = open(os.devnull, "w")
    loss = torch.tensor(5.0, requires_grad=True) * 1.0
    loss_sum = torch.zeros(())

    def accumulate():
        loss_sum.add_(loss.detach().float())

    def reduce_item():
        t = loss_sum.clone()
        dist.all_reduce(t)
        return t.item()

    step = [0]

    def metrics_step():
        step[0] += 1
        metrics.step(step=step[0], loss=5.123456789, step_time_s=0.56789, tokens_per_s=3606.123)

    def progress():
        stdout, sys.stdout = sys.stdout, devnull
        try:
            metrics.progress("ZeRO-2", step[0], 60, "loss 5.1235")
        finally:
            sys.stdout = stdout

    costs = {"loss_sum += loss (per micro-batch)": timed(accumulate, args.calls),
             "all_reduce(loss_sum) + .item()": timed(reduce_item, args.calls, barrier=True),
             "metrics.step (rank 0)": timed(metrics_step, args.calls),
             "metrics.progress (rank 0, to /dev/null)": timed(progress, args.calls)}
    metrics.close()
    if rank == 0:
        print(f"{'per call, microseconds':42}{'median':>9}{'p90':>9}{'% of a step':>13}")
        for name, ts in costs.items():
            ts = sorted(ts)
            med, p90 = statistics.median(ts) * 1e6, ts[int(0.9 * len(ts))] * 1e6
            print(f"{name:42}{med:9.1f}{p90:9.1f}{100 * med / (args.step_ms * 1e3):12.3f}%")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
