"""Boolean flags shown in `--help` without a value.

Typer 0.29 prints every option's type in its rich help panel, flags included, so
`--dry-run <bool>` reads as if it took a value; its plain (non-rich) help and older Typers
(which skipped "BOOLEAN") show the flag alone. `show_flags_bare()` makes the rich panel do
the same for every command: a flag (`--cpu`, `--dry-run`, `--help`, `--x/--no-x`) gets no
type column, every other option keeps its own.
"""

from typer import core


def show_flags_bare() -> None:
    option = getattr(core, "TyperOption", None)
    shown = getattr(option, "display_type_rich", None)
    if shown is None or getattr(shown, "_flags_bare", False):
        return  # an older Typer: its help already leaves flags bare

    def display_type_rich(self, ctx):
        if self.is_flag and not self.count:
            return None
        return shown(self, ctx)

    display_type_rich._flags_bare = True
    option.display_type_rich = display_type_rich
