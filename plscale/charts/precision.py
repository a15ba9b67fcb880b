"""Charts of the mixed-precision lab (matplotlib, headless, imported only when drawing).

    loss_curves       the loss by precision over steps, fp16's skipped steps (overflow) crossed
    scaler_chart      the loss scale against step on a log2 axis, overflows (skipped steps)
                      and growths marked: dynamic loss scaling's sawtooth
    range_histograms  how many values sit at each power of two (log2 |x|), with each number
                      format's range as its own band: its normal range dark, its subnormals
                      light; what falls left of a band rounds to 0, right of it overflows
"""

import math
from pathlib import Path

COLORS = {"fp16": "C1", "bf16": "C2", "e4m3": "C3", "e5m2": "C0", "fp32": "C7"}


def _pyplot():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


STYLES = {"fp32": "C0-", "bf16": "C1-", "fp16": "C2-", "fp16-unscaled": "C3--"}


def loss_curves(path: Path, curves: dict, title: str, logs: dict) -> None:
    """curves: run -> (steps, losses); logs: run -> rows of its loss scaler's log (as in
    scaler_chart): each step the scaler skipped (an overflow) is crossed on that run's curve."""
    from plscale.charts.plots import line_plot

    marks = {f"{run}: overflow, step skipped": (run, [r["step"] for r in rows if r["skipped"]])
             for run, rows in logs.items() if run in curves}
    line_plot(path, curves, title, styles={k: v for k, v in STYLES.items() if k in curves}, marks=marks)


def scaler_chart(path: Path, logs: dict, title: str) -> None:
    """logs: label -> rows of the scaler's log (dicts: step, scale_before, scale_after,
    overflow, skipped)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    for i, (label, rows) in enumerate(logs.items()):
        if not rows:
            continue
        steps = [r["step"] for r in rows] + [rows[-1]["step"] + 1]
        scales = [math.log2(r["scale_before"]) for r in rows] + [math.log2(rows[-1]["scale_after"])]
        (line,) = ax.step(steps, scales, where="post", label=f"{label}: loss scale", linewidth=1.5, color=f"C{i}")
        over = [r for r in rows if r["overflow"]]
        ax.plot([r["step"] for r in over], [math.log2(r["scale_before"]) for r in over], "x", color="C3",
                markersize=8, mew=2, label=f"{label}: overflow, step skipped ({len(over)})")
        grew = [r for r in rows if r["scale_after"] > r["scale_before"]]
        ax.plot([r["step"] + 1 for r in grew], [math.log2(r["scale_after"]) for r in grew], "^",
                color=line.get_color(), label=f"{label}: doubled after a clean window ({len(grew)})")
    ax.set_title(title)
    ax.set_xlabel("step")
    ax.set_ylabel("log2 (loss scale)")
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.yaxis.get_major_locator().set_params(integer=True)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def range_histograms(path: Path, panels: dict, formats: list, title: str, colors: dict | None = None) -> None:
    """panels: panel title -> {curve label: histogram} (plscale.rank.taps.log2_histogram:
    edges, counts, zeros); formats: plscale.predict.formats.Format, each drawn in every panel as
    its own band along the top (light: subnormal, dark: normal) with its bounds as dashed lines,
    so two formats' ranges never blend; colors: curve label -> colour (default: the first black,
    the others dashed). The legend sits outside, right of the panels."""
    from matplotlib.patches import Patch

    plt = _pyplot()
    band, gap = 0.07, 0.015  # each format's band: a fraction of the panel's height
    top = 1 - len(formats) * (band + gap)  # the histograms stay below the bands
    fig, axes = plt.subplots(len(panels), 1, figsize=(10.5, 2.9 * len(panels) + 0.6), squeeze=False)
    for ax, (name, curves) in zip(axes[:, 0], panels.items()):
        handles, peak = [], 0.0
        for j, (label, hist) in enumerate(curves.items()):
            edges, counts = hist["edges"], hist["counts"]
            total = sum(counts) + hist["zeros"]
            share = [100 * c / max(total, 1) for c in counts]
            peak = max(peak, *share)
            zeros = f" ({100 * hist['zeros'] / max(total, 1):.2g}% exactly 0 in fp32, left out)" if hist["zeros"] else ""
            color = (colors or {}).get(label) or ("k" if j == 0 else f"C{j + 5}")
            handles.append(ax.stairs(share, edges, label=f"{label}{zeros}", linewidth=1.5, color=color,
                                     linestyle="-" if j == 0 else "--"))
        for k, fmt in enumerate(formats):
            color = COLORS.get(fmt.name, f"C{k + 4}")
            lo, mid, hi = (math.log2(v) for v in (fmt.min_subnormal, fmt.min_normal, fmt.max))
            y1 = 1 - k * (band + gap)
            ax.axvspan(lo, mid, ymin=y1 - band, ymax=y1, facecolor=color, alpha=0.25, edgecolor="none")
            ax.axvspan(mid, hi, ymin=y1 - band, ymax=y1, facecolor=color, alpha=0.75, edgecolor="none")
            for x, style in ((lo, "--"), (mid, ":"), (hi, "--")):
                ax.axvline(x, ymax=y1 - band, color=color, linestyle=style, linewidth=0.9, alpha=0.8)
            handles += [Patch(facecolor=color, alpha=0.75, label=f"{fmt.name} normal: 2^{mid:.0f} .. {fmt.max:.5g}"),
                        Patch(facecolor=color, alpha=0.25, label=f"{fmt.name} subnormal: 2^{lo:.0f} .. 2^{mid:.0f}")]
        first = next(iter(curves.values()))
        ax.set_xlim(first["edges"][0], first["edges"][-1])  # the values' span, not the widest format's
        ax.set_ylim(0, max(peak, 1e-9) * 1.05 / top)
        ax.set_title(name, fontsize=10)
        ax.set_ylabel("% of values")
        ax.grid(alpha=0.3)
        ax.legend(handles=handles, fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    axes[-1, 0].set_xlabel("log2 |value|  (left of a format's band: rounds to 0; right of it: overflows)")
    fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def gradient_ranges(path: Path, grads: dict, scale: float | None, formats: list) -> None:
    """Gradients (name -> fp32 tensor) as a histogram over binades, and times the loss scale when
    there is one, against each format's range (range_histograms)."""
    from plscale.rank import taps

    curves = {"x 1": taps.log2_histogram(grads.values())} | (
        {f"x S = 2^{math.log2(scale):g}": taps.log2_histogram(g * scale for g in grads.values())} if scale else {})
    range_histograms(path, {"gradients at the linears' outputs (fp32), and times the loss scale": curves}, formats,
                     "fp16 needs the scale; bf16 keeps fp32's range" if scale
                     else "fp16 without loss scaling; bf16 keeps fp32's range")
