"""The four strategies by name, built from the lab's `ckpt` settings.

Each has the same shape: `after_step(step)` (may checkpoint; returns its cost record),
`roots` (where restore looks, freshest tier first) and `finish()` (waits for writes in
flight; returns every record).
"""

from pathlib import Path

from plscale.strategies.checkpoint.asynchronous import Async
from plscale.strategies.checkpoint.basic import Basic
from plscale.strategies.checkpoint.incremental import Incremental
from plscale.strategies.checkpoint.multilevel import MultiLevel


def make(engine, ckpt: dict, root: Path, local: Path, meta: dict):
    """`local`: node-local scratch memory (plscale.lab.rundir.node_scratch)."""
    name, every, keep = ckpt["strategy"], ckpt["every"], ckpt["keep"]
    if name == "basic":
        return Basic(engine, root, every, meta, keep)
    if name == "incremental":
        return Incremental(engine, root, local / "scratch", every, ckpt["full_every"], meta, keep)
    if name == "async":
        return Async(engine, root, local / "scratch", every, meta, keep)
    if name == "multilevel":
        return MultiLevel(engine, root, local / "fast", every, ckpt["durable_every"], meta, keep)
    raise ValueError(f"unknown checkpoint strategy {name!r}")
