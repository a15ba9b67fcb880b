"""Multi-level checkpointing: a cheap copy often, a durable one now and then.

Every `every` steps the full state goes to a fast tier on this node (memory-backed
/dev/shm where there is one: it survives a crashed process, not a lost machine); every
`durable_every` steps it goes to durable storage (the run directory, in a real cluster a
shared or remote file system). Restore takes the freshest checkpoint that is whole,
from either tier, so a process crash loses at most `every` steps and a lost node at most
`durable_every`. When the run ends, its newest fast checkpoint is copied to the durable
tier, since node-local memory does not outlive the run. (Gemini keeps the fast copy in a
peer's memory instead; the idea is the same: the cheap tier absorbs the frequent saves.
On several nodes the fast tier here is sealed on node 0 only, so restore skips it there.)
"""

import shutil
from pathlib import Path

from plscale.ckpt import store
from plscale.rank.checkpoint import sealed


class MultiLevel:
    name = "multilevel"

    def __init__(self, engine, root: Path, fast_root: Path, every: int, durable_every: int, meta: dict,
                 keep: int = 2):
        self.engine, self.root, self.fast_root = engine, Path(root), Path(fast_root)
        self.every, self.durable_every, self.meta, self.keep = every, durable_every, meta, keep
        self.records: list[sealed.Saved] = []

    @property
    def roots(self) -> list[Path]:
        return [self.fast_root, self.root]

    def after_step(self, step: int) -> sealed.Saved | None:
        durable = step % self.durable_every == 0
        if step % self.every and not durable:
            return None
        root, tier = (self.root, "durable") if durable else (self.fast_root, "fast")
        same = [r.bytes for r in self.records if r.tier == tier]
        saved = sealed.save(self.engine, root, step, {**self.meta, "strategy": self.name}, tier=tier,
                            need_bytes=same[-1] if same else 0)
        self.records.append(saved)
        sealed.on_main(store.prune, root, self.keep)
        return saved

    def _promote(self, tag: str) -> None:
        """Copy a sealed fast checkpoint into the durable tier and seal it there."""
        partial = store.partial_dir(self.root, tag)
        shutil.rmtree(partial, ignore_errors=True)
        shutil.copytree(self.fast_root / tag, partial, ignore=shutil.ignore_patterns(store.MANIFEST))
        meta = {k: v for k, v in store.read_manifest(self.fast_root / tag).items()
                if k not in ("format", "tag", "created", "files")}
        store.commit(self.root, tag, {**meta, "tier": "durable"})
        store.prune(self.root, self.keep)

    def finish(self) -> list[sealed.Saved]:
        if self.records and self.records[-1].tier == "fast":
            sealed.on_main(self._promote, self.records[-1].tag)
        return self.records
