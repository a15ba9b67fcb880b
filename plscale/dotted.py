"""Nested dicts addressed with dotted keys (`train.lr`, `zero_optimization.stage`): a lab's
settings (plscale.lab.settings) and a DeepSpeed config (plscale.dsconfig.explain) alike."""


def flatten(tree: dict, prefix: str = "") -> dict:
    """{"train": {"lr": 3e-4}} -> {"train.lr": 3e-4}; an empty dict stays a leaf."""
    out = {}
    for key, value in tree.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out.update(flatten(value, path + "."))
        else:
            out[path] = value
    return out
