"""The tensor-parallel training paths side by side: plscale's hand-written layers, PyTorch
DTensor, DeepSpeed AutoTP and megatron-core, on the same model, weights, batches and ranks;
and what the hand-written layers cost at tp=1 against the dense Llama.

    python benchmarks/tensor_parallel_paths.py [--preset small] [--seq 128] [--steps 8] [--interleave 2]
    python benchmarks/tensor_parallel_paths.py --tp1-only    (part 2 alone; on cuda where present)

1. Paths (tp 2 over 2 ranks; the script re-launches itself under torchrun, 1 thread per
   rank; DS_ACCELERATOR=cpu and gloo unless 2 GPUs are visible). Every path is
   `plscale.strategies.tensor_parallel.side_by_side.run`, as in lab 07: it starts from the dense
   Llama's initial weights (torch.manual_seed(0)), trains --steps AdamW steps (the lab's
   DeepSpeed config: ZeRO 0, fp32, micro batch 4, lr 1e-3, no clipping) on the same random
   token batches (one seeded generator per step, the same on both ranks of the group), and
   returns its losses and its median step time over the steps after the first. Paths:
     hand-written  TensorParallelLlama (labs' Megatron layers), torch AdamW
     dtensor       parallelize_module: Colwise/Rowwise (+ SequenceParallel), torch AdamW
     autotp        deepspeed.initialize with tensor_parallel.autotp_size 2, DeepSpeed's step
     megatron      TensorParallelLlama on megatron-core's Column/RowParallelLinear (skipped,
                   with the reason, when megatron-core is absent)
   each without and with sequence parallelism (sp: hand-written and dtensor only; AutoTP
   splits layers, not sequences; megatron-core's sp needs CUDA). The rows run --interleave
   rounds, forward order then reversed, so slow spells fall on every path alike; per row the
   median over rounds of the slowest rank's step time. Ratio: step time over hand-written's
   at the same sp. Loss gap: the largest relative gap to hand-written (no sp) over every step
   of every round; above 1e-5 the row says FAIL. CPU ms: the CPU seconds of both ranks'
   processes per step (every thread, gloo's included; median over steps after the first, then
   over rounds), which other processes on the machine move much less than the step time.
2. tp=1: the dense `Llama` against `TensorParallelLlama` on a 1-rank group (its collectives
   on one rank, its fused qkv / gate_up, its vocabulary-parallel loss) in one process
   (cuda when available, else cpu with 1 thread, as each rank), the same loop, weights and
   batches, alternating for --interleave rounds; tokens/s each and their ratio.

Measured on this machine (2 CPU cores, 2026-11-23), `--interleave 3` (otherwise the
defaults: 'small', vocab 8192, hidden 256, 4 layers; seq 128, micro batch 4, 512 tokens per
step, 8 steps), with the machine otherwise idle (other processes: 0% of the CPU):

    path            sp   step ms  tokens/s  vs hand-written   loss gap   CPU ms  CPU vs h-w
    hand-written    no     250.5      2044            1.00x    0.0e+00      428       1.00x
    dtensor         no     353.2      1450            1.41x    1.1e-07      612       1.43x
    autotp          no     350.4      1461            1.40x    2.1e-07      591       1.38x
    megatron        no     235.6      2173            0.94x    0.0e+00      409       0.95x
    hand-written   yes     273.3      1873            1.00x    0.0e+00      450       1.00x
    dtensor        yes     401.5      1275            1.48x    2.1e-07      709       1.60x
    autotp         yes   skipped: DeepSpeed AutoTP splits layers, not sequences
    megatron       yes   skipped: megatron-core sequence parallelism needs CUDA

    tp=1, one process on cpu, 1 thread:
    model            step ms  tokens/s  vs dense   CPU ms  CPU vs dense
    dense              307.2      1666     1.00x      310         1.00x
    tp=1 layers        310.1      1651     1.01x      312         1.01x

A second idle run gave the same ratios within 0.07 (megatron 1.01x, autotp 1.42x); with
other processes taking 40% of the CPU, single rounds swung up to 2x, the CPU columns much
less. Every path's losses agree with hand-written's within 2.1e-7 (tolerance 1e-5).
megatron-core's layers cost what the hand-written ones do (0.94-1.01x); AutoTP (which
all-reduces q, k, v, gate and up separately in backward) and DTensor (its dispatch on every
op) about 1.4x. Sequence parallelism costs 1.1x on CPU, where nothing overlaps the extra
calls. The parallel layers at tp=1 cost 1% over the dense Llama. On 2 shared cores the two
1-thread ranks and gloo's collectives compete for the same cores: on GPUs (NCCL) the
picture differs.
"""

import argparse
import copy
import logging
import os
import statistics
import subprocess
import sys
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from run_watch import Others  # noqa: E402

PATHS = ("hand-written", "dtensor", "autotp", "megatron")
ROWS = [(name, sp) for sp in (False, True) for name in PATHS]
MICRO, SEED, TOLERANCE = 4, 0, 1e-5


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--preset", default="small")
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--interleave", type=int, default=2, metavar="ROUNDS",
                        help="rounds of every path, in alternating order; the median per path is reported")
    parser.add_argument("--tp1-only", action="store_true", help="only the tp=1 overhead, in this process")
    parser.add_argument("--ranks", action="store_true", help=argparse.SUPPRESS)  # set by the re-launch
    args = parser.parse_args()
    if args.steps < 2:
        parser.error("--steps: 2 or more (the first step is a warm-up, left out of the time)")
    return args


def quiet() -> None:
    warnings.filterwarnings("ignore")
    for name in ("DeepSpeed", "deepspeed", "torch.distributed"):
        logging.getLogger(name).setLevel(logging.ERROR)


def model_config(name: str, tp: int):
    from plscale.predict.presets import preset

    config = preset(name)
    return config.with_vocab(-(-config.vocab // tp) * tp)  # Megatron pads the vocabulary to a multiple of tp


def batches(config, seq: int, device):
    """batch(step): one micro-batch of random tokens, the same for every path and rank."""
    import torch

    def batch(step: int) -> list:
        gen = torch.Generator().manual_seed(1000 + step)
        block = torch.randint(0, config.vocab, (MICRO, seq + 1), generator=gen)
        return [(block[:, :-1].to(device), block[:, 1:].to(device))]
    return batch


def gap(losses: list, base: list) -> float:
    return max(abs(a - b) / abs(b) for a, b in zip(losses, base))


# ---- 1. The paths, inside each rank -------------------------------------------------------
def ranks(args) -> None:
    quiet()
    import torch
    import torch.distributed as dist

    from plscale.dsconfig.spec import DSSpec, build
    from plscale.rank import distributed
    from plscale.rank.mesh import Mesh
    from plscale.rank.models.llama import Llama
    from plscale.strategies.tensor_parallel import side_by_side

    d = distributed.init()
    T = d.world_size
    mesh = Mesh.build(tp=T, dims=("tp", "dp", "pp"))
    config = model_config(args.preset, T)
    seq = min(args.seq, config.max_seq)
    ds = build(DSSpec(stage=0, precision="fp32", micro_batch=MICRO, grad_accum=1, lr=1e-3, grad_clip=0,
                      world_size=mesh.size("dp")))  # train_batch_size counts data-parallel ranks only
    torch.manual_seed(SEED)
    initial = copy.deepcopy(Llama(config).state_dict())
    tokens_of = batches(config, seq, d.device)
    marks = []  # this process's CPU seconds as each step begins: side_by_side.run calls batch(k) first thing

    def batch(step: int) -> list:
        marks.append(time.process_time())
        return tokens_of(step)
    said, skipped = [], {}  # skipped: row -> why side_by_side cannot run it here

    def log(line: str) -> None:
        if d.rank == 0 and line not in said:
            print(line, flush=True)
        said.append(line)

    times, cpu = {row: [] for row in ROWS}, {row: [] for row in ROWS}
    losses = {row: [] for row in ROWS}
    for r in range(args.interleave):
        order = ROWS if r % 2 == 0 else ROWS[::-1]
        for name, sp in order:
            if (name, sp) in skipped:
                continue
            reason = side_by_side.why_not(name, sp)
            if reason:
                skipped[(name, sp)] = reason
                continue
            log(f"round {r + 1}/{args.interleave}: {name}{' + sp' if sp else ''} ...")
            marks.clear()
            path_losses, step_s = side_by_side.run(name, config, initial, mesh, ds, sp, batch, args.steps, d.device)
            marks.append(time.process_time())
            slowest = torch.tensor([step_s], dtype=torch.float64)
            dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
            times[(name, sp)].append(slowest.item())
            spent = torch.tensor([statistics.median(b - a for a, b in zip(marks[1:], marks[2:]))], dtype=torch.float64)
            dist.all_reduce(spent)  # CPU seconds per step, both ranks (every thread: gloo's too)
            cpu[(name, sp)].append(spent.item())
            losses[(name, sp)].append(path_losses)
    if d.rank == 0:
        report(args, seq, T, d.backend, times, cpu, losses, skipped)
    distributed.shutdown()


def report(args, seq: int, T: int, backend: str, times: dict, cpu: dict, losses: dict, skipped: dict) -> None:
    tokens = MICRO * seq
    med = {row: statistics.median(t) for row, t in times.items() if t}
    cpu = {row: statistics.median(c) for row, c in cpu.items() if c}
    base_losses = losses[("hand-written", False)][0]
    print(f"\ntensor-parallel paths, '{args.preset}' Llama, tp {T} on {T} {backend} ranks, {tokens} tokens per step "
          f"(micro batch {MICRO} x seq {seq}), {args.steps} steps from the same weights; median over "
          f"{args.interleave} rounds of each path's median step (steps 2-{args.steps}, slowest rank)")
    print(f"  {'path':14}{'sp':>4}{'step ms':>10}{'tokens/s':>10}{'vs hand-written':>17}{'loss gap':>11}"
          f"{'CPU ms':>9}{'CPU vs h-w':>12}")
    failed = False
    for name, sp in ROWS:
        if (name, sp) not in med:
            print(f"  {name:14}{'yes' if sp else 'no':>4}   skipped: {skipped.get((name, sp), '?')}")
            continue
        t = med[(name, sp)]
        worst = max(gap(run, base_losses) for run in losses[(name, sp)])
        verdict = "" if worst <= TOLERANCE else "   FAIL"
        failed |= bool(verdict)
        print(f"  {name:14}{'yes' if sp else 'no':>4}{1e3 * t:10.1f}{tokens / t:10.0f}"
              f"{t / med[('hand-written', sp)]:16.2f}x{worst:11.1e}{1e3 * cpu[(name, sp)]:9.0f}"
              f"{cpu[(name, sp)] / cpu[('hand-written', sp)]:11.2f}x{verdict}")
    print("  vs hand-written: step time over hand-written's at the same sp; loss gap: largest relative gap to "
          f"hand-written (no sp) over every step of every round (tolerance {TOLERANCE:g});\n  CPU ms: CPU seconds per "
          "step of both ranks' processes (every thread), median; moves much less than step time when other "
          "processes take the cores")
    for name in PATHS:
        if (name, True) in med and (name, False) in med:
            print(f"  sequence parallelism, {name}: {med[(name, True)] / med[(name, False)]:.2f}x the step time "
                  f"without")
    for name, sp in ROWS:
        if (name, sp) in med and len(times[(name, sp)]) > 1:
            print(f"  {name}{' + sp' if sp else ''} ms per round: "
                  + ", ".join(f"{1e3 * t:.1f}" for t in times[(name, sp)]))
    print("  losses, hand-written (no sp): " + ", ".join(f"{x:.6f}" for x in base_losses))
    if failed:
        print("FAIL: a path's losses left hand-written's by more than the tolerance")


def launch(args) -> int:
    """Re-run this file under torchrun on 2 ranks (CPU over gloo unless 2 GPUs are visible)."""
    import torch

    from plscale.hardware import free_port

    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    if torch.cuda.device_count() < 2:
        env.update(DS_ACCELERATOR="cpu", CUDA_VISIBLE_DEVICES="")
    argv = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port",
            str(free_port()), __file__, "--ranks", "--preset", args.preset, "--seq", str(args.seq),
            "--steps", str(args.steps), "--interleave", str(args.interleave)]
    return subprocess.run(argv, env=env).returncode


# ---- 2. The layers' own cost at tp=1, in this process ------------------------------------
def tp1(args) -> None:
    quiet()
    import torch
    import torch.distributed as dist

    from plscale.dsconfig.spec import DSSpec, build
    from plscale.rank.models.llama import Llama
    from plscale.rank.optim import optimizer
    from plscale.strategies.tensor_parallel.llama import TensorParallelLlama

    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    if not cuda:  # one thread, as each rank of part 1 (and less thrown about by other processes)
        torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    if not dist.is_initialized():
        dist.init_process_group("nccl" if cuda else "gloo", store=dist.HashStore(), rank=0, world_size=1,
                                **({"device_id": device} if cuda else {}))
    group = dist.new_group([0])
    config = model_config(args.preset, 1)
    seq = min(args.seq, config.max_seq)
    ds = build(DSSpec(stage=0, precision="fp32", micro_batch=MICRO, grad_accum=1, lr=1e-3, grad_clip=0, world_size=1))
    torch.manual_seed(SEED)
    dense = Llama(config)
    initial = copy.deepcopy(dense.state_dict())
    batch = batches(config, seq, device)

    def build_model(kind: str):
        ref = Llama(config)
        ref.load_state_dict(initial)
        if kind == "dense":
            return ref.to(device)
        model = TensorParallelLlama(config, group).to(device)
        model.load_dense(ref.to(device))
        return model

    def train(model) -> tuple[list, float, float]:
        opt = optimizer(model.parameters(), ds)
        out, times, cpus = [], [], []
        for k in range(args.steps):
            t0, c0 = time.perf_counter(), time.process_time()
            total = 0.0
            for x, y in batch(k):
                loss = model(x, y)
                loss.backward()
                total += loss.item()
            opt.step()
            opt.zero_grad(set_to_none=True)
            if cuda:
                torch.cuda.synchronize()
            times.append(time.perf_counter() - t0)
            cpus.append(time.process_time() - c0)
            out.append(total)
        return out, statistics.median(times[1:]), statistics.median(cpus[1:])

    kinds = ("dense", "tp=1 layers")
    times, cpu, runs = {k: [] for k in kinds}, {k: [] for k in kinds}, {k: [] for k in kinds}
    for r in range(args.interleave):
        for kind in (kinds if r % 2 == 0 else kinds[::-1]):
            got, step_s, cpu_s = train(build_model(kind))
            runs[kind].append(got)
            times[kind].append(step_s)
            cpu[kind].append(cpu_s)
    tokens = MICRO * seq
    med = {k: statistics.median(v) for k, v in times.items()}
    cpu = {k: statistics.median(v) for k, v in cpu.items()}
    worst = max(gap(run, runs["dense"][0]) for k in kinds for run in runs[k])
    n = torch.get_num_threads()
    threads = f", {n} thread{'s' if n > 1 else ''}" if not cuda else ""
    print(f"\ntp=1: the dense Llama against TensorParallelLlama on a 1-rank group, one process on {device}{threads}, "
          f"'{args.preset}', {tokens} tokens per step, {args.steps} steps, median over {args.interleave} rounds")
    print(f"  {'model':14}{'step ms':>10}{'tokens/s':>10}{'vs dense':>10}{'CPU ms':>9}{'CPU vs dense':>14}")
    for k in kinds:
        print(f"  {k:14}{1e3 * med[k]:10.1f}{tokens / med[k]:10.0f}{med[k] / med['dense']:9.2f}x"
              f"{1e3 * cpu[k]:9.0f}{cpu[k] / cpu['dense']:13.2f}x")
    print(f"  tokens/s, tp=1 layers / dense: {med['dense'] / med['tp=1 layers']:.3f}; largest relative loss gap "
          f"{worst:.1e}{'' if worst <= TOLERANCE else '   FAIL'}")
    dist.destroy_process_group()


def main() -> None:
    args = parse()
    if args.ranks:
        ranks(args)
        return
    if not args.tp1_only:
        with Others() as others:
            code = launch(args)
        if code:
            sys.exit(f"the 2-rank run failed (exit {code})")
        print(f"  other processes used {100 * others.share:.0f}% of the machine's CPU meanwhile")
    with Others() as others:
        tp1(args)
    print(f"  other processes used {100 * others.share:.0f}% of the machine's CPU meanwhile")


if __name__ == "__main__":
    main()
