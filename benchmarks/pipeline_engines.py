"""Pipeline engines side by side: plscale's 1F1B, DeepSpeed's PipelineModule and PyTorch's
Schedule1F1B on the same model, data and micro-batches; the bubble against theory.

    python benchmarks/pipeline_engines.py [--rounds 2] [--steps 12] [--gpus 2] [--cpu]

Runs the pipeline lab once per engine per round, in rotation (so slow spells of a shared
machine fall on every engine alike), and prints per engine: the median step time over all
rounds, its ratio to plscale's 1F1B, the bubble measured at each m beside (p-1)/(m+p-1),
and the activations in flight of stage 0 against the prediction. Every figure comes from the
runs' summary.json. Targets (issue): bubble within 10 percentage points of theory at m >= 4
with 2 stages; 1F1B's activations <= GPipe's at m > p and within 5% of the prediction.
"""

import argparse
import io
import json
import statistics
import sys
import tempfile
from pathlib import Path

from rich.console import Console

from plscale.run import flow
from plscale.run.launch import Options

ENGINES = {"plscale 1F1B": "1f1b", "plscale GPipe": "gpipe", "DeepSpeed": "deepspeed", "torch 1F1B": "torch-1f1b"}


def run(variant: str, args, runs: Path) -> dict:
    """One run of the pipeline lab in this process (plscale.run.flow), its output kept; summary.json."""
    opts = Options(gpus=args.gpus, cpu=args.cpu, steps=args.steps, sets=[
        "train.parity_steps=0", "bubble.micro_batches=[2,4,8,16]", "bubble.steps=3"])
    output = io.StringIO()
    try:
        run_dir = flow.run("pipeline", opts, variant, Console(file=output, width=160), runs=runs)
    except flow.RunFailed as failed:
        if failed.code != 1:  # 1: a lab check failed; the figures still count
            sys.exit(f"{variant} failed:\n{output.getvalue()[-2000:]}")
        run_dir = failed.run_dir
    return json.loads((run_dir / "summary.json").read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--gpus", type=int, default=2)
    parser.add_argument("--cpu", action="store_true")
    args = parser.parse_args()
    results = {name: [] for name in ENGINES}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for name, variant in (list(ENGINES.items())[r % len(ENGINES):] + list(ENGINES.items())[:r % len(ENGINES)]):
                print(f"round {r + 1}/{args.rounds}: {name} ...", flush=True)
                results[name].append(run(variant, args, Path(tmp)))

    step = {name: statistics.median(f["value"] for s in runs for f in s["figures"] if f["name"] == "step time")
            for name, runs in results.items()}
    base = step["plscale 1F1B"]
    print(f"\nstep time, median over {args.rounds} rounds (m = {results['plscale 1F1B'][0]['micro_batches']}):")
    for name, t in step.items():
        print(f"  {name:15}{t:8.3f} s   x{t / base:5.2f} of plscale 1F1B")
    print("\nbubble, measured (median over rounds) against (p-1)/(m+p-1):")
    ms = [row["m"] for row in results["plscale 1F1B"][0]["bubble"]]
    print(f"  {'':15}" + "".join(f"{'m=' + str(m):>9}" for m in ms))
    theory = [row["theory"] for row in results["plscale 1F1B"][0]["bubble"]]
    print(f"  {'theory':15}" + "".join(f"{100 * t:8.1f}%" for t in theory))
    for name, runs in results.items():
        measured = [statistics.median(s["bubble"][i]["measured"] for s in runs) for i in range(len(ms))]
        print(f"  {name:15}" + "".join(f"{100 * x:8.1f}%" for x in measured)
              + f"   worst gap at m>=4: {max(100 * abs(x - t) for x, t, m in zip(measured, theory, ms) if m >= 4):.1f} pp")
    print("\nactivations in flight, stage 0, MiB (measured / predicted):")
    for name, runs in results.items():
        row = runs[-1]["activations"][0]
        print(f"  {name:15}{row['measured_bytes'] / 2**20:8.2f} / {row['predicted_bytes'] / 2**20:.2f}"
              f"   ({100 * (row['measured_bytes'] / row['predicted_bytes'] - 1):+.1f}%)")


if __name__ == "__main__":
    main()
