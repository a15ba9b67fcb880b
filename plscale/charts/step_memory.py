"""A step's peak memory per rank, term by term, for a run and each of its fixes, against the limit (lab 12).

One horizontal bar a row, its terms stacked (states, kept, backward, gathered; offload's host part
hatched beside it, not counted against the device's limit), and the limit as a line: what fits is
left of it.
"""

from pathlib import Path

COLOURS = {"states": "#4c72b0", "kept": "#dd8452", "backward": "#c44e52", "gathered": "#8172b2"}


def fixes_chart(path: Path, rows: dict, limit_mib: float, title: str) -> None:
    """rows: name -> (terms {name: MiB on the device}, MiB on the host)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(rows)[::-1]   # the run on top
    fig, ax = plt.subplots(figsize=(9.6, 1.1 + 0.55 * len(names)))
    seen = set()
    for y, name in enumerate(names):
        terms, host = rows[name]
        left = 0.0
        for term, mib in terms.items():
            ax.barh(y, mib, left=left, color=COLOURS.get(term, "#999999"), height=0.6,
                    label=term if term not in seen else None)
            seen.add(term)
            left += mib
        if host:
            ax.barh(y, host, left=left, color="white", edgecolor="#4c72b0", hatch="//", height=0.6,
                    label="states on the host (not against the limit)" if "host" not in seen else None)
            seen.add("host")
        ax.text(left + host + 2, y, f"{left:.0f} MiB" + (f" + {host:.0f} host" if host else ""), va="center",
                fontsize=8)
    ax.axvline(limit_mib, color="black", linestyle="--", linewidth=1)
    ax.set_ylim(-1.0, len(names) - 0.4)
    ax.text(limit_mib, -0.75, f" limit {limit_mib:g} MiB", fontsize=8, va="center")
    ax.set_yticks(range(len(names)), names, fontsize=8)
    ax.set_xlabel("MiB per rank at the step's peak (plscale/predict/step_memory.py)")
    ax.set_xlim(0, 1.25 * max(sum(t.values()) + h for t, h in rows.values()))
    handles, labels = ax.get_legend_handles_labels()
    order = [*COLOURS, "states on the host (not against the limit)"]
    pairs = sorted(zip(labels, handles), key=lambda lh: order.index(lh[0]) if lh[0] in order else len(order))
    ax.legend([h for _, h in pairs], [lab for lab, _ in pairs], fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
