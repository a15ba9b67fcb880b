"""Scaling of data parallelism: the IMDB lab (lab 02, DDP) on 1, 2, ... ranks with the same
micro batch per rank (the global batch grows with the ranks). Prints samples/s, scaling
efficiency and the training time to a target accuracy.

    python benchmarks/imdb_scaling.py                        # 1 and 2 CPU ranks, real IMDB if present
    python benchmarks/imdb_scaling.py --ranks 1,2,4,8        # on a machine with 8 GPUs

efficiency(N) = samples/s on N ranks / (N x samples/s on 1 rank). On CPU the ranks share
the machine's cores (each rank gets cores/N threads), so N ranks add no hardware: the
figure then says how much better N single-threaded workers use the cores than one
N-threaded one, less the all-reduce. On GPUs each rank brings its own device.
"""

import argparse

from imdb_common import data_args, fig, run_lab, table

parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
parser.add_argument("--ranks", default="1,2")
parser.add_argument("--variant", default="imdb-ddp")
parser.add_argument("--target", type=float, default=0.78, help="target accuracy on the quick-eval reviews")
parser.add_argument("--epochs", type=int, default=2)
parser.add_argument("--data-dir", default=None)
args = parser.parse_args()

extra = data_args(args.data_dir)
rows, base = [], None
for n in [int(r) for r in args.ranks.split(",")]:
    global_batch = 32 * n
    sets = {"train.epochs": args.epochs, "train.target_accuracy": args.target, "data.test_samples": 2000,
            "data.eval_samples": 1000, "train.eval_every": max(1, 3200 // global_batch)}
    summary, wall = run_lab(args.variant, n, sets, extra=extra)
    rate = fig(summary, "throughput")
    base = base or rate * 1.0
    to_target = fig(summary, "time to target accuracy")
    rows.append([n, global_batch, rate, f"{rate / (n * base):.0%}", to_target,
                 fig(summary, "test accuracy"), wall])

print(f"\nIMDB lab ({args.variant}), micro batch 32 per rank, {args.epochs} epochs; data: {summary['data']}")
print(table(["ranks", "global batch", "samples/s", "efficiency", f"s to {args.target:.0%}",
             "test acc % (2000)", "wall s"], rows))
print(f"(time to target: training time until a quick eval on 1000 test reviews reached {args.target:.0%}; "
      f"'-' = not reached)")
