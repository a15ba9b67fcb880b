r"""Measured numbers in a deck come from the labs' reference.json, never typed by hand.

A deck writes `{{LAB/VARIANT: FIGURE}}` and the build puts in the figure's value and unit from
labs/<lab>/reference.json (measured by benchmarks/make_references.py). `{{LAB/VARIANT: FIGURE |
predicted}}` gives the prediction the lab printed beside it (`\|` inside a table cell); `wall` is the reference run's wall
time and `command` the command that measured it.
"""

import re
from functools import cache

from plscale.lab import labs as lab_registry
from plscale.run import references

PLACEHOLDER = re.compile(r"\{\{\s*([^{}/]+?)\s*/\s*([^{}:]+?)\s*:\s*([^{}|]+?)\s*(?:\\?\|\s*(predicted)\s*)?\}\}")


def fmt(value) -> str:
    """A number as a slide shows it: four significant digits, thousands separated, tiny ones in e-form."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return str(value)
    if value == 0:
        return "0"
    if isinstance(value, int) or abs(value) >= 1e3:
        return f"{value:,.0f}"
    return f"{value:.4g}" if abs(value) >= 1e-3 else f"{value:.1e}"


def with_unit(value, unit: str) -> str:
    if not unit:
        return fmt(value)
    return f"{fmt(value)}{unit}" if unit in ("%", "x") else f"{fmt(value)} {unit}"


def _reference(lab_id: str) -> dict:
    return _reference_in(str(lab_registry.labs_root()), lab_id)


@cache
def _reference_in(root: str, lab_id: str) -> dict:
    """The CPU entries of a lab's reference.json (cached per labs folder)."""
    lab, _ = lab_registry.find(lab_id)
    return (references.load(lab.folder) or {}).get("cpu") or {}


def lookup(lab_id: str, variant: str, name: str, predicted: bool = False) -> str:
    """The text for one placeholder; raises KeyError with the reason when it cannot be filled."""
    try:
        entries = _reference(lab_id)
    except Exception as exc:  # an unknown lab: UserError from the registry
        raise KeyError(str(exc)) from None
    entry = entries.get(variant)
    if entry is None:
        raise KeyError(f"lab {lab_id}'s reference.json has no CPU entry {variant!r} (it has: {', '.join(entries) or 'none'})")
    if name in ("wall", "command"):
        key = "wall_s" if name == "wall" else "command"
        if key not in entry:
            raise KeyError(f"{lab_id}/{variant} in its reference.json has no {key!r}: measure it again "
                           f"(benchmarks/make_references.py {lab_id})")
        return f"{entry[key]:.0f} s" if name == "wall" else f"`{entry[key]}`"
    figures = {f["name"]: f for f in entry.get("figures", [])}
    if name not in figures:
        raise KeyError(f"{lab_id}/{variant} has no figure {name!r} (see its reference.json)")
    figure = figures[name]
    if predicted:
        if figure.get("predicted") is None:
            raise KeyError(f"{lab_id}/{variant}: {name!r} has no prediction")
        return with_unit(figure["predicted"], figure.get("unit", ""))
    return with_unit(figure["value"], figure.get("unit", ""))


def fill(text: str) -> tuple[str, list[str]]:
    """The text with every placeholder filled, and one problem line per placeholder that could not be."""
    problems = []

    def one(match: re.Match) -> str:
        lab_id, variant, name, predicted = match.groups()
        try:
            return lookup(lab_id, variant, name, bool(predicted))
        except KeyError as exc:
            line = text.count("\n", 0, match.start()) + 1
            problems.append(f"line {line}: {match.group(0)}: {exc.args[0]}")
            return match.group(0)

    filled = PLACEHOLDER.sub(one, text)
    for match in re.finditer(r"\{\{[^}]*\}\}", filled):
        if not PLACEHOLDER.fullmatch(match.group(0)):
            line = filled.count("\n", 0, match.start()) + 1
            problems.append(f"line {line}: {match.group(0)} is not a placeholder: write {{{{LAB/VARIANT: FIGURE}}}}")
    return filled, problems
