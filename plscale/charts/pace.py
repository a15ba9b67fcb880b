"""Where each rank's step goes: compute, then waiting in the gradient all-reduce (lab 12).

A straggler is the rank with the tallest compute bar; the others' wait bars are its excess:
data parallelism runs at the pace of its slowest rank.
"""

from pathlib import Path


def pace_chart(path: Path, compute_ms: list, wait_ms: list, title: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ranks = range(len(compute_ms))
    fig, ax = plt.subplots(figsize=(1.6 + 1.1 * len(compute_ms), 3.4))
    ax.bar(ranks, compute_ms, 0.6, color="#4c72b0", label="compute (forward + backward)")
    ax.bar(ranks, wait_ms, 0.6, bottom=compute_ms, color="#dd8452", label="wait in the all-reduce")
    for r in ranks:
        ax.text(r, compute_ms[r] + wait_ms[r], f"{compute_ms[r]:.0f} + {wait_ms[r]:.0f}", ha="center",
                va="bottom", fontsize=8)
    ax.set_xticks(list(ranks), [f"rank {r}" for r in ranks])
    ax.set_ylabel("ms per step")
    ax.set_ylim(0, 1.2 * max(c + w for c, w in zip(compute_ms, wait_ms)) or 1)
    ax.legend(fontsize=8, loc="upper left")
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
