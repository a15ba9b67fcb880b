"""Pipeline timelines as pictures (matplotlib, headless): planned or measured Ops, one row per rank.

In the style of the Ultra-Scale Playbook's pipeline figures: a box per forward (blue),
backward (green) or weight-gradient pass (teal), its micro-batch number inside; model chunks
of an interleaved schedule in lighter and darker shades; send and recv as thin grey bars in
two lanes under the row (a send under its recv would be hidden), each at least COMM_MIN_PX
wide so a send of a few microseconds still shows (plscale's engine records a send batched
with a receive as one recv); idle time left white, so the bubble is what you see. Measured seconds are drawn in ms, so two steps of one lab share a unit.
"""

from pathlib import Path

from plscale.predict.pipeline import COMPUTE, Op

COLOURS = {"F": "#5b8fd6", "B": "#63b36b", "W": "#2f8f8a", "send": "#8c8c8c", "recv": "#c4c4c4"}
NAMES = {"F": "forward", "B": "backward", "W": "weight gradients (W)", "send": "send",
         "recv": "recv (or a send and a recv in one batch)"}
BOX = 0.78          # height of a compute box in a row of height 1
COMM = {"send": 0.43, "recv": 0.51}  # each lane's offset below the row's centre
COMM_THICK = 0.06
COMM_MIN_PX = 2.5   # the narrowest a send or recv bar is drawn, in pixels at the saved dpi
DPI = 120


def _shade(colour: str, chunk: int, chunks: int) -> tuple:
    """Chunk 0 in the full colour, each later chunk mixed a little more with white."""
    from matplotlib.colors import to_rgb

    if chunks <= 1:
        return to_rgb(colour)
    mix = 0.55 * chunk / (chunks - 1)
    return tuple(c + (1 - c) * mix for c in to_rgb(colour))


def _time_scale(span: float, unit: str) -> tuple[float, str]:
    """Seconds shown in ms when a step is shorter than a minute (so every measured step of a
    CPU or GPU run reads in one unit); other units as they are."""
    if unit == "s" and span < 60:
        return 1e3, "time (ms)"
    return 1.0, f"time ({unit})"


def _draw_on(ax, ops: list[Op], title: str, unit: str) -> None:
    from matplotlib.patches import Patch, Rectangle
    from matplotlib.transforms import offset_copy

    t0 = min(op.start for op in ops)
    span = max(op.end for op in ops) - t0
    scale, xlabel = _time_scale(span, unit)
    ranks = sorted({op.rank for op in ops})
    p = len(ranks)
    interleaved = any(op.stage >= 0 and op.stage != op.rank for op in ops)
    chunks = max((op.stage // p for op in ops if op.stage >= 0), default=0) + 1
    width_pts = ax.get_position().width * ax.figure.get_figwidth() * 72
    min_comm = COMM_MIN_PX * 72 / DPI / width_pts * span * scale     # in data units
    for op in ops:
        y = p - 1 - ranks.index(op.rank)
        x, w = (op.start - t0) * scale, (op.end - op.start) * scale
        if op.kind not in COMPUTE:
            lane = COMM.get(op.kind, COMM["recv"])
            ax.add_patch(Rectangle((x, y - lane - COMM_THICK), max(w, min_comm), COMM_THICK,
                                   color=COLOURS.get(op.kind, "grey"), lw=0))
            continue
        chunk = op.stage // p if op.stage >= 0 else 0
        ax.add_patch(Rectangle((x, y - BOX / 2), w, BOX, facecolor=_shade(COLOURS[op.kind], chunk, chunks),
                               edgecolor="white", lw=0.8))
        label = str(op.micro)
        box_pts = w / (span * scale) * width_pts
        size = min(9.0, 0.75 * box_pts / (0.6 * len(label)))
        if size >= 4:
            ax.text(x + w / 2, y, label, ha="center", va="center", fontsize=size, color="white", fontweight="bold")
    ax.set_xlim(0, span * scale)
    ax.set_ylim(-0.65, p - 0.45)
    ax.set_yticks(range(p), [f"{'rank' if interleaved else 'stage'} {r}" for r in reversed(ranks)])
    ax.tick_params(axis="y", length=0)
    ax.set_xlabel(xlabel)
    ax.set_title(title, fontsize=10)
    for side in ("top", "right", "left"):
        ax.spines[side].set_visible(False)
    kinds = [k for k in COLOURS if any(op.kind == k for op in ops)]
    names = {**NAMES, "B": "input gradients (B)"} if "W" in kinds else NAMES
    handles = [Patch(color=COLOURS[k], label=names[k]) for k in kinds]
    if interleaved:
        handles += [Patch(color=_shade("#808080", c, chunks), label=f"chunk {c}") for c in range(chunks)]
    handles.append(Patch(facecolor="white", edgecolor="#999999", label="idle (bubble)"))
    below_xlabel = offset_copy(ax.transAxes, fig=ax.figure, y=-34, units="points")
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, 0), bbox_transform=below_xlabel,
              ncol=len(handles), fontsize=8, frameon=False)


def _figure_width(ops: list[Op]) -> float:
    per_rank = max(sum(1 for op in ops if op.rank == r and op.kind in COMPUTE) for r in {op.rank for op in ops})
    return min(22.0, max(8.0, 0.42 * per_rank * 1.3))


def _row_height(ops: list[Op]) -> float:
    return 0.5 * len({op.rank for op in ops}) + 1.6


def draw(path: Path, ops: list[Op], title: str, unit: str = "s") -> None:
    """One timeline; times are made relative to the earliest start."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(_figure_width(ops), _row_height(ops)))
    fig.subplots_adjust(left=0.08, right=0.98)
    _draw_on(ax, ops, title, unit)
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)


def draw_pair(path: Path, measured_ops: list[Op], planned_ops: list[Op], title_measured: str,
              title_planned: str, unit_measured: str = "s", unit_planned: str = "units of one forward") -> None:
    """The measured timeline above the planned one, in one PNG."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    heights = [_row_height(measured_ops), _row_height(planned_ops)]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(max(_figure_width(measured_ops), _figure_width(planned_ops)),
                                                      sum(heights) + 0.4), height_ratios=heights)
    fig.subplots_adjust(left=0.08, right=0.98)
    _draw_on(top, measured_ops, title_measured, unit_measured)
    _draw_on(bottom, planned_ops, title_planned, unit_planned)
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)


def bubble_chart(path: Path, rows: list[dict], title: str) -> None:
    """Bubble fraction against micro-batches m: the theory as a line, the measured bubble as
    points; any other numeric key of the rows is one more series of points."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import PercentFormatter

    rows = sorted(rows, key=lambda r: r["m"])
    fig, ax = plt.subplots(figsize=(7, 4))
    ms = [r["m"] for r in rows]
    ax.plot(ms, [r["theory"] for r in rows], "-", color="black", lw=1.5, label="theory")
    series = [k for k in dict.fromkeys(k for r in rows for k in r) if k not in ("m", "theory")]
    markers = "os^vD<>"
    for i, name in enumerate(series):
        points = [(r["m"], r[name]) for r in rows if isinstance(r.get(name), (int, float))]
        if points:
            ax.plot(*zip(*points), markers[i % len(markers)], ms=6, label=name)
    ax.set_xscale("log", base=2)
    ax.set_xticks(ms, [str(m) for m in ms])
    ax.yaxis.set_major_formatter(PercentFormatter(1.0, decimals=0))
    ax.set_ylim(bottom=0)
    ax.set_xlabel("micro-batches per step (m)")
    ax.set_ylabel("bubble (idle fraction)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
