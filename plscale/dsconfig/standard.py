"""The standard DeepSpeed configs kept in ds_configs/, written by `plscale config sync`.

The files leave train_batch_size out so one file serves any number of ranks.
"""

import json
from pathlib import Path

from plscale.dsconfig.spec import DSSpec, build
from plscale.files import write_atomic

STANDARD = {
    "zero0": DSSpec(stage=0),
    "zero1": DSSpec(stage=1),
    "zero2": DSSpec(stage=2),
    "zero3": DSSpec(stage=3),
    "zero2-offload": DSSpec(stage=2, offload_optimizer=True),
    "zero3-offload": DSSpec(stage=3, offload_optimizer=True, offload_param=True),
    "zero2-bf16": DSSpec(stage=2, precision="bf16"),
    "zero2-fp16": DSSpec(stage=2, precision="fp16"),
    "zero3-bf16": DSSpec(stage=3, precision="bf16"),
}


def root() -> Path:
    return Path(__file__).resolve().parents[2] / "ds_configs"


def render(config: dict) -> str:
    return json.dumps(config, indent=2) + "\n"


def expected() -> dict[str, str]:
    """File name -> text, as the builder writes it now."""
    return {f"{name}.json": render(build(spec)) for name, spec in STANDARD.items()}


def drifted(folder: Path | None = None) -> list[str]:
    """Names of files that differ from the builder, are missing, or are not in the set."""
    folder = folder or root()
    want = expected()
    have = {p.name: p.read_text() for p in folder.glob("*.json")} if folder.is_dir() else {}
    return sorted(name for name in set(want) | set(have) if want.get(name) != have.get(name))


def sync(folder: Path | None = None) -> list[str]:
    """Rewrite the standard set; returns the names written or removed."""
    folder = folder or root()
    changed = drifted(folder)
    want = expected()
    for name in changed:
        if name in want:
            write_atomic(folder / name, want[name])
        else:
            (folder / name).unlink()
    return changed
