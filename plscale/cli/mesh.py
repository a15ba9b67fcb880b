"""`plscale mesh`: which ranks form each process group, as a table and as a picture.

Host side: plscale.mesh computes the groups; matplotlib is imported only to draw them.
"""

from pathlib import Path

import typer
from rich.table import Table

from plscale.cli.output import console, png_path
from plscale.mesh import DIMS, ORDER, Layout

SHOWN_GROUPS = 16   # groups listed per dimension before "... and N more"
COORD_TABLE_MAX = 64  # ranks up to which every rank's coordinates are listed


def _png_path(png: Path | None, layout: Layout) -> Path:
    """The PNG to write, checked before anything is written."""
    if png is None:
        extra = "".join(f"-{n}{getattr(layout, n)}" for n in ("cp", "ep") if getattr(layout, n) > 1)
        png = Path(f"mesh-{layout.world}-tp{layout.tp}-pp{layout.pp}{extra}.png")
    return png_path("--png", png)


def _shown_dims(layout: Layout) -> list[str]:
    """dp, and the dimensions with more than one rank per group, less combinations equal to
    one shown; ep and edp when there are experts."""
    shown, seen = [], []
    for dim in DIMS:
        groups = layout.groups(dim)
        if dim in ("ep", "edp") and layout.ep == 1 or dim != "dp" and layout.size(dim) == 1 \
                or "-" in dim and groups in seen:
            continue
        shown.append(dim)
        seen.append(groups)
    return shown


def _groups_table(layout: Layout) -> Table:
    table = Table(title=f"process groups: {layout} (Megatron order {ORDER}, tp fastest)",
                  title_justify="left", show_lines=True)
    for column in ("group", "size", "count", "ranks", "what it is for"):
        table.add_column(column, justify="right" if column in ("size", "count") else "left",
                         overflow="fold")
    for dim in _shown_dims(layout):
        groups = layout.groups(dim)
        text = " ".join("[" + ",".join(map(str, g)) + "]" for g in groups[:SHOWN_GROUPS])
        if len(groups) > SHOWN_GROUPS:
            text += f" ... and {len(groups) - SHOWN_GROUPS} more"
        table.add_row(f"[bold]{dim}[/]", str(layout.size(dim)), str(len(groups)), text, DIMS[dim])
    return table


def _coords_table(layout: Layout) -> Table:
    names = ["pp", "dp", "cp", "tp"] + (["ep", "edp"] if layout.ep > 1 else [])
    table = Table(title="rank coordinates", title_justify="left")
    for column in ["rank", *names]:
        table.add_column(column, justify="right")
    for rank in range(layout.world):
        coords = layout.coords(rank)
        table.add_row(str(rank), *(str(coords[n]) for n in names))
    return table


def draw(layout: Layout, path: Path) -> None:
    """One panel per pipeline stage; inside, a row per (dp, cp) and a column per tp rank,
    so a row is a tensor-parallel group (one colour each, the same in every stage), a
    column a data-parallel one, and the same box in every panel a pipeline group."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyBboxPatch

    rows, cols, pp = layout.dp * layout.cp, layout.tp, layout.pp
    across = min(pp, 4)  # stages per row of panels
    down = -(-pp // across)
    width, height = across * (cols + 1.2), down * (rows * 0.6 + 1.2)
    scale = min(1.0, 24 / width, 24 / height)
    fig, panels = plt.subplots(down, across, squeeze=False,
                               figsize=(max(3.5, width * scale), max(2.5, height * scale)))
    for ax in panels.flat[pp:]:
        ax.set_visible(False)
    colours = plt.get_cmap("tab20" if rows > 10 else "tab10")
    font = max(3.0, 9 * scale)
    for rank in range(layout.world):
        c = layout.coords(rank)
        ax, row = panels.flat[c["pp"]], c["dp"] * layout.cp + c["cp"]
        ax.add_patch(FancyBboxPatch((c["tp"] + 0.06, rows - row - 0.94), 0.88, 0.84,
                                    boxstyle="round,pad=0,rounding_size=0.08",
                                    facecolor=colours(row % colours.N), alpha=0.85, edgecolor="black"))
        experts = f"\nep{c['ep']} edp{c['edp']}" if layout.ep > 1 and layout.world <= 256 else ""
        ax.text(c["tp"] + 0.5, rows - row - 0.52, f"{rank}{experts}", ha="center", va="center",
                fontsize=font, fontweight="bold")
    for stage, ax in enumerate(panels.flat[:pp]):
        ax.set_xlim(0, cols)
        ax.set_ylim(0, rows)
        ax.set_xticks([t + 0.5 for t in range(cols)], [f"tp{t}" for t in range(cols)], fontsize=font)
        ylabels = [f"dp{r // layout.cp}" + (f" cp{r % layout.cp}" if layout.cp > 1 else "") for r in range(rows)]
        ax.set_yticks([rows - r - 0.5 for r in range(rows)], ylabels if stage % across == 0 else [], fontsize=font)
        ax.tick_params(length=0)
        for side in ax.spines.values():
            side.set_visible(False)
        ax.set_title(f"pipeline stage pp{stage}", fontsize=font + 1)
    notes = ["row = a tensor-parallel group (one colour, the same in every stage)",
             "column = a data-parallel group" if layout.cp == 1 else
             "column = a dp-cp group; in it, rows of one cp index form a dp group, of one dp index a cp group"]
    notes += ["the same box in every stage = a pipeline group"] * (pp > 1)
    notes += ["epN edpN = the rank's place in its expert-parallel and expert-data-parallel groups"] * (layout.ep > 1)
    fig.suptitle(str(layout).replace("; ", "\n") + "\n" + "\n".join(notes), fontsize=font)
    fig.tight_layout()
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)


def mesh(
    gpus: int = typer.Option(8, help="Ranks in all: tp x cp x dp x pp."),
    tp: int = typer.Option(1, help="Tensor-parallel degree (neighbouring ranks)."),
    pp: int = typer.Option(1, help="Pipeline-parallel degree (the farthest ranks)."),
    cp: int = typer.Option(1, help="Context-parallel degree."),
    ep: int = typer.Option(1, help="Expert-parallel degree; must divide dp x cp."),
    png: Path = typer.Option(None, help="Where to draw the grid (default: mesh-GPUS-tpN-ppN.png here)."),
) -> None:
    """Which ranks form each process group (tp, cp, dp, pp, ep), in Megatron-LM's order.

    rank = tp_i + tp * (cp_i + cp * (dp_i + dp * pp_i)), dp = gpus / (tp * cp * pp).
    Prints the groups and each rank's coordinates, and draws the grid as a PNG.
    """
    layout = Layout(gpus, tp=tp, pp=pp, cp=cp, ep=ep)
    path = _png_path(png, layout)
    console.print(_groups_table(layout))
    if layout.world <= COORD_TABLE_MAX:
        console.print(_coords_table(layout))
    else:
        console.print(f"({layout.world} ranks: coordinates listed up to {COORD_TABLE_MAX} ranks)")
    draw(layout, path)
    console.print(f"wrote {path}")
