"""Errors a user can cause: the CLI prints their message as one line and exits 2."""

import difflib


class UserError(Exception):
    """Bad input from the user. The message says what is wrong and how to fix it."""

    exit_code = 2


def nearest(word: str, choices, n: int = 3) -> list[str]:
    """The closest matches to `word` among `choices`, best first."""
    return difflib.get_close_matches(word, list(choices), n=n, cutoff=0.4)


def did_you_mean(word: str, choices) -> str:
    close = nearest(word, choices)
    return f" Did you mean: {', '.join(close)}?" if close else ""
