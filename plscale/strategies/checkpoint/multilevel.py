"""Multi-level checkpointing: a cheap copy often, a durable one now and then.

Every `every` steps the full state goes to a fast tier on this node (memory-backed
/dev/shm where there is one: it survives a crashed process, not a lost machine); every
`durable_every` steps it goes to durable storage (the run directory, in a real cluster a
shared or remote file system). Restore takes the freshest checkpoint that is whole,
from either tier, so a process crash loses at most `every` steps and a lost node at most
`durable_every`. When the run ends, its state is saved to the durable tier once more if
that tier is behind, since node-local memory does not outlive the run. (Gemini keeps the fast copy in a
peer's memory instead; the idea is the same: the cheap tier absorbs the frequent saves.
On several nodes the fast tier here is sealed on node 0 only, so restore skips it there.)
"""

from pathlib import Path

from plscale.ckpt import store
from plscale.strategies.checkpoint import sealed


class MultiLevel(sealed.Strategy):
    name = "multilevel"

    def __init__(self, engine, root: Path, fast_root: Path, every: int, durable_every: int, meta: dict,
                 keep: int = 2):
        super().__init__(engine, root, every, meta, keep)
        self.fast_root, self.durable_every = Path(fast_root), durable_every
        self.step = 0  # the newest step trained

    @property
    def roots(self) -> list[Path]:
        return [self.fast_root, self.root]

    def after_step(self, step: int, durable: bool = False) -> sealed.Saved | None:
        self.step = step
        durable = durable or step % self.durable_every == 0
        if step % self.every and not durable:
            return None
        root, tier = (self.root, "durable") if durable else (self.fast_root, "fast")
        same = [r.bytes for r in self.records if r.tier == tier]
        saved = sealed.save(self.engine, root, step, {**self.meta, "strategy": self.name}, tier=tier,
                            need_bytes=same[-1] if same else 0)
        self.records.append(saved)
        sealed.on_main(store.prune, root, self.keep)
        return saved

    def finish(self) -> list[sealed.Saved]:
        """Node-local memory does not outlive the run: a state newer than the durable tier's
        newest is saved there once more (recorded like any durable checkpoint)."""
        durable = [r.step for r in self.records if r.tier == "durable"]
        if self.step and self.step > max(durable, default=0):
            self.after_step(self.step, durable=True)
        return self.records
