"""The ZeRO lab's overhead against two bare DeepSpeed loops, and ZeRO-2 on 2 ranks against 1.

    python benchmarks/zero_overhead.py                      # CPU: 2 ranks, WikiText-2 if present
    python benchmarks/zero_overhead.py --rounds 8 --steps 30 --skip-scaling
    python benchmarks/zero_overhead.py --launcher torchrun  # every side under torchrun

1. Overhead of the kit: `plscale lab run zero2` (as it ships) against two minimal
   DeepSpeed loops (this file, run as ranks: forward, backward, step, and one line per
   step to a file, as the lab writes metrics.jsonl), one on plscale's Llama and one on
   transformers' LlamaForCausalLM of the same shape (built offline from a LlamaConfig,
   starting from the same weights: benchmarks/bare_models.py). All three use the same
   data, DeepSpeed config (the lab's ds_config.json), seed and launcher; their losses
   agree (printed). The three run in turn, in a rotated order, `--rounds` times. Per side:
     tokens/s   tokens per step / median step time, after the first 20% of steps
     clock      tokens/s by the wall clock over the same steps (between-step work included)
     CPU        CPU seconds per step of the run's whole process tree (CLI, launcher, ranks)
   and the ratios lab/bare-plscale and lab/bare-transformers of each (for CPU: bare CPU
   over the lab's, so above 1 means the lab costs less), of the medians over rounds and
   round by round. Target: the lab's median step <= 1.00 x the bare transformers loop's.
   Noise: on the 2-core machine quiet runs of one and the same loop differ by 10-20% in
   median step time, more when other processes run. Each round says how much of the CPU
   other processes used meanwhile, the summary is repeated over the quiet rounds
   (`--quiet`, default 5%), and the CPU figure barely moves with contention: use it to
   tell a real cost from noise, and 6 rounds or more.
2. Scaling: tokens/s of ZeRO-2 on 2 ranks over tokens/s of one process with the same
   global batch (micro batch doubled). On CPU the 2 ranks share the same cores.
"""

import argparse
import io
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from rich.console import Console  # noqa: E402
from run_watch import Others, watch  # noqa: E402

from plscale.run import flow  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "data" / "wikitext-2"
SIDES = ("lab", "bare-plscale", "bare-transformers")


def bare_rank(args) -> None:
    """The minimal loop, inside each rank: the same data, model weights and config, DeepSpeed alone."""
    import deepspeed
    import torch
    import torch.distributed as dist

    from bare_models import build, loss_of
    from plscale.predict.presets import preset
    from plscale.rank import distributed
    from plscale.rank.data import wikitext

    d = distributed.init()  # gloo/nccl init (skips DeepSpeed's inference-only shm build on CPU)
    ds = json.loads(Path(args.ds_config).read_text())
    micro, accum, seq = ds["train_micro_batch_size_per_gpu"], ds["gradient_accumulation_steps"], args.seq
    tokens = wikitext.tokenize(wikitext.load_text(), preset(args.preset).vocab)
    shards = wikitext.Shards(wikitext.pack(tokens.train, seq), micro, accum, d.rank, d.world_size, 0)
    torch.manual_seed(0)
    model = build(args.model, preset(args.preset).with_vocab(tokens.vocab))
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=ds)
    lines = open(args.out + ".steps", "a", buffering=1) if d.rank == 0 else None
    times, losses = [], []
    for step in range(args.steps):
        t0 = time.perf_counter()
        for block in shards.step(step):
            loss = loss_of(engine, args.model, block[:, :-1], block[:, 1:])
            engine.backward(loss)
            engine.step()
            losses.append(loss.detach())
        times.append(time.perf_counter() - t0)
        if lines:
            lines.write(f"{step}\n")
    per_step = torch.stack(losses).view(args.steps, accum).sum(1)  # after the loop: no sync inside it
    dist.all_reduce(per_step)
    if d.rank == 0:
        Path(args.out).write_text(json.dumps({"step_time_s": times,
                                              "loss": (per_step / (d.world_size * accum)).tolist()}))
    distributed.shutdown()


def launcher_argv(launcher: str, ranks: int) -> list:
    from plscale.hardware import free_port

    if launcher == "torchrun":
        return [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", ranks, "--master_port", free_port()]
    return [sys.executable, "-m", "deepspeed.launcher.runner", "--num_gpus", ranks, "--master_port", free_port()]


def plscale(*args, runs: Path) -> Path:
    """`plscale ARGS` (a `lab run`) to the end in this process (plscale.run.flow), output
    discarded; the run directory it made."""
    request = flow.parse([str(a) for a in args])
    return flow.run(request.name, request.opts, request.variant, Console(file=io.StringIO()), runs=runs)


def steady(times: list[float]) -> float:
    """Median step time after the first 20% of steps (start-up, the lab's census at step 1)."""
    return statistics.median(times[len(times) // 5:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--preset", default="small")
    parser.add_argument("--launcher", default="deepspeed", choices=("deepspeed", "torchrun"))
    parser.add_argument("--data-dir", default=str(SHARED) if SHARED.is_dir() else None)
    parser.add_argument("--quiet", type=float, default=0.05,
                        help="a round is quiet when other processes used at most this share of the CPU")
    parser.add_argument("--skip-scaling", action="store_true")
    args = parser.parse_args()
    if args.steps < 10:
        parser.error("--steps: use 10 or more (the first 20% are start-up)")
    work = Path(tempfile.mkdtemp(prefix="zero-bench-"))
    common = ["--steps", args.steps, "--set", f"model.preset={args.preset}"]   # the lab as it ships (comms logger
    # on for its first fifth of the steps, which neither side's median counts)
    common += ["--data-dir", args.data_dir] if args.data_dir else []
    env = {**os.environ, "DS_ACCELERATOR": "cpu", "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1",
           "MKL_NUM_THREADS": "1", **({"PLSCALE_DATA_DIR": args.data_dir} if args.data_dir else {})}
    first = args.steps // 5

    # The lab's resolved DeepSpeed config and shapes, for the bare loops (a 2-step run).
    probe = plscale("lab", "run", "zero2", "--gpus", 2, "--launcher", args.launcher, "--steps", 2, *common[2:],
                    runs=work / "probe")
    ds_config = probe / "ds_config.json"
    tokens = json.loads((probe / "summary.json").read_text())["tokens_per_step"]
    seq = json.loads((probe / "settings.json").read_text())["settings"]["model"]["seq"]

    def run_side(side: str, r: int) -> dict:
        if side == "lab":
            runs = work / f"lab-{r}"  # the CLI in a process of its own: its CPU counts in the lab's
            argv = [sys.executable, "-m", "plscale.cli.main", "lab", "run", "zero2", "--gpus", 2,
                    "--launcher", args.launcher, *common]
            window = watch(argv, {**os.environ, "PLSCALE_RUNS_DIR": str(runs)}, f"{runs}/*/metrics.jsonl",
                           first, args.steps)
            lines = [json.loads(line) for line in next(runs.glob("*/metrics.jsonl")).read_text().splitlines()]
            record = {k: [line[k] for line in lines] for k in ("step_time_s", "loss")}
        else:
            out = work / f"{side}-{r}.json"
            argv = [*launcher_argv(args.launcher, 2), __file__, "--bare", "--model", side[len("bare-"):],
                    "--ds-config", ds_config, "--out", out, "--steps", args.steps, "--preset", args.preset,
                    "--seq", seq]
            window = watch(argv, env, f"{out}.steps", first, args.steps)
            record = json.loads(out.read_text())
        return {"step": steady(record["step_time_s"]), "clock": window.wall_s / window.steps,
                "cpu": window.cpu_s / window.steps, "loss": record["loss"]}

    rounds = []
    for r in range(args.rounds):
        order = SIDES[r % 3:] + SIDES[:r % 3]
        got = {}
        for side in order:
            with Others() as others:
                got[side] = run_side(side, r)
            got[side]["others"] = others.share
        rounds.append(got)
        print(f"round {r + 1}: tokens/s " + ", ".join(f"{s} {tokens / got[s]['step']:.0f}" for s in SIDES)
              + "; lab/bare-plscale {:.3f}, lab/bare-transformers {:.3f}; CPU s/step {}; others used {}% of the CPU"
              .format(got["bare-plscale"]["step"] / got["lab"]["step"],
                      got["bare-transformers"]["step"] / got["lab"]["step"],
                      "/".join(f"{got[s]['cpu']:.2f}" for s in SIDES),
                      "/".join(f"{100 * got[s]['others']:.0f}" for s in SIDES)), flush=True)

    print(f"\nZeRO-2, 2 CPU ranks ({args.launcher}), '{args.preset}', {tokens} tokens per step, {args.rounds} rounds "
          f"of {args.steps} steps (steps {first}-{args.steps - 1} measured), sides in rotated order")
    quiet = [g for g in rounds if max(g[s]["others"] for s in SIDES) <= args.quiet]
    for label, chosen in (("all rounds", rounds),
                          (f"quiet rounds (others <= {100 * args.quiet:g}% of the CPU): {len(quiet)} of {len(rounds)}",
                           quiet)):
        print(f"{label}:")
        if not chosen:
            print("  none: the machine was busy; run again when it is quiet")
            continue
        med = {s: {k: statistics.median(g[s][k] for g in chosen) for k in ("step", "clock", "cpu")} for s in SIDES}
        print(f"  {'':22}{'tokens/s':>10}{'clock':>8}{'CPU s/step':>12}")
        for s in SIDES:
            print(f"  {s:22}{tokens / med[s]['step']:10.0f}{tokens / med[s]['clock']:8.0f}{med[s]['cpu']:12.3f}")
        for bare in SIDES[1:]:
            ratio = {k: med[bare][k] / med["lab"][k] for k in ("step", "clock", "cpu")}
            rounds_ = ", ".join(f"{g[bare]['step'] / g['lab']['step']:.3f}" for g in chosen)
            print(f"  lab/{bare:18}{ratio['step']:10.3f}{ratio['clock']:8.3f}{ratio['cpu']:12.3f}"
                  f"   per round: {rounds_}")
        faster = min(SIDES[1:], key=lambda s: med[s]["step"])
        print(f"  lab / the faster bare loop ({faster}): {med[faster]['step'] / med['lab']['step']:.3f} tokens/s, "
              f"{med[faster]['cpu'] / med['lab']['cpu']:.3f} by CPU")
        print(f"  lab median step / bare-transformers median step: "
              f"{med['lab']['step'] / med['bare-transformers']['step']:.3f} (target <= 1.00); per round: "
              + ", ".join(f"{g['lab']['step'] / g['bare-transformers']['step']:.3f}" for g in chosen))
    print("losses at the first and last step (round 1): "
          + ", ".join(f"{s} {rounds[0][s]['loss'][0]:.6f} / {rounds[0][s]['loss'][-1]:.6f}" for s in SIDES))

    if args.skip_scaling:
        return
    two = json.loads((plscale("lab", "run", "zero2", "--gpus", 2, *common, runs=work / "scaling") / "summary.json")
                     .read_text())
    one = json.loads((plscale("lab", "run", "zero2", "--gpus", 1, *common, "--set", "ds.micro_batch=8",
                              runs=work / "scaling") / "summary.json").read_text())
    rate = {n: next(f["value"] for f in s["figures"] if f["name"] == "throughput") for n, s in ((1, one), (2, two))}
    print(f"\nZeRO-2 tokens/s, global batch {two['tokens_per_step']} tokens: 1 process {rate[1]:.0f}, "
          f"2 ranks {rate[2]:.0f}; 2 ranks / 1 process = {rate[2] / rate[1]:.2f}")
    print(f"data: {two['data']}")


if __name__ == "__main__":
    if "--bare" in sys.argv:
        p = argparse.ArgumentParser()
        for flag in ("--ds-config", "--out", "--preset", "--model"):
            p.add_argument(flag)
        p.add_argument("--steps", type=int)
        p.add_argument("--seq", type=int)
        p.add_argument("--bare", action="store_true")
        p.add_argument("--local_rank", "--local-rank", type=int)
        bare_rank(p.parse_args())
    else:
        main()
