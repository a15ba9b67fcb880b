"""The 4D sweep's report: the planner's step time against the measured one for every layout it ran,
their rank correlation, and a plot. Runs on the host after `plscale lab run 4d --sweep`:

    python labs/11_4d/sweep_report.py runs/<time>-4d-sweep

sweep.json holds this machine's measured figures and the planner's candidate of each run
(plscale/run/layouts.py); each run's summary.json its measured step time (the median of the
steps after the first). Writes sweep.png and sweep_report.json into the sweep directory.
"""

import json
import statistics
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from plscale.files import write_json  # noqa: E402
from plscale.predict.step_time import LABELS, TERMS  # noqa: E402

COLORS = {"compute": "#4c72b0", "bubble": "#bbbbbb", "tp": "#dd8452", "dp": "#55a868", "pp": "#8172b3",
          "cp": "#c44e52", "ep": "#da8bc3", "optimizer": "#937860"}


def ranks(values: list[float]) -> list[float]:
    """1-based ranks, ties sharing their mean rank (Spearman's convention)."""
    order = sorted(range(len(values)), key=values.__getitem__)
    out = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            out[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return out


def spearman(x: list[float], y: list[float]) -> float:
    """Spearman's rank correlation: Pearson's r of the ranks."""
    rx, ry = ranks(x), ranks(y)
    mx, my = statistics.fmean(rx), statistics.fmean(ry)
    cov = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    spread = (sum((a - mx) ** 2 for a in rx) * sum((b - my) ** 2 for b in ry)) ** 0.5
    return cov / spread if spread else float("nan")


def load(sweep_dir: Path) -> tuple[dict, list[dict]]:
    sweep = json.loads((sweep_dir / "sweep.json").read_text())
    rows = []
    for name, run, c in zip(sweep["variants"], sweep["runs"], sweep["planned"]):
        summary = json.loads((Path(run) / "summary.json").read_text())
        step = next(f for f in summary["figures"] if f["name"] == "step time")
        rows.append({"layout": name, "predicted_s": c["step_s"], "measured_s": step["value"], "terms_s": c["terms_s"],
                     "zero": c["zero"], "micro_batches": c["micro_batches"], "sp": c["sp"], "run": run})
    return sweep, rows


def draw(rows: list[dict], machine: str, rho: float, path: Path) -> None:
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 5.2), gridspec_kw={"width_ratios": [1, 1.5]})
    xs, ys = [r["predicted_s"] for r in rows], [r["measured_s"] for r in rows]
    low, high = min(xs + ys) * 0.8, max(xs + ys) * 1.25
    left.plot([low, high], [low, high], color="#999999", lw=1, ls="--", label="measured = predicted")
    left.scatter(xs, ys, color="#4c72b0", zorder=3)
    for r in rows:
        left.annotate(r["layout"], (r["predicted_s"], r["measured_s"]), fontsize=7, xytext=(4, 3),
                      textcoords="offset points")
    left.set(xscale="log", yscale="log", xlim=(low, high), ylim=(low, high), xlabel="predicted step (s)",
             ylabel="measured step (s, median)", title=f"one point a layout; Spearman {rho:.2f}")
    left.legend(fontsize=8, loc="upper left")
    order = sorted(rows, key=lambda r: r["predicted_s"])
    for i, r in enumerate(order):
        bottom = 0.0
        for t in TERMS:
            value = r["terms_s"].get(t, 0.0)
            right.bar(i - 0.2, value, 0.38, bottom=bottom, color=COLORS[t], label=LABELS[t] if i == 0 else None)
            bottom += value
        right.bar(i + 0.2, r["measured_s"], 0.38, color="#333333", label="measured" if i == 0 else None)
    right.set_xticks(range(len(order)), [r["layout"].replace("-", "\n") for r in order], fontsize=7)
    right.set(ylabel="seconds a step", title="predicted terms (left bar) beside measured (right), planner's order")
    right.legend(fontsize=7, ncol=2)
    fig.suptitle(f"lab 11: the planner's step time against the measured one, {machine}", fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(sweep_dir: Path) -> None:
    sweep, rows = load(sweep_dir)
    m = sweep["machine"]
    machine = f"{m['ranks']} CPU ranks on {m['cores']} cores"
    ratios = [r["measured_s"] / r["predicted_s"] for r in rows]
    rho = spearman([r["predicted_s"] for r in rows], [r["measured_s"] for r in rows])
    error = statistics.median(abs(1 / q - 1) for q in ratios)
    gloo = ", ".join(f"{op.replace('_', '-')} {gbs:.2f}" for op, gbs in {"all-reduce": m["busbw_gbs"],
                                                                          **m["collective_gbs"]}.items())
    print(f"\nthe planner on this machine ({machine}: {m['flops'] / 1e9:.2f} GFLOP/s a rank and "
          f"{m['layer_overhead_us'] / 1e3:.1f} ms a layer at no FLOPs, gloo {gloo} GB/s, {m['latency_us']:.0f} us a "
          f"ring step, {m['p2p_latency_us']:.0f} us a point-to-point hop, AdamW {m['optimizer_ns']:.0f} ns a "
          f"parameter), {len(rows)} layouts, planner's order:")
    print(f"  {'layout':16} {'ZeRO':>4} {'m':>3} {'sp':>3} {'predicted s':>11} {'measured s':>10} {'meas/pred':>9}  "
          "predicted terms (s)")
    for r, q in zip(rows, ratios):
        terms = ", ".join(f"{t} {v:.3f}" for t, v in r["terms_s"].items() if v)
        print(f"  {r['layout']:16} {r['zero']:>4} {r['micro_batches']:>3} {'yes' if r['sp'] else 'no':>3} "
              f"{r['predicted_s']:>11.3f} {r['measured_s']:>10.3f} {q:>9.2f}  {terms}")
    for line in sweep.get("left_out", []):
        print(f"  not run: {line}")
    print(f"\nrank correlation (Spearman) of predicted and measured step times: {rho:.2f} (target >= 0.8)")
    print(f"median |predicted / measured - 1|: {error:.0%} (target <= 25%)")
    fastest = min(rows, key=lambda r: r["measured_s"])
    print(f"the planner's first choice {rows[0]['layout']} measured {rows[0]['measured_s']:.3f} s; the fastest "
          f"measured {fastest['layout']} {fastest['measured_s']:.3f} s")
    draw(rows, machine, rho, sweep_dir / "sweep.png")
    write_json(sweep_dir / "sweep_report.json", {"machine": m, "spearman": rho, "median_error": error, "rows": rows})
    print(f"sweep.png: predicted against measured, one point a layout ({sweep_dir / 'sweep.png'})")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
