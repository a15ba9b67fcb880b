"""A profiled step as a picture: per rank, a lane of compute and a lane of communication.

The lanes come from plscale.rank.trace.parts (unions of intervals, microseconds; `hidden` where both run); communication
that runs while compute does is drawn in a darker shade, so the overlap (or its absence) is
what you see, and white is idle.
"""

from pathlib import Path

COMPUTE, COMM, HIDDEN = "#5b8fd6", "#e8a13a", "#9a5d0c"


def draw(path: Path, per_rank: dict, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    origin = min(p["window"][0] for p in per_rank.values())
    fig, ax = plt.subplots(figsize=(11, 0.9 + 0.8 * len(per_rank)))
    ms = lambda spans: [((s - origin) / 1e3, (e - s) / 1e3) for s, e in spans]  # noqa: E731
    for row, (rank, p) in enumerate(sorted(per_rank.items())):
        y = len(per_rank) - 1 - row
        ax.broken_barh(ms(p["compute"]), (y + 0.05, 0.4), color=COMPUTE)
        ax.broken_barh(ms(p["comm"]), (y - 0.4, 0.35), color=COMM)
        ax.broken_barh(ms(p["hidden"]), (y - 0.4, 0.35), color=HIDDEN)
    ax.set_yticks(range(len(per_rank)))
    ax.set_yticklabels([f"rank {r}" for r in sorted(per_rank, reverse=True)])
    ax.set_xlabel("time in the step (ms)")
    ax.set_title(title, loc="left", pad=22)  # room for the legend between the title and the bars
    ax.legend(handles=[Patch(color=COMPUTE, label="compute"), Patch(color=COMM, label="communication or waiting for a peer, exposed"),
                       Patch(color=HIDDEN, label="communication, hidden behind compute")],
              loc="lower left", bbox_to_anchor=(0.0, 1.0), ncol=3, frameon=False, fontsize=9)
    ax.spines[["top", "right"]].set_visible(False)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
