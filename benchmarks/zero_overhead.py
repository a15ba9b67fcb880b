"""The ZeRO lab's overhead against a bare DeepSpeed loop, and ZeRO-2 on 2 ranks against 1.

    python benchmarks/zero_overhead.py                      # CPU: 2 ranks, WikiText-2 if present
    python benchmarks/zero_overhead.py --rounds 3 --steps 40

1. Overhead of the kit: the lab's step time (`plscale lab run zero2`, comms logger off)
   divided by that of a minimal DeepSpeed loop (this file, run as a rank: forward,
   backward, step, nothing else) on the same model, batch, data and DeepSpeed config.
   The two alternate `--rounds` times so both see the same machine. Target: <= 1.03.
2. Scaling: tokens/s of ZeRO-2 on 2 ranks over tokens/s of one process with the same
   global batch (micro batch doubled). On CPU the 2 ranks share the same cores.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "data" / "wikitext-2"


def bare_rank(args) -> None:
    """The minimal loop, inside each rank: the same data and model, DeepSpeed alone."""
    import deepspeed
    import torch

    from plscale.predict.presets import preset
    from plscale.rank import distributed
    from plscale.rank.data import wikitext
    from plscale.rank.models.llama import Llama

    d = distributed.init()  # gloo/nccl init (skips DeepSpeed's inference-only shm build on CPU)
    ds = json.loads(Path(args.ds_config).read_text())
    micro, accum, seq = ds["train_micro_batch_size_per_gpu"], ds["gradient_accumulation_steps"], args.seq
    tokens = wikitext.tokenize(wikitext.load_text(), preset(args.preset).vocab)
    shards = wikitext.Shards(wikitext.pack(tokens.train, seq), micro, accum, d.rank, d.world_size, 0)
    torch.manual_seed(0)
    model = Llama(preset(args.preset).with_vocab(tokens.vocab))
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=ds)
    times = []
    for step in range(args.steps):
        t0 = time.perf_counter()
        for block in shards.step(step):
            loss = engine(block[:, :-1], block[:, 1:])
            engine.backward(loss)
            engine.step()
        times.append(time.perf_counter() - t0)
    if d.rank == 0:
        Path(args.out).write_text(json.dumps(times))
    distributed.shutdown()


def plscale(*args, runs: Path) -> Path:
    env = {**os.environ, "PLSCALE_RUNS_DIR": str(runs)}
    before = set(runs.glob("*")) if runs.exists() else set()
    subprocess.run([sys.executable, "-m", "plscale.cli.main", *map(str, args)], env=env, check=True,
                   stdout=subprocess.DEVNULL)
    return next(iter(set(runs.glob("*")) - before))


def step_times(run_dir: Path) -> list[float]:
    return [json.loads(line)["step_time_s"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def steady(times: list[float]) -> float:
    return statistics.median(times[len(times) // 5:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--preset", default="small")
    parser.add_argument("--data-dir", default=str(SHARED) if SHARED.is_dir() else None)
    parser.add_argument("--skip-scaling", action="store_true")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="zero-bench-"))
    runs = work / "runs"
    common = ["--steps", args.steps, "--set", f"model.preset={args.preset}", "--set", "ds.comms_logger=false"]
    common += ["--data-dir", args.data_dir] if args.data_dir else []
    env = {**os.environ, "DS_ACCELERATOR": "cpu", "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1",
           **({"PLSCALE_DATA_DIR": args.data_dir} if args.data_dir else {})}

    lab, bare = [], []
    for r in range(args.rounds):
        run = plscale("lab", "run", "zero2", "--gpus", 2, *common, runs=runs)
        lab.append(steady(step_times(run)))
        out = work / f"bare{r}.json"
        subprocess.run([sys.executable, "-m", "deepspeed.launcher.runner", "--num_gpus", "2", __file__, "--bare",
                        "--ds-config", run / "ds_config.json", "--out", out, "--steps", str(args.steps),
                        "--preset", args.preset, "--seq", "128"], env=env, check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        bare.append(steady(json.loads(out.read_text())))
        print(f"round {r + 1}: lab {lab[-1] * 1e3:.1f} ms/step, bare DeepSpeed {bare[-1] * 1e3:.1f} ms/step")
    ratio = statistics.median(lab) / statistics.median(bare)
    print(f"overhead of the kit (ZeRO-2, 2 CPU ranks, '{args.preset}'): lab / bare step time = {ratio:.3f} "
          f"(target <= 1.03)")

    if args.skip_scaling:
        return
    two = json.loads((plscale("lab", "run", "zero2", "--gpus", 2, *common, runs=runs) / "summary.json").read_text())
    one = json.loads((plscale("lab", "run", "zero2", "--gpus", 1, *common, "--set", "ds.micro_batch=8",
                              runs=runs) / "summary.json").read_text())
    rate = {n: next(f["value"] for f in s["figures"] if f["name"] == "throughput") for n, s in ((1, one), (2, two))}
    print(f"ZeRO-2 tokens/s, global batch {two['tokens_per_step']} tokens: 1 process {rate[1]:.0f}, "
          f"2 ranks {rate[2]:.0f}; 2 ranks / 1 process = {rate[2] / rate[1]:.2f}")
    print(f"data: {two['data']}")


if __name__ == "__main__":
    if "--bare" in sys.argv:
        p = argparse.ArgumentParser()
        for flag in ("--ds-config", "--out", "--preset"):
            p.add_argument(flag)
        p.add_argument("--steps", type=int)
        p.add_argument("--seq", type=int)
        p.add_argument("--bare", action="store_true")
        p.add_argument("--local_rank", type=int)
        bare_rank(p.parse_args())
    else:
        main()
