"""The error a prediction raises on an input it cannot take, naming the quantity, not a flag.

predict is asked by the CLI (`plscale estimate memory --seq 100`), by the run layer (a lab's
settings, `--set model.seq=100`) and by lab scripts: each spells the same quantity its own way.
So a PredictionError carries the quantity's own name (`seq`, `tp`, `gpus`, `precision`, ...),
the value given and the problem, and words itself with whatever names its caller passes:

    >>> exc = PredictionError("seq", 100, " does not split over {cp} 3 ranks: use a multiple of 3.")
    >>> str(exc)
    'seq 100 does not split over cp 3 ranks: use a multiple of 3.'
    >>> str(exc.named({"seq": "model.seq", "cp": "parallel.cp"}))
    'model.seq 100 does not split over parallel.cp 3 ranks: use a multiple of 3.'

The message reads "<quantity> <value><problem>" (with lead=False, the problem alone, which then
names the quantity itself where it wants to); `{name}` in the problem stands for a quantity,
worded the same way. A PredictionError is a UserError: uncaught, it is one line and
exit code 2 like any other.
"""

import re
from collections.abc import Callable, Mapping

from plscale.errors import UserError

_REFERENCE = re.compile(r"\{([a-z][a-z0-9_]*)\}")

Names = Mapping[str, str] | Callable[[str], str] | None


def namer(names: Names) -> Callable[[str], str]:
    """A quantity -> the caller's word for it: a mapping (unlisted quantities keep their own
    name), a function, or None (every quantity its own name)."""
    if names is None:
        return lambda quantity: quantity
    if callable(names):
        return names
    return lambda quantity: names.get(quantity, quantity)


def worded(text: str, names: Names = None) -> str:
    """`text` with each `{quantity}` in it replaced by the caller's word for that quantity."""
    name = namer(names)
    return _REFERENCE.sub(lambda m: name(m.group(1)), text)


def shown(value) -> str:
    """How a value is written after its quantity's name: strings quoted, numbers as they are."""
    return repr(value) if isinstance(value, str) else str(value)


class PredictionError(UserError):
    """An input a prediction cannot take. `quantity` is its own name ("seq", "tp", "gpus",
    "precision", ...), `value` what was given, `problem` the rest of the sentence (it may name
    quantities as `{tp}`); `show` how the value is written ("" leaves it out); `lead` False: the
    problem is the whole sentence."""

    def __init__(self, quantity: str, value, problem: str, show: str | None = None, lead: bool = True,
                 names: Names = None):
        self.quantity, self.value, self.problem, self.lead = quantity, value, problem, lead
        self.show = shown(value) if show is None else show
        self.names = names
        super().__init__(self.worded(names))

    def worded(self, names: Names = None) -> str:
        """The one-line message, each quantity worded as `names` says (default: its own name)."""
        name = namer(names)
        head = name(self.quantity) + (f" {self.show}" if self.show else "") if self.lead else ""
        return head + worded(self.problem, name)

    def named(self, names: Names) -> "PredictionError":
        """The same error worded with the caller's names: a CLI's flags, a lab's settings."""
        return PredictionError(self.quantity, self.value, self.problem, self.show, self.lead, names)
