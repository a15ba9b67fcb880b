"""`plscale mesh`: which ranks form each process group, as a table and as a picture.

Host side: plscale.predict.grid computes the groups; matplotlib is imported only to draw them.
"""

from pathlib import Path

import typer
from rich.table import Table

from plscale.charts.plots import mesh_grid  # matplotlib is imported inside, when drawing
from plscale.cli.flags import speaks_flags
from plscale.cli.output import console, png_path
from plscale.predict.grid import DIMS, ORDER, Layout

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


@speaks_flags()
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
    mesh_grid(layout, path)
    console.print(f"wrote {path}")
