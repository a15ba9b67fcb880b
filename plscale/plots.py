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
