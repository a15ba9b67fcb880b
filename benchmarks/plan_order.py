"""Does `plscale plan`'s order hold on this machine? Validation (b) of plscale/predict/plan.py,
and (a), the published layouts, printed as a table.

    .venv/bin/python benchmarks/plan_order.py                 # measure, plan, run top 2 and bottom 2
    .venv/bin/python benchmarks/plan_order.py --runs 0        # measure and plan only
    .venv/bin/python benchmarks/plan_order.py --published     # only the published layouts (pure, seconds)

1. Describes this machine as a one-node cluster of 4 "GPUs" (4 CPU processes over gloo, one
   thread each, as the labs run): a fp32 matmul of the small model's shapes on all 4 ranks at
   once gives the peak FLOP/s per rank; a gloo all-reduce of 8 MiB the bus bandwidth, one of
   4 KiB the latency a ring step. On a 2-core machine the 4 ranks share 2 cores: the peak is
   what each gets while the others run too, and communication competes with compute.
2. Plans preset small (seq 128, 32 sequences a step, fp32, efficiency 1: the measured peak is
   already what a matmul of these shapes reaches) on that cluster, with no overlap of
   communication and compute (gloo's threads and the matmuls share the same cores).
3. Runs the candidates the labs can run (ZeRO lab, dp 4, stages 0-3; tensor-parallel lab, tp 2 x
   dp 2 and tp 4; pipeline lab, pp 2 x dp 2 and pp 4), the top and bottom ones by prediction,
   with `plscale lab run ... --cpu`, and compares the measured median step time (metrics.jsonl
   step_time_s, the first 3 steps left out) with the prediction: does the predicted order hold?
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from plscale.predict.cluster import GiB, gpu
from plscale.predict.plan import Job, plan
from plscale.predict.presets import PRESETS
from plscale.predict.published import PUBLISHED, SHAPES

RANKS, SEQ, BATCH = 4, 128, 32


def _measure(rank: int, port: int, out: str) -> None:
    import torch
    import torch.distributed as dist
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=RANKS)
    c = PRESETS["small"]
    a, b = torch.randn(4 * SEQ, c.hidden), torch.randn(c.hidden, c.ffn)
    for _ in range(3):
        a @ b
    dist.barrier()
    start, n = time.perf_counter(), 0
    while time.perf_counter() - start < 2.0:
        a @ b
        n += 1
    flops = 2 * a.shape[0] * a.shape[1] * b.shape[1] * n / (time.perf_counter() - start)
    times = {}
    for size in (4 * 2**10, 8 * 2**20):
        x = torch.ones(size // 4)
        dist.all_reduce(x)
        dist.barrier()
        start = time.perf_counter()
        for _ in range(10):
            dist.all_reduce(x)
        times[size] = (time.perf_counter() - start) / 10
    gathered = [None] * RANKS
    dist.all_gather_object(gathered, flops)
    if rank == 0:
        Path(out).write_text(json.dumps({"flops": statistics.mean(gathered), "times": times}))
    dist.destroy_process_group()


def measure_machine() -> dict:
    import torch.multiprocessing as mp

    from plscale.hardware import free_port
    with tempfile.TemporaryDirectory() as tmp:
        out = str(Path(tmp) / "m.json")
        mp.spawn(_measure, args=(free_port(), out), nprocs=RANKS)
        m = json.loads(Path(out).read_text())
    small, big = float(m["times"]["4096"]), float(m["times"][str(8 * 2**20)])
    steps = 2 * (RANKS - 1)
    busbw = 8 * 2**20 * steps / RANKS / big / 1e9
    meminfo = Path("/proc/meminfo").read_text().splitlines()
    available = int(next(line.split()[1] for line in meminfo if line.startswith("MemAvailable"))) * 1024
    return {"tflops": m["flops"] / 1e12, "busbw_gbs": busbw, "latency_us": small / steps * 1e6,
            "memory_gib": available / RANKS / GiB}


def lab_command(c) -> list[str] | None:
    """The `plscale lab run` arguments that run candidate c, or None when no lab runs it."""
    accum = [f"ds.micro_batch={c.micro_batch}", f"ds.grad_accum={c.micro_batches}"]
    if c.recompute != "none" or c.cp != 1 or c.virtual != 1:
        return None
    if (c.tp, c.pp) == (1, 1) and c.dp == 4:
        return ["zero", *sets([f"ds.stage={c.zero}", *accum])]
    if c.zero != 0:
        return None
    if c.pp == 1 and c.tp in (2, 4):
        return ["tp", "--variant", "tp-dp", *sets([f"parallel.tp={c.tp}", *accum])]
    if c.tp == 1 and c.pp in (2, 4):
        variant = "pp-dp" if c.dp > 1 else "1f1b"
        return ["pipeline", "--variant", variant, *sets([f"parallel.pp={c.pp}", "model.preset=small",
                                                        f"bubble.micro_batches=[{c.micro_batches}]", "bubble.steps=2", *accum])]
    return None


def sets(items: list[str]) -> list[str]:
    return [x for item in items for x in ("--set", item)]


def measured_step(args: list[str], steps: int) -> tuple[float | None, str]:
    with tempfile.TemporaryDirectory() as runs:
        cmd = [str(ROOT / ".venv/bin/plscale"), "lab", "run", *args, "--gpus", str(RANKS), "--cpu", "--steps", str(steps)]
        done = subprocess.run(cmd, check=False, cwd=ROOT, capture_output=True, text=True,
                              env={**os.environ, "PLSCALE_RUNS_DIR": runs, "HF_HUB_OFFLINE": "1"})
        metrics = list(Path(runs).glob("*/metrics.jsonl"))
        if done.returncode or not metrics:
            return None, (done.stderr or done.stdout).strip().splitlines()[-1:][0] if (done.stderr or done.stdout) else "?"
        times = [json.loads(line).get("step_time_s") for line in metrics[0].read_text().splitlines()]
        times = [t for t in times if t is not None][3:]
        return (statistics.median(times) if times else None), " ".join(cmd[1:]).replace(str(ROOT) + "/", "")


def published_table() -> None:
    print("validation (a): published layouts, cp fixed as published (ranked among the best of each layout)")
    print(f"{'run':40} {'layout dp/tp/pp/cp':>19} {'rank':>9} {'vs best':>8} {'pred. MFU':>9} {'paper MFU':>9}")
    for p in PUBLISHED:
        result = plan(Job(SHAPES[p.model], p.gpus, p.seq, p.global_batch, fixed=(("cp", p.cp),)), gpu(p.gpu))
        best, rank = result.best_per_layout(), result.rank_of(p.layout)
        mine = best[rank - 1]
        free = plan(Job(SHAPES[p.model], p.gpus, p.seq, p.global_batch), gpu(p.gpu)).rank_of(p.layout)
        peak = gpu(p.gpu).peak("bf16") / 1e12
        print(f"{p.name:40} {'/'.join(map(str, p.layout)):>19} {rank:>3} of {len(best):<3} "
              f"{mine.step_s / best[0].step_s - 1:>+7.1%} {mine.mfu:>9.1%} {p.tflops_per_gpu / peak:>9.1%}"
              f"   (cp free: rank {free})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=4, help="Lab runs: half from the top, half from the bottom.")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--published", action="store_true", help="Only print validation (a).")
    a = ap.parse_args()
    published_table()
    if a.published:
        return
    m = measure_machine()
    print(f"\nthis machine as {RANKS} ranks ({os.cpu_count()} cores): {m['tflops'] * 1e3:.1f} GFLOP/s a rank "
          f"(fp32 matmul, all ranks at once), all-reduce busbw {m['busbw_gbs']:.2f} GB/s, "
          f"{m['latency_us']:.0f} us a ring step, {m['memory_gib']:.1f} GiB a rank")
    cluster = replace(gpu(None, m["memory_gib"], m["tflops"], m["busbw_gbs"], m["busbw_gbs"], RANKS),
                      name="this machine", intra_latency_us=m["latency_us"], inter_latency_us=m["latency_us"])
    result = plan(Job(PRESETS["small"], RANKS, SEQ, BATCH, precision="fp32", efficiency=1.0, overlap=False), cluster)
    runnable = {}
    for c in result.ranked:   # the fastest of each layout and ZeRO stage a lab runs
        args = lab_command(c)
        if args and (c.layout, c.zero) not in runnable:
            runnable[(c.layout, c.zero)] = (tuple(args), c)
    order = list(runnable.values())
    print(f"{len(result.ranked)} configurations fit; {len(order)} of them a lab runs:")
    for i, (args, c) in enumerate(order, 1):
        print(f"  #{i} dp {c.dp} tp {c.tp} pp {c.pp} zero {c.zero} micro {c.micro_batch} x {c.micro_batches}: "
              f"predicted {c.step_s:.3f} s   " + " ".join(args))
    if a.runs <= 0:
        return
    half = max(1, a.runs // 2)
    chosen = order[:half] + [x for x in order[-half:] if x not in order[:half]]
    rows = []
    for args, c in chosen:
        seconds, note = measured_step(list(args), a.steps)
        rows.append((c, seconds, note))
        print(f"  ran {'/'.join(map(str, c.layout))} zero {c.zero}: predicted {c.step_s:.3f} s, measured "
              f"{'failed' if seconds is None else f'{seconds:.3f} s'}   {note}", flush=True)
    done = [(c, s) for c, s, _ in rows if s is not None]
    pairs = [(x, y) for i, x in enumerate(done) for y in done[i + 1:]]
    agree = sum((x[0].step_s < y[0].step_s) == (x[1] < y[1]) for x, y in pairs)
    print(f"\npredicted order held for {agree} of {len(pairs)} pairs; "
          f"measured/predicted: {', '.join(f'{s / c.step_s:.2f}' for c, s in done)}")


if __name__ == "__main__":
    main()
