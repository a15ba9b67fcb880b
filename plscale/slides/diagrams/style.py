"""One look for every drawn diagram: the palette, a figure sized for a slide, boxes, cells and arrows.

A slide is 1280 x 720 px; a figure of the default size (11 x 5 in at 110 dpi, 1210 x 550 px)
fills its width under a heading. `figure(h=4)` leaves room for two lines of text.
"""

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch, Rectangle  # noqa: E402

from plscale.files import replacing  # noqa: E402

DPI = 110
NAVY, BLUE, SKY, SAND, RED, GREEN, GREY = "#1d3557", "#457b9d", "#a8dadc", "#e0a458", "#e63946", "#2a9d8f", "#8a8f99"
PALETTE = [BLUE, SAND, GREEN, RED, NAVY, SKY, "#9b5de5", GREY]

plt.rcParams.update({"font.size": 13, "axes.spines.top": False, "axes.spines.right": False,
                     "axes.titlesize": 15, "axes.titleweight": "bold", "axes.labelsize": 13,
                     "legend.frameon": False, "figure.dpi": DPI})


def figure(w: float = 11, h: float = 5, **subplots):
    """A figure and its axes (subplots' nrows/ncols pass through)."""
    return plt.subplots(figsize=(w, h), **subplots)


def canvas(w: float = 11, h: float = 5, xlim=(0, 11), ylim=(0, 5)):
    """A blank drawing surface in data units (default: 1 unit = 1 inch), no axes shown."""
    fig, ax = plt.subplots(figsize=(w, h))
    ax.set_xlim(*xlim)
    ax.set_ylim(*ylim)
    ax.set_aspect("auto")
    ax.axis("off")
    return fig, ax


def box(ax, x: float, y: float, w: float, h: float, text: str = "", color: str = SKY,
        text_color: str = "black", size: float = 12, edge: str = NAVY, weight: str = "normal"):
    """A rounded box with centred text; (x, y) is its lower-left corner."""
    ax.add_patch(FancyBboxPatch((x, y), w, h, boxstyle="round,pad=0.02,rounding_size=0.08",
                                facecolor=color, edgecolor=edge, linewidth=1.2))
    if text:
        ax.text(x + w / 2, y + h / 2, text, ha="center", va="center", fontsize=size, color=text_color,
                weight=weight, wrap=True)


def rect(ax, x: float, y: float, w: float, h: float, color: str, edge: str = "none", lw: float = 1.0):
    """A plain rectangle (a cell of a grid, a bar of a timeline); (x, y) is its lower-left corner."""
    return ax.add_patch(Rectangle((x, y), w, h, facecolor=color, edgecolor=edge, linewidth=lw))


def arrow(ax, start, end, color: str = NAVY, text: str = "", size: float = 11, style: str = "-|>",
          both: bool = False, rad: float = 0.0):
    """An arrow from start to end (x, y), optionally labelled at its middle."""
    ax.add_patch(FancyArrowPatch(start, end, arrowstyle="<|-|>" if both else style, mutation_scale=14,
                                 color=color, linewidth=1.6, connectionstyle=f"arc3,rad={rad}"))
    if text:
        ax.text((start[0] + end[0]) / 2, (start[1] + end[1]) / 2, text, ha="center", va="bottom",
                fontsize=size, color=color)


def save(fig, out: Path, name: str) -> Path:
    """Write the figure as out/name (PNG), close it, return the path."""
    path = out / name
    fig.tight_layout()
    with replacing(path) as partial:  # an interrupted redraw leaves the committed figure whole
        fig.savefig(partial, dpi=DPI, facecolor="white", format="png")
    plt.close(fig)
    return path
