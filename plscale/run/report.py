"""Render a run's summary.json as a rich table: each measured figure beside its prediction."""

from pathlib import Path

from rich.console import Console
from rich.table import Table

from plscale.errors import UserError
from plscale.files import read_json


def fmt(value) -> str:
    if isinstance(value, float):
        return f"{value:.4g}" if abs(value) < 1e4 else f"{value:,.0f}"
    return "" if value is None else str(value)


def summary_table(summary: dict) -> Table:
    table = Table(title=f"{summary.get('lab', '?')} / {summary.get('variant', '?')}: summary",
                  title_justify="left")
    for column in ("figure", "measured", "unit", "predicted", "note"):
        table.add_column(column, justify="right" if column in ("measured", "predicted") else "left")
    for row in summary.get("figures", []):
        table.add_row(row["name"], fmt(row.get("value")), row.get("unit", ""), fmt(row.get("predicted")),
                      row.get("note", ""))
    return table


def show(run_dir: Path, console: Console) -> None:
    path = Path(run_dir) / "summary.json"
    if not path.exists():
        raise UserError(f"{run_dir} has no summary.json: the run did not finish. See its rank_0.log.")
    summary = read_json(path)
    console.print(summary_table(summary))
    data = summary.get("data")
    if data:
        console.print(f"data: {data}")
    for plot in summary.get("plots", []):
        console.print(f"plot: {Path(run_dir) / plot}")
    console.print(f"run directory: {run_dir}")
