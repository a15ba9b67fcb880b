"""`plscale plan` against published training runs: how well its step time, memory and ranking match
what real runs used and measured.

    python benchmarks/plan_validation.py               # the table and the summary
    python benchmarks/plan_validation.py --markdown    # the same, as the README's table
    python benchmarks/plan_validation.py --only Korthikanti

The runs are benchmarks/published_runs.csv, one a row with its source: Megatron-LM's README H100
table, Narayanan et al. 2021 tables 1 and 2, Korthikanti et al. 2022 tables 3 and 5, Llama 3 405B
(Grattafiori et al. 2024, table 4), BLOOM 176B, torchtitan's A100 runs, and mixtures of experts on
H100s: Megatron-Core's Mixtral-8x7B (its MoE README), Mixtral-8x22B with and without folding (Liu et al.
2025, MoE Parallel Folding), Qwen3-235B-A22B in three layouts (Megatron-MoE-ModelZoo's step times) and
Qwen3-30B-A3B (Megatron-LM's recipe, forced balance). A blank cell is
something the source does not say: the planner chooses it.

For each run:
  pinned    the planner held to everything the source states (dp, tp, pp, cp, and where stated the
            micro-batch, interleaving, ZeRO stage, recomputation, sequence parallelism): the best such
            candidate's step time over the published one. Published step times: stated (Korthikanti,
            BLOOM), or the FLOPs of a step over the GPUs x the TFLOP/s a GPU published: Narayanan's
            eq. 3, 96 B s l h^2 (1 + s/6h + V/16lh), which counts recomputation, for his tables;
            the model's FLOPs (presets.flops_per_token) for MFU-based figures (Megatron-Core, Llama 3);
            tokens a step over tokens/s for torchtitan. Where the published layout does not fit the
            memory model, its step is priced as if it did, and the row says so.
  memory    the pinned candidate's GiB a GPU, against the published figure where there is one; every
            run trained, so each must fit.
  rank      the place of the published dp x tp x pp x cp among the best layouts (a run with 5 layouts or
            fewer that fit is not counted: its top 5 holds them all), the planner free but
            for what the run's system could not do (Megatron-LM 2021-22: no ZeRO, no context parallelism;
            Megatron-Core: its distributed optimizer, ZeRO 0-1). Narayanan's table 2 compares ZeRO-3 with
            his own layouts on purpose: its ZeRO-3 rows are shown, not counted.

The planner's memory uses Megatron-LM's activation count (plscale.predict.megatron) for every run, the
bf16 precision every one trained in, the default 10% headroom, and the gradients of the run's optimizer
(the `optimizer` column, memory.py: Megatron-Core's fp32 main gradients, BLOOM's BF16_Optimizer, 16-bit
gradients for the others).
Targets (issue 38): pinned step |ratio - 1| median <= 10%, worst <= 30%; memory within 20% where
published, every run fitting; the published layout in the top 5 for at least 80% of the runs.
"""

import argparse
import csv
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from plscale.predict.cluster import find_gpu  # noqa: E402
from plscale.predict.plan import Job, plan  # noqa: E402
from plscale.predict.presets import ModelConfig, flops_per_token  # noqa: E402
from plscale.predict.units import gib  # noqa: E402

RUNS = Path(__file__).with_name("published_runs.csv")
PINNABLE = ("micro_batch", "virtual", "zero", "recompute", "sp")
SYSTEM = {"megatron-lm": (("zero", 0), ("cp", 1)), "megatron-core": (), "deepspeed": (), "llama3": (),
          "torchtitan": ()}
NOT_COUNTED = "deepspeed-comparison"   # Narayanan's ZeRO-3 rows (module doc)


def model_of(row: dict) -> ModelConfig:
    return ModelConfig(vocab=int(row["vocab"]), hidden=int(row["hidden"]), layers=int(row["layers"]),
                       heads=int(row["heads"]), kv_heads=int(row["kv_heads"]), ffn=int(row["ffn"]),
                       max_seq=int(row["seq"]), tie_embeddings=row["tied"] == "yes", family=row["family"],
                       attention=row["attention"], experts=int(row["experts"] or 1), top_k=int(row["top_k"] or 1),
                       head_size=int(row["head_size"] or 0), qk_norm=row["qk_norm"] == "yes")


def layout_of(row: dict) -> tuple:
    """(dp, tp, pp, cp), and (ep, etp) where the run split its experts (plan.Candidate.layout)."""
    ep, etp = int(row["ep"] or 1), int(row["etp"] or row["tp"])
    return tuple(int(row[k]) for k in ("dp", "tp", "pp", "cp")) + ((ep, etp) if ep > 1 or etp != int(row["tp"]) else ())


def pinned_values(row: dict) -> tuple:
    out = [(k, int(row[k])) for k in ("dp", "tp", "pp", "cp", "ep", "etp") if row[k]]
    for key in PINNABLE:
        value = row[key]
        if value:
            out.append((key, value == "on" if key == "sp" else value if key == "recompute" else int(value)))
    return tuple(out)


def published_step(row: dict, model: ModelConfig) -> float:
    batch, seq, gpus, value = int(row["global_batch"]), int(row["seq"]), int(row["gpus"]), float(row["value"])
    if row["metric"] == "step_s":
        return value
    if row["metric"] == "tokens_gpu_s":
        return batch * seq / (gpus * value)
    if row["metric"] == "tflops_eq3":   # Narayanan et al. 2021, eq. 3 (counts recomputation's forward)
        h, layers, v = model.hidden, model.layers, model.vocab
        flops = 96 * batch * seq * layers * h * h * (1 + seq / (6 * h) + v / (16 * layers * h))
        return flops / (gpus * value * 1e12)
    flops = flops_per_token(model, seq)
    if row["metric"] == "tflops_megatron_causal":   # Megatron-LM since 2025-03: the attention core's FLOPs halved
        flops -= 6 * model.layers * seq * model.q_dim
    else:
        assert row["metric"] == "tflops_model", row["metric"]
    return flops * batch * seq / (gpus * value * 1e12)


def job_of(row: dict, model: ModelConfig, fixed: tuple) -> Job:
    return Job(model, int(row["gpus"]), int(row["seq"]), int(row["global_batch"]), fixed=fixed,
               activations="megatron", tp_overlap=row["tp_overlap"] == "yes",
               gather_overlap=row["gather_overlap"] == "yes", optimizer=row["optimizer"])


def validate(row: dict) -> dict:
    model, gpu = model_of(row), find_gpu(row["gpu"])
    layout = layout_of(row)
    pinned = plan(job_of(row, model, pinned_values(row)), gpu)
    fits = bool(pinned.ranked)
    if not fits:   # price its step anyway, on a GPU with room for it
        pinned = plan(job_of(row, model, pinned_values(row)), replace(gpu, memory=1e18))
    best = pinned.ranked[0] if pinned.ranked else None
    free = plan(job_of(row, model, SYSTEM[row["system"]]), gpu)
    step = published_step(row, model)
    return {"name": row["name"], "source": row["source"], "layout": layout, "best": best, "fits": fits,
            "ratio": best.step_s / step if best else None, "published_s": step,
            "memory": gib(best.memory) if best else None,
            "published_gib": float(row["memory_gib"]) if row["memory_gib"] else None,
            "rank": free.rank_of(layout), "layouts": len(free.best_per_layout()),
            "first": free.best_per_layout()[0] if free.ranked else None,
            "counted": not row["name"].startswith("ZeRO-3"), "mfu": best.mfu if best else None}


def show(results: list[dict], markdown: bool) -> None:
    head = ["run", "dp-tp-pp-cp(-ep)", "published s", "predicted s", "ratio", "pred. MFU", "GiB/GPU", "rank",
            "planner's first"]
    rows = []
    for r in results:
        b, first = r["best"], r["first"]
        memory = f"{r['memory']:.1f}" + (f" (pub. {r['published_gib']:g})" if r["published_gib"] else "")
        if not r["fits"]:
            memory += " does not fit"
        rank = f"{r['rank']}/{r['layouts']}" if r["rank"] else f"- /{r['layouts']}"
        if not r["counted"]:
            rank += " (not counted)"
        first_text = ("-".join(map(str, first.layout)) + f" z{first.zero} {first.recompute}") if first else "-"
        rows.append([r["name"], "-".join(map(str, r["layout"])), f"{r['published_s']:.2f}",
                     f"{b.step_s:.2f}" if b else "-", f"{r['ratio']:.2f}" if b else "-",
                     f"{r['mfu']:.1%}" if b else "-", memory, rank, first_text])
    if markdown:
        print("| " + " | ".join(head) + " |")
        print("|" + "---|" * len(head))
        for row in rows:
            print("| " + " | ".join(row) + " |")
        return
    widths = [max(len(str(x)) for x in col) for col in zip(head, *rows)]
    for row in [head, *rows]:
        print("  ".join(str(x).ljust(w) for x, w in zip(row, widths)))


def summary(results: list[dict]) -> None:
    counted = [r for r in results if r["counted"]]
    for label, group in (("all runs", results), ("runs of the ranking (without Narayanan's ZeRO-3)", counted)):
        ratios = [r["ratio"] for r in group if r["ratio"]]
        if ratios:
            gaps = [abs(x - 1) for x in ratios]
            print(f"\npinned step time, predicted / published, {label} ({len(ratios)}): median "
                  f"{statistics.median(ratios):.2f}, median |ratio - 1| {statistics.median(gaps):.1%} (target <= 10%), "
                  f"worst {max(gaps):.1%} (target <= 30%), range {min(ratios):.2f} to {max(ratios):.2f}", end="")
    memory = [(r["memory"] / r["published_gib"] - 1) for r in results if r["published_gib"] and r["memory"]]
    print(f"\nmemory: {sum(r['fits'] for r in results)} of {len(results)} published runs fit the memory model "
          f"(target: all); where a figure is published: "
          + (", ".join(f"{x:+.0%}" for x in memory) if memory else "none") + " (target within 20%)")
    choice = [r for r in counted if r["layouts"] > 5]   # with 5 layouts or fewer, the top 5 holds every one
    if choice:
        top5 = sum(1 for r in choice if r["rank"] and r["rank"] <= 5)
        print(f"ranking: the published layout in the top 5 for {top5} of the {len(choice)} runs with more than 5 "
              f"layouts that fit ({top5 / len(choice):.0%}, target >= 80%; {len(counted) - len(choice)} runs with 5 "
              f"or fewer not counted); median place {statistics.median([r['rank'] or 99 for r in choice])}")
    else:
        print("ranking: no run here has more than 5 layouts that fit (the top 5 would hold every one)")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--markdown", action="store_true", help="the table in Markdown, as the README shows it")
    ap.add_argument("--only", default="", help="only the runs whose name contains this")
    args = ap.parse_args()
    rows = [r for r in csv.DictReader(RUNS.open()) if args.only.lower() in r["name"].lower()]
    if not rows:
        ap.error(f"--only {args.only!r}: no run in {RUNS.name} has that in its name")
    start, results = time.perf_counter(), []
    for i, row in enumerate(rows, 1):
        print(f"[{i}/{len(rows)}] {row['name']}", file=sys.stderr, flush=True)
        results.append(validate(row))
    show(results, args.markdown)
    summary(results)
    print(f"({len(rows)} runs planned in {time.perf_counter() - start:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
