"""Incremental checkpointing: a full checkpoint now and then, deltas in between.

Every `full_every` steps a full checkpoint, as in basic. At the other checkpoints each
rank first writes its state to its own folder in node-local scratch memory, then stores
each of its files as the XOR-delta against the same file of the last full checkpoint
(plscale.ckpt.delta). The manifest records both the stored deltas and the checksums of
the files they stand for, so a restore rebuilds the exact state and proves it. What it
buys is bytes on durable storage (and the bandwidth to it); what it costs is CPU time in
the stall, and a restore that needs two checkpoints whole.
"""

import shutil
import time
from pathlib import Path

import torch.distributed as dist

from plscale.ckpt import delta, store
from plscale.errors import UserError
from plscale.strategies.checkpoint import sealed


class Incremental(sealed.Strategy):
    name = "incremental"

    def __init__(self, engine, root: Path, scratch: Path, every: int, full_every: int, meta: dict, keep: int = 2):
        super().__init__(engine, root, every, meta, keep)
        self.full_every = full_every
        self.scratch = Path(scratch) / f"rank{dist.get_rank()}"
        self.base: str | None = None  # tag of the last full checkpoint

    def after_step(self, step: int) -> sealed.Saved | None:
        if step % self.every:
            return None
        meta = {**self.meta, "strategy": self.name}
        fulls = [r.bytes for r in self.records if r.kind == "full"]
        if self.base is None or step % self.full_every == 0:
            saved = sealed.save(self.engine, self.root, step, meta, need_bytes=fulls[-1] if fulls else 0)
            self.base = saved.tag
        else:
            saved = self._delta(step, meta, fulls[-1])
        self.records.append(saved)
        sealed.on_main(store.prune, self.root, self.keep)
        return saved

    def _delta(self, step: int, meta: dict, full_bytes: int) -> sealed.Saved:
        tag, t0 = store.tag_of(step), time.perf_counter()
        sealed.check_space(self.root, full_bytes)
        sealed.clear_partial(self.root, tag)
        shutil.rmtree(store.partial_dir(self.scratch, tag), ignore_errors=True)
        snapshot = sealed.write_partial(self.engine, self.scratch, tag)   # this rank's files, in memory
        mine = store.file_table(snapshot)
        failure = None
        try:
            delta.encode_into(snapshot, self.root / self.base, store.partial_dir(self.root, tag), list(mine))
        except OSError as exc:
            failure = sealed.write_error(exc, self.root, tag)
        if not sealed.agree(failure is None):  # every rank stops together, with one line
            raise failure or UserError(f"Could not write checkpoint {tag} on another rank (its log says why).")
        shutil.rmtree(snapshot, ignore_errors=True)
        everyone = [None] * dist.get_world_size()
        dist.all_gather_object(everyone, mine)
        if dist.get_rank() == 0:
            store.commit(self.root, tag, {**meta, "step": step, "kind": "delta", "tier": "durable",
                                          "base": self.base, "restores": {k: v for t in everyone for k, v in t.items()}})
        dist.barrier()
        took = time.perf_counter() - t0
        return sealed.Saved(step, tag, "durable", "delta", took, took, store.folder_bytes(self.root / tag))
