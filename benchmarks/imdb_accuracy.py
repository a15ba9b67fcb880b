"""Target: at least 80% test accuracy on real IMDB (all 25,000 test reviews) from a CPU run
of at most 15 minutes with 2 ranks (lab 02, DDP under torchrun). Prints the measured
accuracy and wall time beside the targets, and draws the run's curves.

    python benchmarks/imdb_accuracy.py                  # needs ../shared/data/imdb or --data-dir
    python benchmarks/imdb_accuracy.py --variant imdb-deepspeed

On GPUs the target is a pretrained encoder (DistilBERT) at >= 90%:
    python benchmarks/imdb_accuracy.py --gpus 1 --set model.init=pretrained --set data.max_len=256 ...
which needs the Hugging Face hub.
"""

import argparse
import sys

from imdb_common import FIGURES, data_args, fig, run_lab

parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
parser.add_argument("--variant", default="imdb-ddp")
parser.add_argument("--gpus", type=int, default=2)
parser.add_argument("--data-dir", default=None)
parser.add_argument("--set", dest="sets", action="append", default=[], help="extra key=value settings")
parser.add_argument("--plot", action="store_true", help=f"write {FIGURES}/imdb_accuracy.png")
args = parser.parse_args()

extra = data_args(args.data_dir)
if not extra:
    sys.exit("this target needs real IMDB: pass --data-dir (CSV or aclImdb files)")
RECIPE = {"data.max_len": 256, "train.epochs": 3, "train.eval_every": 200, "data.eval_samples": 1000}
sets = {**RECIPE, **dict(s.split("=", 1) for s in args.sets)}
summary, wall = run_lab(args.variant, args.gpus, sets, extra=extra)
accuracy = fig(summary, "test accuracy")

print(f"\nIMDB, {args.gpus} ranks ({args.variant}), {summary['data']}")
print(f"  settings: {' '.join(f'{k}={v}' for k, v in sets.items())}; {summary['parameters']:,} parameters")
print(f"  test accuracy: {accuracy:.2f} % on all test reviews   (target >= 80 %: "
      f"{'met' if accuracy >= 80 else 'NOT met'})")
print(f"  wall time of the whole command: {wall / 60:.1f} min   (target <= 15 min: "
      f"{'met' if wall <= 15 * 60 else 'NOT met'})")
to_target = fig(summary, "time to target accuracy")
print(f"  throughput {fig(summary, 'throughput'):.0f} samples/s; training time to 80% on 1000 quick-eval "
      f"reviews: {'not reached' if to_target is None else f'{to_target:.0f} s'}")
print("  GPU target (pretrained encoder >= 90 %): not measured by this run.")
print(f"  run directory: {summary['run_dir']}")

if args.plot:
    from plscale.charts.plots import line_plot

    FIGURES.mkdir(parents=True, exist_ok=True)
    steps = range(len(summary["losses"]))
    smooth = [sum(summary["losses"][max(0, i - 19):i + 1]) / len(summary["losses"][max(0, i - 19):i + 1])
              for i in steps]
    line_plot(FIGURES / "imdb_loss.png", {"training loss": (steps, summary["losses"]),
                                          "mean of the last 20": (steps, smooth)},
              f"IMDB, {args.gpus} CPU ranks ({args.variant}): training loss")
    evals = summary["evals"]
    line_plot(FIGURES / "imdb_accuracy.png", {"quick eval (1000 test reviews)": ([e[1] / 60 for e in evals],
                                                                                   [100 * e[2] for e in evals]),
                                              "target 80%": ([0, evals[-1][1] / 60], [80, 80])},
              f"IMDB, {args.gpus} CPU ranks: accuracy vs training time (final {accuracy:.1f}% on 25k)",
              xlabel="training time (min)", ylabel="accuracy (%)", styles={"target 80%": "--"})
    print(f"  figures: {FIGURES / 'imdb_loss.png'}, {FIGURES / 'imdb_accuracy.png'}")
