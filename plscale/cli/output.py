"""The consoles the commands print with: wide when piped (logs, CI), the terminal's own width otherwise."""

import sys
from pathlib import Path

from rich.console import Console
from rich.markup import escape

from plscale.errors import UserError


def make_console(stderr: bool = False) -> Console:
    stream = sys.stderr if stderr else sys.stdout
    return Console(stderr=stderr, width=None if stream.isatty() else 160)


console = make_console()


def png_path(flag: str, path: Path) -> Path:
    """A PNG a command will write, checked before anything is written: one line naming the fix."""
    if path.is_dir():
        raise UserError(f"{flag} {path} is a folder: give a file in it, e.g. {flag} {path / 'picture.png'}.")
    if path.suffix.lower() != ".png":
        raise UserError(f"{flag} {path} does not end in .png: e.g. {flag} {path.with_suffix('.png')}.")
    if not path.parent.is_dir():
        raise UserError(f"{flag} {path}: folder {path.parent} does not exist: create it or pick another path.")
    return path


class Progress:
    """A spinner for long waits on a terminal; elsewhere (logs, CI) one line per new step (a step's
    message up to its first " (": the rest, such as seconds waited, changes as it goes)."""

    def __init__(self):
        self.err = make_console(stderr=True)
        self.live = self.err.status("") if self.err.is_terminal else None
        self.last = None

    def __enter__(self):
        if self.live:
            self.live.__enter__()
        return self

    def __exit__(self, *exc):
        if self.live:
            self.live.__exit__(*exc)

    def __call__(self, message: str) -> None:
        if self.live:
            self.live.update(escape(message))
            return
        step = message.split(" (")[0]
        if step != self.last:
            self.err.print(escape(message), highlight=False)
            self.last = step
