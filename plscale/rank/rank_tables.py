"""Every rank's values side by side, printed by rank 0 as a table (lab 03 shows each collective
so: what every rank held before it and after it).

    before = every_rank(x)                                   # a collective: every rank calls it
    show(ctx, "all_reduce", "what training uses it for", ["rank", "before"],
         [[str(r), numbers(v)] for r, v in enumerate(before)])
"""

from rich.console import Console
from rich.table import Table

from plscale.rank.distributed import gathered

CONSOLE = Console(width=140, highlight=False)


def every_rank(t) -> list:
    """Every rank's tensor as a list of numbers (None where a rank has none), on every rank."""
    return gathered(None if t is None else t.cpu().tolist())


def numbers(values) -> str:
    """A tensor's numbers as "1 2 3", "—" where nothing is defined."""
    return "—" if values is None else " ".join(f"{v:g}" for v in values)


def show(ctx, name: str, use: str, columns: list[str], rows: list[list[str]]) -> None:
    """The table, under its name and what it is for, on rank 0."""
    if ctx.is_main:
        table = Table(*columns)
        for row in rows:
            table.add_row(*row)
        CONSOLE.print(f"\n[bold]{name}[/]: {use}")
        CONSOLE.print(table)
