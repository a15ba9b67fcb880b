"""Asynchronous checkpointing: snapshot to memory, write to disk while training goes on.

The stall is only the snapshot: each rank's DeepSpeed state written to node-local
memory (/dev/shm). A background thread per rank then copies its share of the files to
durable storage and flushes them; the last rank to finish leaves a marker, rank 0's
thread seals the checkpoint (manifest, rename, `latest`). Training runs meanwhile, so
"time to durable" is longer than the stall, and a crash in that window loses the
checkpoint in flight too: steps lost at worst = every + the steps the write took.
A new snapshot waits for the previous write (that wait counts as stall).
"""

import os
import shutil
import threading
import time
from pathlib import Path

import torch.distributed as dist

from plscale.ckpt import store
from plscale.rank.checkpoint import full


class Async:
    name = "async"

    def __init__(self, engine, root: Path, scratch: Path, every: int, meta: dict, keep: int = 2):
        self.engine, self.root, self.scratch, self.every, self.meta, self.keep = \
            engine, Path(root), Path(scratch), every, meta, keep
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.records: list[full.Saved] = []
        self.writer: threading.Thread | None = None
        self.failure: BaseException | None = None

    @property
    def roots(self) -> list[Path]:
        return [self.root]

    def after_step(self, step: int) -> full.Saved | None:
        if step % self.every:
            return None
        t0 = time.perf_counter()
        self._wait()
        tag = store.tag_of(step)
        snapshot = full.write_partial(self.engine, self.scratch, tag)
        dist.barrier()  # every rank's files are in the snapshot
        saved = full.Saved(step, tag, "durable", time.perf_counter() - t0, float("nan"), 0)
        self.records.append(saved)
        self.writer = threading.Thread(target=self._write, args=(snapshot, saved, t0), daemon=True)
        self.writer.start()
        return saved

    def _write(self, snapshot: Path, saved: full.Saved, t0: float) -> None:
        try:
            out = store.partial_dir(self.root, saved.tag)
            files = sorted(store.file_table(snapshot))
            for rel in files[self.rank::self.world]:
                (out / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(snapshot / rel, out / rel)
            (out / f".done-{self.rank}").touch()
            if self.rank != 0:
                return
            while sum((out / f".done-{r}").exists() for r in range(self.world)) < self.world:
                time.sleep(0.005)
            for r in range(self.world):
                os.unlink(out / f".done-{r}")
            store.commit(self.root, saved.tag, {**self.meta, "strategy": self.name, "step": saved.step,
                                                "kind": "full", "tier": "durable"})
            saved.durable_s, saved.bytes = time.perf_counter() - t0, full.folder_bytes(self.root / saved.tag)
            shutil.rmtree(snapshot, ignore_errors=True)
            store.prune(self.root, self.keep)
        except BaseException as exc:  # raised in the training thread at the next checkpoint or at the end
            self.failure = exc

    def _wait(self) -> None:
        if self.writer is not None:
            self.writer.join()
            self.writer = None
        if self.failure is not None:
            raise self.failure

    def finish(self) -> list[full.Saved]:
        self._wait()
        dist.barrier()
        return self.records
