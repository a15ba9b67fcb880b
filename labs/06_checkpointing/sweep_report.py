"""The checkpointing sweep's report: the four strategies side by side (stall, time to
durable, bytes, steps lost) as a table and a bar chart, and the waste of each against the
checkpoint interval with Young's optimum. Runs on the host after `--sweep`:

    python labs/06_checkpointing/sweep_report.py runs/<time>-ckpt-sweep
"""

import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from plscale.charts.plots import interval_chart  # noqa: E402


def load(sweep_dir: Path) -> list[dict]:
    runs = json.loads((sweep_dir / "sweep.json").read_text())["runs"]
    return [json.loads((Path(run) / "summary.json").read_text()) for run in runs]


def value(summary: dict, name: str):
    return next(f for f in summary["figures"] if f["name"] == name)


def table(summaries: list[dict]) -> str:
    rows = ["| strategy | stall per checkpoint (ms) | time to durable (ms) | MiB per checkpoint | "
            "steps lost on a crash, predicted mean | Young interval, predicted (steps) |", "|---|---:|---:|---:|---:|---:|"]
    for s in summaries:
        rows.append(f"| {s['strategy']} | {value(s, 'stall per checkpoint')['value']:.0f} | "
                    f"{value(s, 'time to durable')['value']:.0f} | {value(s, 'bytes per checkpoint')['value']:.1f} | "
                    f"{value(s, 'steps lost on a crash, predicted mean')['value']:.1f} | "
                    f"{value(s, 'Young interval, predicted')['value']} |")
    return "\n".join(rows)


def cost_chart(summaries: list[dict], path: Path) -> None:
    fig, ax = plt.subplots(figsize=(7, 3.6))
    names = [s["strategy"] for s in summaries]
    stall = [value(s, "stall per checkpoint")["value"] for s in summaries]
    durable = [value(s, "time to durable")["value"] for s in summaries]
    xs = range(len(names))
    ax.bar([x - 0.2 for x in xs], stall, 0.38, label="training stalled", color="#c44e52")
    ax.bar([x + 0.2 for x in xs], durable, 0.38, label="until durable", color="#4c72b0")
    for x, s in zip(xs, summaries):
        ax.text(x, max(stall[x], durable[x]), f"{value(s, 'bytes per checkpoint')['value']:.0f} MiB",
                ha="center", va="bottom", fontsize=8)
    ax.set_xticks(list(xs), names)
    ax.set_ylabel("ms per checkpoint (mean)")
    ax.set_title("what a checkpoint costs, by strategy (bytes written above)", fontsize=10)
    ax.legend(frameon=False, fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)


def main(sweep_dir: Path) -> None:
    summaries = load(sweep_dir)
    text = table(summaries)
    (sweep_dir / "table.md").write_text(text + "\n")
    print(text)
    cost_chart(summaries, sweep_dir / "strategies.png")
    mtbf_h = summaries[0]["mtbf_hours"]
    rows = [(s["strategy"], value(s, "stall per checkpoint")["value"] / 1e3, value(s, "training step")["value"] / 1e3)
            for s in summaries]
    every = {s.get("every") for s in summaries}  # the interval the runs used, marked where they all used one
    interval_chart(rows, mtbf_h * 3600, sweep_dir / "interval.png", title="checkpoint interval, by strategy",
                   every=every.pop() if len(every) == 1 else None)
    print(f"\ncharts: {sweep_dir / 'strategies.png'}, {sweep_dir / 'interval.png'}")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
