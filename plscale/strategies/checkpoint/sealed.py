"""Sealed checkpoints: the synchronous save every strategy builds on, and the verified
restore they all share.

    saved = sealed.save(engine, root, step, meta)           # every rank; blocks until sealed
    got = sealed.restore(engine, [fast_root, root], scratch) # the newest checkpoint whole everywhere

Save: any leftover .partial/<tag>/ of a crashed attempt is cleared first; then every rank
writes DeepSpeed's files and its own random streams into it, and rank 0 seals it
(manifest with checksums, rename, `latest` last; see plscale.ckpt.store). Restore: every
rank checks the checksums of every checkpoint it can see, the ranks exchange their
verdicts, and all load the newest checkpoint that every rank found whole. A corrupt
newest checkpoint is reported and the one before it is used; a checkpoint one node cannot
see (a node-local tier on another node) counts as not whole.
"""

import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.distributed as dist

from plscale.ckpt import delta, store
from plscale.errors import UserError
from plscale.strategies.checkpoint import rank_state


DEFAULTS = {"engine": "deepspeed"}   # a manifest's fields from before they were written


@dataclass
class Saved:
    step: int
    tag: str
    tier: str          # "durable", or "fast" (multi-level's node-local tier)
    kind: str          # "full" or "delta" (incremental)
    stall_s: float     # how long training was blocked
    durable_s: float   # from the start of the save until sealed (async: later than the stall)
    bytes: int         # written to that tier


@dataclass
class Restored:
    step: int          # steps already trained: training goes on at this step
    tag: str | None    # None: nothing to load, a fresh start
    root: Path | None
    skipped: list = field(default_factory=list)   # (where, [problems]) of newer checkpoints not used
    rng: bool = True   # this rank's random streams were restored (False at another world size)


class Strategy:
    """What every strategy shares: its cost records, where restore looks, the end of a run."""

    name = ""

    def __init__(self, engine, root: Path, every: int, meta: dict, keep: int):
        self.engine, self.root, self.every, self.meta, self.keep = engine, Path(root), every, meta, keep
        self.records: list[Saved] = []

    @property
    def roots(self) -> list[Path]:
        return [self.root]

    def finish(self) -> list[Saved]:
        return self.records


def agree(flag: bool) -> bool:
    """True when every rank's flag is True (on the GPU under NCCL, which has no CPU tensors)."""
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else "cpu"
    t = torch.tensor([int(flag)], device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MIN)
    return bool(t.item())


def on_main(fn, *args):
    """Run fn on rank 0 while the others wait (housekeeping: pruning, clearing)."""
    if dist.get_rank() == 0:
        fn(*args)
    dist.barrier()


def check_space(root: Path, need_bytes: int) -> None:
    """Refuse, on every rank together, a checkpoint that cannot fit: earlier ones stay."""
    Path(root).mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(root).free
    if not agree(free >= 1.1 * need_bytes):
        raise UserError(f"Not enough free space at {root} for a checkpoint of about {need_bytes / 2**20:,.0f} MiB: "
                        f"free some space or point ckpt.dir elsewhere. Earlier checkpoints are untouched.")


def write_error(exc: BaseException, root: Path, tag: str) -> UserError | None:
    """A failed write (OSError, or torch.save's RuntimeError from its zip writer) as one line;
    None for any other exception."""
    if isinstance(exc, OSError):
        reason = exc.strerror or str(exc)
    elif isinstance(exc, RuntimeError) and any(w in str(exc) for w in ("inline_container", "StreamWriter")):
        reason = "the write failed: disk full?"
    else:
        return None
    return UserError(f"Could not write checkpoint {tag} to {root} ({reason}): free some space or point "
                     f"ckpt.dir at a writable folder. Earlier checkpoints are untouched.")


def clear_partial(root: Path, tag: str) -> None:
    """Every rank: remove a half-written .partial/<tag>/ left by a crashed attempt, before writing."""
    on_main(store.discard_partial, root, tag)


def write_partial(engine, root: Path, tag: str) -> Path:
    """Every rank: DeepSpeed's files and this rank's random streams into root/.partial/<tag>/."""
    folder = store.partial_dir(root, tag)
    try:
        engine.save_checkpoint(str(folder.parent), tag=tag, save_latest=False)
        rank_state.save(folder, dist.get_rank())
    except (OSError, RuntimeError) as exc:
        raise write_error(exc, root, tag) or exc from None
    return folder


def save(engine, root: Path, step: int, meta: dict, tier: str = "durable", need_bytes: int = 0) -> Saved:
    root, tag, t0 = Path(root), store.tag_of(step), time.perf_counter()
    check_space(root, need_bytes)
    clear_partial(root, tag)
    write_partial(engine, root, tag)
    dist.barrier()
    if dist.get_rank() == 0:
        store.commit(root, tag, {**meta, "step": step, "kind": "full", "tier": tier})
    dist.barrier()
    took = time.perf_counter() - t0
    return Saved(step, tag, tier, "full", took, took, store.folder_bytes(root / tag))


def restore(engine, roots: list, scratch: Path, expect: dict | None = None) -> Restored:
    """Load the newest checkpoint that every rank finds whole, from any of `roots`; a delta
    checkpoint is first rebuilt into node-local `scratch` (plscale.ckpt.delta). `expect`:
    manifest fields that must match (the model)."""
    universal = bool(engine.load_universal_checkpoint())  # such an engine loads universal checkpoints only
    mine = {(e.step, (e.manifest or {}).get("tier") == "durable", str(e.path)): e
            for root in roots for e in store.entries(root)
            if ((e.manifest or {}).get("kind") == "universal") == universal}
    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, {key: e.valid for key, e in mine.items()})
    skipped = []
    for key in sorted(set().union(*everyone), reverse=True):  # newest first; durable before fast
        entry = mine.get(key)
        if not all(verdicts.get(key) for verdicts in everyone):
            problems = (entry.problems if entry else []) or ["not whole on every rank"]
            skipped.append((f"{Path(key[2]).parent.name}/{Path(key[2]).name}", problems))
            continue
        for name, want in (expect or {}).items():
            if entry.manifest.get(name, DEFAULTS.get(name)) != want:
                raise UserError(f"{entry.path} holds a checkpoint of another {name} ({entry.manifest.get(name)}, "
                                f"this run has {want}): resume from a checkpoint of this model.")
        load_root = entry.path.parent
        if entry.manifest.get("kind") == "delta":  # rebuilt once per node, next to the ranks that read it
            load_root, rebuilt = Path(scratch) / "rebuilt", True
            if int(os.environ.get("LOCAL_RANK", 0)) == 0:
                try:
                    delta.rebuild(entry.path, load_root / entry.tag)
                except (OSError, ValueError) as exc:
                    rebuilt, entry.problems = False, [f"rebuilding it failed: {exc}"]
            if not agree(rebuilt):
                skipped.append((f"{entry.path.parent.name}/{entry.tag}", entry.problems or ["rebuilding it failed"]))
                continue
        engine.load_checkpoint(str(load_root), tag=entry.tag)
        same_world = entry.manifest.get("world_size") == dist.get_world_size()
        rng = same_world and rank_state.restore(load_root / entry.tag, dist.get_rank())
        if load_root != entry.path.parent:
            dist.barrier()
            if int(os.environ.get("LOCAL_RANK", 0)) == 0:
                shutil.rmtree(load_root, ignore_errors=True)
        return Restored(entry.manifest["step"], entry.tag, entry.path.parent, skipped, rng)
    return Restored(0, None, None, skipped, False)
