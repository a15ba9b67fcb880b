"""The consoles the commands print with: wide when piped (logs, CI), the terminal's own width otherwise."""

import sys

from rich.console import Console


def make_console(stderr: bool = False) -> Console:
    stream = sys.stderr if stderr else sys.stdout
    return Console(stderr=stderr, width=None if stream.isatty() else 160)


console = make_console()
