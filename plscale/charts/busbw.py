"""Bus bandwidth against message size, as `plscale bench collectives` and the collectives lab
(lab 03) draw it: one line per collective, the hand-written ring and the naive all-reduce beside
all_reduce, and the ring's time over the library's below. The figures and their convention
(nccl-tests' algbw and busbw) are plscale.predict.busbw's."""

from pathlib import Path

from plscale.predict.busbw import human


def plot(path: Path, rows: list[dict], title: str) -> None:
    """Bus bandwidth against message size, one line per collective (plus the hand-written ring
    and the naive all-reduce when they ran); below, the ring's time over the library's."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ratios = [r for r in rows if r.get("ratio")]
    fig, axes = plt.subplots(2 if ratios else 1, 1, figsize=(7.5, 6.5 if ratios else 4.2), squeeze=False,
                             gridspec_kw={"height_ratios": [3, 1.3]} if ratios else None)
    ax = axes[0][0]
    for op in dict.fromkeys(r["op"] for r in rows):
        mine = [r for r in rows if r["op"] == op]
        ax.plot([r["size"] for r in mine], [r["busbw"] for r in mine], "o-", ms=3, label=op)
        if op == "all_reduce" and ratios:
            ax.plot([r["size"] for r in mine], [r["ring_busbw"] for r in mine], "s--", ms=3,
                    label="all_reduce, hand-written ring")
        if op == "all_reduce" and any(r.get("naive_busbw") for r in mine):
            ax.plot([r["size"] for r in mine], [r["naive_busbw"] for r in mine], "^:", ms=3,
                    label="all_reduce, naive (via rank 0)")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_ylabel("bus bandwidth (GB/s)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    if ratios:
        ax2 = axes[1][0]
        ax2.plot([r["size"] for r in ratios], [r["ratio"] for r in ratios], "s-", ms=3, color="C3")
        ax2.axhline(1.0, color="grey", lw=0.8)
        ax2.set_xscale("log", base=2)
        ax2.set_yscale("log")
        ax2.set_ylabel("ring / library\n(time)")
        ax2.grid(alpha=0.3)
    last = axes[-1][0]
    sizes = sorted({r["size"] for r in rows})
    last.set_xticks(sizes, [human(s) for s in sizes], rotation=45, fontsize=7)
    if ratios:
        ax.set_xticks(sizes, [""] * len(sizes))
    last.set_xlabel("message size (bytes)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
