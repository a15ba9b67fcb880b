"""A prediction's error in the words of the command the user typed.

plscale.predict raises a PredictionError naming the quantity ("seq", "tp", "gpus", ...), never a
flag. A command decorated with `@speaks_flags()` words it with its own flags: the option whose
parameter is the quantity (`seq` -> `--seq`, `global_batch` -> `--global-batch`, `model` -> the
first of `--model/-m`), or an override the command gives where its flag and the quantity differ
(`@speaks_flags(gpus="--ranks")`). A quantity the command has no option for keeps its own name,
so the user is never told about a flag they cannot type.

    plscale estimate memory --seq 100 --cp 3 --gpus 3
    error: --seq 100 does not split over --cp 3 ranks: use a multiple of 3.
"""

import functools
import inspect

from typer.models import OptionInfo

from plscale.predict.errors import PredictionError, worded


def options(command) -> dict[str, str]:
    """parameter -> its long flag, read from a Typer command's signature (typer.Option defaults)."""
    out = {}
    for name, param in inspect.signature(command).parameters.items():
        if isinstance(param.default, OptionInfo):
            decls = [d for d in (param.default.param_decls or ()) if d.startswith("--")]
            out[name] = decls[0].split("/")[0] if decls else "--" + name.replace("_", "-")
    return out


def namer(command, **overrides):
    """quantity -> the flag `command` takes it with; the quantity itself where it takes none."""
    flags = {**options(command), **overrides}
    return lambda quantity: flags.get(quantity, quantity)


def in_flags(text: str, command, **overrides) -> str:
    """A prediction's text with `{quantity}` places (plan.no_layout_reason) worded as `command`'s flags."""
    return worded(text, namer(command, **overrides))


def speaks_flags(**overrides):
    """Decorate a command: a PredictionError out of it names the command's flags (module doc)."""
    def decorate(command):
        name = namer(command, **overrides)

        @functools.wraps(command)
        def run(*args, **kwargs):
            try:
                return command(*args, **kwargs)
            except PredictionError as exc:
                raise exc.named(name) from None
        return run
    return decorate
