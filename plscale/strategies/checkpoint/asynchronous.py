"""Asynchronous checkpointing: snapshot to memory, write to disk while training goes on.

The stall is only the snapshot: each rank's DeepSpeed state written to its own folder in
node-local memory (/dev/shm). A background thread per rank then copies its files to
durable storage and flushes them, and leaves a marker (`.done-R`, or `.failed-R` with the
reason); rank 0's thread waits for every rank's marker and seals the checkpoint
(manifest, rename, `latest`). Training runs meanwhile, so "time to durable" is longer
than the stall, and a crash in that window loses the checkpoint in flight too: steps
lost at worst = every + the steps the write took. A new snapshot waits for the previous
write (that wait counts as stall); a failed write is raised there, or at the end.
"""

import shutil
import threading
import time
from pathlib import Path

import torch.distributed as dist

from plscale.ckpt import store
from plscale.errors import UserError
from plscale.strategies.checkpoint import sealed

TIMEOUT_S = 600  # rank 0 gives up waiting for the other ranks' writes


class Async(sealed.Strategy):
    name = "async"

    def __init__(self, engine, root: Path, scratch: Path, every: int, meta: dict, keep: int = 2):
        super().__init__(engine, root, every, meta, keep)
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.scratch = Path(scratch) / f"rank{self.rank}"
        self.writer: threading.Thread | None = None
        self.failure: BaseException | None = None

    def after_step(self, step: int) -> sealed.Saved | None:
        if step % self.every:
            return None
        t0 = time.perf_counter()
        self._wait()
        tag = store.tag_of(step)
        sealed.check_space(self.root, self.records[-1].bytes if self.records else 0)
        sealed.clear_partial(self.root, tag)  # no marker of a crashed attempt may count
        shutil.rmtree(store.partial_dir(self.scratch, tag), ignore_errors=True)
        snapshot = sealed.write_partial(self.engine, self.scratch, tag)
        saved = sealed.Saved(step, tag, "durable", "full", time.perf_counter() - t0, float("nan"), 0)
        self.records.append(saved)
        self.writer = threading.Thread(target=self._write, args=(snapshot, saved, t0), daemon=True)
        self.writer.start()
        return saved

    def _write(self, snapshot: Path, saved: sealed.Saved, t0: float) -> None:
        out = store.partial_dir(self.root, saved.tag)
        try:
            for rel in store.file_table(snapshot):
                (out / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(snapshot / rel, out / rel)
            shutil.rmtree(snapshot, ignore_errors=True)
            (out / f".done-{self.rank}").touch()
            if self.rank == 0:
                self._seal(out, saved, t0)
        except BaseException as exc:  # raised in the training thread at the next checkpoint or at the end
            self.failure = sealed.write_error(exc, self.root, saved.tag) or exc
            if out.is_dir():
                (out / f".failed-{self.rank}").write_text(str(exc))

    def _seal(self, out: Path, saved: sealed.Saved, t0: float) -> None:
        deadline = time.time() + TIMEOUT_S
        while sum((out / f".done-{r}").exists() for r in range(self.world)) < self.world:
            failed = sorted(out.glob(".failed-*"))
            if failed or time.time() > deadline:
                why = failed[0].read_text() if failed else f"not all ranks wrote within {TIMEOUT_S} s"
                raise UserError(f"Checkpoint {saved.tag} was not written ({why}): earlier checkpoints are untouched.")
            time.sleep(0.005)
        for marker in out.glob(".done-*"):
            marker.unlink()
        store.commit(self.root, saved.tag, {**self.meta, "strategy": self.name, "step": saved.step,
                                            "kind": "full", "tier": "durable"})
        saved.durable_s, saved.bytes = time.perf_counter() - t0, store.folder_bytes(self.root / saved.tag)
        store.prune(self.root, self.keep)

    def _wait(self) -> None:
        """Every rank: the previous write done; a failure on any rank raised on all of them."""
        if self.writer is not None:
            self.writer.join()
            self.writer = None
        if not sealed.agree(self.failure is None):
            raise self.failure or UserError("A checkpoint write failed on another rank (its log says why): "
                                            "earlier checkpoints are untouched.")

    def finish(self) -> list[sealed.Saved]:
        self._wait()
        dist.barrier()
        return self.records
