"""The ZeRO sweep's report: memory per rank by stage (measured beside predicted), the loss
curves of all stages on one plot, and a table. Runs on the host after `--sweep`:

    python labs/04_zero/sweep_report.py runs/<time>-zero-sweep
"""

import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from plscale.charts.plots import curves_and_gaps  # noqa: E402
from plscale.predict.memory import LABELS, MODEL_STATES  # noqa: E402
from plscale.predict.units import MiB  # noqa: E402

COLORS = ["#4c72b0", "#dd8452", "#55a868", "#c44e52"]


def load(sweep_dir: Path) -> list[dict]:
    runs = json.loads((sweep_dir / "sweep.json").read_text())["runs"]
    return [json.loads((Path(run) / "summary.json").read_text()) for run in runs]


def memory_chart(summaries: list[dict], path: Path) -> None:
    """Stacked bars per stage: measured on rank 0 (solid) beside predicted (hatched)."""
    fig, ax = plt.subplots(figsize=(7.5, 4.2))
    for i, s in enumerate(summaries):
        measured = predicted = 0.0
        for state, color in zip(MODEL_STATES, COLORS):
            m = s["memory"][state]["measured_bytes"][0] / MiB
            p = s["memory"][state]["predicted_bytes"] / MiB
            ax.bar(i - 0.2, m, 0.38, bottom=measured, color=color, label=LABELS[state] if i == 0 else None)
            ax.bar(i + 0.2, p, 0.38, bottom=predicted, color=color, alpha=0.45, hatch="//", edgecolor="white")
            measured, predicted = measured + m, predicted + p
        ax.text(i - 0.2, measured, f"{measured:.3g}", ha="center", va="bottom", fontsize=8)
        ax.text(i + 0.2, predicted, f"{predicted:.3g}", ha="center", va="bottom", fontsize=8)
    ax.set_xticks(range(len(summaries)), [f"ZeRO-{s['stage']}\nmeasured | predicted" for s in summaries], fontsize=8)
    ax.set_ylabel("MiB per rank")
    s = summaries[0]
    ax.set_title(f"Model states per rank, {s['world_size']} ranks, Ψ = {s['params'] / 1e6:.2f}M, {s['precision']}")
    ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def loss_chart(summaries: list[dict], path: Path) -> None:
    """The curves, and below them each stage's |loss - the first stage's| per step (log): parity
    to float precision, not just lines on top of each other."""
    curves = {f"ZeRO-{s['stage']}": (range(len(s["losses"])), s["losses"]) for s in summaries}
    first = next(iter(curves))
    exact = all(a == b for s in summaries for a, b in zip(s["losses"], summaries[0]["losses"]))
    curves_and_gaps(path, curves, first, "WikiText-2 training loss: the same curve at every stage",
                    styles=dict(zip(curves, ["-", "--", ":", "-."])),
                    note=f"every gap to {first} is exactly 0 (drawn on the floor)" if exact else None)


def main(sweep_dir: Path) -> None:
    summaries = load(sweep_dir)
    memory_chart(summaries, sweep_dir / "memory_by_stage.png")
    loss_chart(summaries, sweep_dir / "loss_by_stage.png")
    base = summaries[0]["losses"]
    print(f"{'stage':>6} {'model states MiB':>17} {'predicted':>10} {'error':>7} {'comm MiB/step':>14} "
          f"{'tokens/s':>9} {'final loss':>11} {'val ppl':>8} {'max |Δloss|':>12}")
    rows = []
    for s in summaries:
        states = s["memory"]["model_states"]
        measured, predicted = max(states["measured_bytes"]), states["predicted_bytes"]
        figures = {f["name"]: f["value"] for f in s["figures"]}
        gap = max(abs(a - b) for a, b in zip(s["losses"], base))
        rows.append({"stage": s["stage"], "model_states_mib": measured / MiB, "predicted_mib": predicted / MiB,
                     "comm_mib_per_step": figures["communication per step"], "tokens_per_s": figures["throughput"],
                     "final_loss": s["losses"][-1], "val_perplexity": s["val_perplexity"], "max_loss_gap": gap})
        print(f"{s['stage']:>6} {measured / MiB:>17.2f} {predicted / MiB:>10.2f} "
              f"{100 * abs(measured - predicted) / predicted:>6.1f}% {figures['communication per step']:>14.2f} "
              f"{figures['throughput']:>9.0f} {s['losses'][-1]:>11.4f} {s['val_perplexity']:>8.2f} {gap:>12.2e}")
    (sweep_dir / "sweep_summary.json").write_text(json.dumps({"stages": rows}, indent=2) + "\n")
    print(f"data: {summaries[0]['data']}")
    print(f"plots: {sweep_dir / 'memory_by_stage.png'}, {sweep_dir / 'loss_by_stage.png'}")


if __name__ == "__main__":
    if len(sys.argv) != 2 or not (Path(sys.argv[1]) / "sweep.json").is_file():
        sys.exit("usage: sweep_report.py SWEEP_DIR   (a folder with the sweep.json that `--sweep` writes)")
    main(Path(sys.argv[1]))
