"""Basic checkpointing: stop, write everything, go on.

Every `every` steps each rank writes its full DeepSpeed state to durable storage and
training waits until it is sealed. Stall = time to durable = the whole write. A crash
loses the steps since the last checkpoint: `every` at worst, `every / 2` on average.
"""

from plscale.ckpt import store
from plscale.strategies.checkpoint import sealed


class Basic(sealed.Strategy):
    name = "basic"

    def after_step(self, step: int) -> sealed.Saved | None:
        if step % self.every:
            return None
        last = self.records[-1].bytes if self.records else 0
        saved = sealed.save(self.engine, self.root, step, {**self.meta, "strategy": self.name}, need_bytes=last)
        self.records.append(saved)
        sealed.on_main(store.prune, self.root, self.keep)
        return saved
