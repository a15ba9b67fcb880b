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
