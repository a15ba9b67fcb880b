"""Bucketing and overlap: the IMDB lab (lab 02) at several gradient bucket sizes, DDP and
DeepSpeed, on 2 ranks. Prints step time and gradient reductions per step for each.

    python benchmarks/imdb_buckets.py                 # real IMDB from ../shared/data if present
    python benchmarks/imdb_buckets.py --gpus 4 --steps 100 --data-dir /data/imdb

DDP: `bucket_cap_mb` (the comm hook counts one all-reduce per bucket). DeepSpeed ZeRO-0
reduces the whole flat gradient in one all-reduce after backward; ZeRO-2 reduces in
`reduce_bucket_size` buckets during backward, `overlap_comm` on a side stream (GPUs).
"""

import argparse

from imdb_common import data_args, fig, run_lab, table

from plscale.predict.units import MiB

parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
parser.add_argument("--gpus", type=int, default=2)
parser.add_argument("--steps", type=int, default=40)
parser.add_argument("--data-dir", default=None)
args = parser.parse_args()

# a deeper model than the lab's default, so that its gradients split into several buckets
common = {"data.train_samples": 6000, "data.test_samples": 500, "model.dim": 128, "model.layers": 4, "model.ff": 512}
extra = data_args(args.data_dir)
configs = [("imdb-ddp", f"bucket_cap_mb={mb}", {"train.bucket_cap_mb": mb}) for mb in (0.1, 1.0, 4.0, 25.0)]
configs += [("imdb-deepspeed", "ZeRO-0 (one flat bucket)", {"ds.stage": 0})]
configs += [("imdb-deepspeed", f"ZeRO-2 reduce_bucket_size={size:,} overlap_comm={str(overlap).lower()}",
             {"ds.stage": 2, "ds.bucket_size": size, "ds.overlap_comm": overlap})
            for size in (50_000, 500_000, 5_000_000) for overlap in (False, True)]

rows = []
for variant, label, sets in configs:
    summary, _ = run_lab(variant, args.gpus, {**common, **sets}, args.steps, extra)
    step_ms, calls = fig(summary, "step time"), fig(summary, "reductions per step")
    grad_mib = 4 * summary["parameters"] / MiB
    rows.append([variant, label, calls, fig(summary, "reduction time per step"), step_ms,
                 fig(summary, "throughput"), f"{fig(summary, 'final loss'):.4f}"])

print(f"\nIMDB lab, {args.gpus} ranks, {args.steps} steps, model {summary['parameters']:,} parameters "
      f"({grad_mib:.2f} MiB of fp32 gradients), data: {summary['data']}")
print(table(["engine", "buckets", "reductions/step", "reduce ms/step", "step ms", "samples/s", "final loss"], rows))

