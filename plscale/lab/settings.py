"""Lab settings: defaults from lab.yaml, then the variant's overrides, then `--set k=v`.

Settings are a nested dict addressed with dotted keys (`train.lr`). This module is
pure Python, so the host and the ranks resolve a lab's settings the same way.
"""

import copy

import yaml

from plscale.dotted import flatten
from plscale.errors import UserError, did_you_mean

__all__ = ["flatten", "parse_assignment", "resolve", "set_dotted"]


def parse_assignment(text: str) -> tuple[str, object]:
    """`train.lr=3e-4` -> ("train.lr", 0.0003); values are read as YAML scalars."""
    key, sep, raw = text.partition("=")
    key = key.strip()
    if not sep or not key or any(not part for part in key.split(".")):
        raise UserError(f"--set {text!r} is not of the form key=value (for example --set train.lr=3e-4).")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    if isinstance(value, str):  # YAML 1.1 reads 3e-4 (no dot) as text
        try:
            value = float(value)
        except ValueError:
            pass
    return key, value


def _whole_world(key: str, value) -> bool:
    """A parallel degree may be 'world': every rank of the run (resolved by plscale.lab.resolve)."""
    return key.startswith("parallel.") and value == "world"


def set_dotted(tree: dict, key: str, value, known: dict) -> None:
    """Set `key` in `tree`; the key must exist in `known` (the flattened defaults)."""
    if key == "model.hf" and key not in known:   # the labs whose pieces are written for plscale's Llama alone
        raise UserError("model.hf: this lab's strategy code is written for plscale's own Llama (its layers, its "
                        "cuts); a Hugging Face model trains in the zero lab (ZeRO 0-3, offload, FSDP2) and the ckpt lab.")
    if key not in known:
        raise UserError(f"Unknown setting {key!r}.{did_you_mean(key, known)} "
                        f"See the settings with `plscale lab show LAB`.")
    node = tree
    *parents, leaf = key.split(".")
    for part in parents:
        node = node.setdefault(part, {})
    old = known[key]
    if isinstance(old, bool) and not isinstance(value, bool):
        raise UserError(f"Setting {key!r} takes true or false, not {value!r}.")
    if isinstance(old, (int, float)) and not isinstance(old, bool) and not _whole_world(key, value):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise UserError(f"Setting {key!r} takes a number, not {value!r}.")
        if isinstance(old, float):
            value = float(value)
    node[leaf] = value


def resolve(defaults: dict, overrides: dict | None = None, assignments: list[str] = ()) -> dict:
    """Defaults, then a variant's overrides (dotted keys), then `--set` assignments."""
    settings = copy.deepcopy(defaults)
    known = flatten(defaults)
    for key, value in (overrides or {}).items():
        set_dotted(settings, key, value, known)
    for text in assignments:
        key, value = parse_assignment(text)
        set_dotted(settings, key, value, known)
    return settings
