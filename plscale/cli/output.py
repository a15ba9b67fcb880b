"""The consoles the commands print with: wide when piped (logs, CI), the terminal's own width otherwise."""

import sys
from pathlib import Path

from rich.console import Console

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
