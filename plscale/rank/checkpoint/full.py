"""A full checkpoint, written synchronously and sealed; and the verified restore that
every strategy shares.

    saved = full.save(engine, root, step, meta)      # every rank; blocks until sealed
    got = full.restore(engine, [fast_root, root])    # newest valid checkpoint, or None

Save: every rank writes DeepSpeed's files and its own random streams into
.partial/<tag>/, rank 0 seals it (manifest with checksums, rename, `latest` last; see
plscale.ckpt.store). Restore: every rank checks every candidate's checksums, the ranks
agree (an all-reduce of the verdicts) and all load the newest checkpoint that every rank
found whole. A corrupt newest checkpoint is reported and the one before it is used.
"""

import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.distributed as dist

from plscale.ckpt import delta, store
from plscale.errors import UserError
from plscale.rank.checkpoint import rank_state


@dataclass
class Saved:
    step: int
    tag: str
    tier: str          # "durable", "fast" (multi-level) or "delta" (incremental)
    stall_s: float     # how long training was blocked
    durable_s: float   # from the start of the save until sealed on disk (async: later than the stall)
    bytes: int         # written to that tier


@dataclass
class Restored:
    step: int          # steps already trained: training goes on at this step
    tag: str | None    # None: nothing to load, a fresh start
    root: Path | None
    skipped: list = field(default_factory=list)   # (tag, [problems]) of newer checkpoints not used
    rng: bool = True   # this rank's random streams were restored (False at another world size)


def agree(flag: bool) -> bool:
    """True when every rank's flag is True."""
    t = torch.tensor([int(flag)])
    dist.all_reduce(t, op=dist.ReduceOp.MIN)
    return bool(t.item())


def check_space(root: Path, need_bytes: int) -> None:
    """Refuse to start a checkpoint that cannot fit: earlier ones stay as they are."""
    if not need_bytes:
        return
    free = shutil.disk_usage(root).free
    if free < 1.1 * need_bytes:
        raise UserError(f"Only {free / 2**20:,.0f} MiB free at {root}, a checkpoint needs about "
                        f"{need_bytes / 2**20:,.0f} MiB: free some space or point ckpt.dir elsewhere. "
                        f"Earlier checkpoints are untouched.")


def write_partial(engine, root: Path, tag: str) -> Path:
    """Every rank: DeepSpeed's files and this rank's random streams into .partial/<tag>/."""
    folder = store.partial_dir(root, tag)
    try:
        engine.save_checkpoint(str(folder.parent), tag=tag, save_latest=False)
        rank_state.save(folder, dist.get_rank())
    except (OSError, RuntimeError) as exc:
        # torch.save reports a failed write as RuntimeError (PytorchStreamWriter / inline_container)
        if isinstance(exc, RuntimeError) and not any(w in str(exc) for w in ("inline_container", "StreamWriter")):
            raise
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else "the write failed: disk full?"
        raise UserError(f"Could not write checkpoint {tag} to {root} ({reason}): free some space or point "
                        f"ckpt.dir at a writable folder. Earlier checkpoints are untouched.") from None
    return folder


def save(engine, root: Path, step: int, meta: dict, tier: str = "durable", need_bytes: int = 0) -> Saved:
    root, tag, t0 = Path(root), store.tag_of(step), time.perf_counter()
    root.mkdir(parents=True, exist_ok=True)
    check_space(root, need_bytes)
    write_partial(engine, root, tag)
    dist.barrier()
    if dist.get_rank() == 0:
        store.commit(root, tag, {**meta, "step": step, "kind": "full", "tier": tier})
    dist.barrier()
    took = time.perf_counter() - t0
    return Saved(step, tag, tier, took, took, folder_bytes(root / tag))


def folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def restore(engine, roots: list, expect: dict | None = None) -> Restored:
    """Load the newest checkpoint that every rank finds whole, from any of `roots`; a
    delta checkpoint is first rebuilt next to it (plscale.ckpt.delta). `tag` is None
    when there was nothing to load. `expect`: manifest fields that must match (the model)."""
    candidates = sorted((e for root in roots for e in store.entries(root)),
                        key=lambda e: (e.step, (e.manifest or {}).get("tier") == "durable"), reverse=True)
    verdicts = torch.tensor([int(e.valid) for e in candidates] or [0])
    dist.all_reduce(verdicts, op=dist.ReduceOp.MIN)
    skipped = []
    for entry, ok in zip(candidates, verdicts.tolist()):
        if not ok:
            skipped.append((f"{entry.path.parent.name}/{entry.tag}", entry.problems or ["invalid on another rank"]))
            continue
        for key, want in (expect or {}).items():
            if entry.manifest.get(key) != want:
                raise UserError(f"{entry.path} holds a checkpoint of another {key} ({entry.manifest.get(key)}, "
                                f"this run has {want}): resume from a checkpoint of this model.")
        load_root = entry.path.parent
        if entry.manifest.get("kind") == "delta":
            load_root = entry.path.parent / store.PARTIAL / "rebuilt"
            if dist.get_rank() == 0:
                delta.rebuild(entry.path, load_root / entry.tag)
            dist.barrier()
        engine.load_checkpoint(str(load_root), tag=entry.tag)
        same_world = entry.manifest.get("world_size") == dist.get_world_size()
        rng = same_world and rank_state.restore(load_root / entry.tag, dist.get_rank())
        if load_root != entry.path.parent:
            dist.barrier()
            if dist.get_rank() == 0:
                shutil.rmtree(load_root, ignore_errors=True)
        return Restored(entry.manifest["step"], entry.tag, entry.path.parent, skipped, rng)
    return Restored(0, None, None, skipped, False)


def on_main(fn, *args):
    """Run fn on rank 0 while the others wait (housekeeping such as pruning old checkpoints)."""
    if dist.get_rank() == 0:
        fn(*args)
    dist.barrier()
