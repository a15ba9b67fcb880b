"""Incremental checkpointing: a full checkpoint now and then, deltas in between.

Every `full_every` steps a full checkpoint, as in basic. At the other checkpoints each
rank's state is first written to node-local scratch memory, then each file is stored as
its XOR-delta against the same file of the last full checkpoint (plscale.ckpt.delta);
the ranks share the encoding work, file by file. The manifest records both the stored
deltas and the checksums of the files they stand for, so a restore rebuilds the exact
state and proves it. What it buys is bytes on durable storage (and the bandwidth to it);
what it costs is CPU time in the stall, and a restore that needs two checkpoints whole.
"""

import shutil
import time
from pathlib import Path

import torch.distributed as dist

from plscale.ckpt import delta, store
from plscale.rank.checkpoint import full


class Incremental:
    name = "incremental"

    def __init__(self, engine, root: Path, scratch: Path, every: int, full_every: int, meta: dict, keep: int = 2):
        self.engine, self.root, self.scratch = engine, Path(root), Path(scratch)
        self.every, self.full_every, self.meta, self.keep = every, full_every, meta, keep
        self.base: str | None = None  # tag of the last full checkpoint
        self.records: list[full.Saved] = []

    @property
    def roots(self) -> list[Path]:
        return [self.root]

    def after_step(self, step: int) -> full.Saved | None:
        if step % self.every:
            return None
        meta = {**self.meta, "strategy": self.name}
        if self.base is None or step % self.full_every == 0:
            saved = full.save(self.engine, self.root, step, meta)
            self.base = saved.tag
        else:
            saved = self._delta(step, meta)
        self.records.append(saved)
        full.on_main(store.prune, self.root, self.keep)
        return saved

    def _delta(self, step: int, meta: dict) -> full.Saved:
        tag, t0 = store.tag_of(step), time.perf_counter()
        snapshot = full.write_partial(self.engine, self.scratch, tag)   # into memory
        dist.barrier()
        originals = store.file_table(snapshot)
        mine = sorted(originals)[dist.get_rank()::dist.get_world_size()]
        delta.encode_into(snapshot, self.root / self.base, store.partial_dir(self.root, tag), mine)
        dist.barrier()
        if dist.get_rank() == 0:
            store.commit(self.root, tag, {**meta, "step": step, "kind": "delta", "tier": "durable",
                                          "base": self.base, "restores": originals})
            shutil.rmtree(snapshot, ignore_errors=True)
        dist.barrier()
        took = time.perf_counter() - t0
        return full.Saved(step, tag, "delta", took, took, full.folder_bytes(self.root / tag))

    def finish(self) -> list[full.Saved]:
        return self.records
