"""PNG plots of runs (matplotlib, headless)."""

from pathlib import Path


def line_plot(path: Path, curves: dict, title: str, xlabel: str = "step", ylabel: str = "loss",
              styles: dict | None = None) -> None:
    """curves: label -> (xs, ys)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for label, (xs, ys) in curves.items():
        ax.plot(xs, ys, (styles or {}).get(label, "-"), label=label, linewidth=1.5)
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def curves_and_gaps(path: Path, curves: dict, reference: str, title: str, styles: dict | None = None) -> None:
    """Top: the curves (label -> (xs, ys)). Bottom: |curve - reference| on a log scale, where
    agreement to float precision is visible and not just 'the lines overlap'."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(7, 6), sharex=True, height_ratios=[3, 2])
    ref_xs, ref_ys = curves[reference]
    for label, (xs, ys) in curves.items():
        style = (styles or {}).get(label, "-")
        top.plot(xs, ys, style, label=label, linewidth=1.5)
        if label != reference:
            gaps = [max(abs(a - b), 1e-10) for a, b in zip(ys, ref_ys)]
            bottom.semilogy(xs, gaps, style, label=f"|{label} - {reference}|", linewidth=1.2)
    top.set_title(title)
    top.set_ylabel("loss")
    bottom.set_ylabel("|gap| (floor 1e-10)")
    bottom.set_xlabel("step")
    for ax in (top, bottom):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def interval_chart(rows, mtbf_s: float, path: Path, title: str = "checkpoint interval against time lost",
                   restart_s: float = 0.0) -> None:
    """Waste (%) against the checkpoint interval in steps (log, 1..10000), one curve per
    strategy; rows: (name, stall_s, step_time_s). Each curve's Young optimum, sqrt(2δM), is
    marked and labelled. The model: plscale/predict/checkpoint.py."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from plscale.predict.checkpoint import waste_fraction, young_interval

    steps = [10 ** (i / 50) for i in range(201)]                      # 1 .. 10000, log-spaced
    fig, ax = plt.subplots(figsize=(7, 4))
    optima = []
    for i, (name, stall_s, step_s) in enumerate(rows):
        waste = [100 * waste_fraction(k * step_s, stall_s, mtbf_s, restart_s) for k in steps]
        (line,) = ax.plot(steps, waste, label=f"{name} (stall {stall_s:.3g} s, step {step_s:.3g} s)", linewidth=1.5)
        best = young_interval(stall_s, mtbf_s) / step_s
        best_waste = 100 * waste_fraction(best * step_s, stall_s, mtbf_s, restart_s)
        optima.append(best_waste)
        ax.plot([best], [best_waste], "o", color=line.get_color())
        right = best > 300                                            # keep the label inside the axes
        ax.annotate(f"every {best:,.0f} steps: {best_waste:.2f} %", (best, best_waste), textcoords="offset points",
                    xytext=(-6 if right else 6, 10 + 11 * i), ha="right" if right else "left", fontsize=8,
                    color=line.get_color(), arrowprops={"arrowstyle": "-", "color": line.get_color(), "lw": 0.5})
    ax.set_xscale("log")
    ax.set_xlim(1, 10_000)
    ax.set_ylim(0, min(100.0, 4 * max(optima, default=25.0)))
    ax.set_title(f"{title} (MTBF {mtbf_s / 3600:g} h)")
    ax.set_xlabel("checkpoint every k steps")
    ax.set_ylabel("time lost (%)")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
