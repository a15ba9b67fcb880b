"""A checkpoint folder that never holds half a checkpoint.

    <root>/
      latest                  the tag of the newest committed checkpoint (DeepSpeed reads it too)
      step000040/             one checkpoint: DeepSpeed's files, each rank's state, manifest.json
      step000050/
      .partial/step000060/    being written; never read

Writing (`commit`): every rank writes into .partial/<tag>/; then one rank checksums every
file into manifest.json, flushes to disk, renames the folder into place, and moves
`latest` last. A crash at any moment leaves the earlier checkpoints and `latest` as they
were (re-saving a step that already has a folder replaces that folder, not whole, between
two renames: it happens only when that checkpoint was not whole to begin with). Reading (`newest_valid`): checkpoints are tried newest first; one whose files do
not match its manifest (truncated, flipped bytes, missing) is skipped with the reason.
"""

import hashlib
import json
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

from plscale.errors import UserError
from plscale.files import write_atomic

MANIFEST, LATEST, PARTIAL = "manifest.json", "latest", ".partial"


def tag_of(step: int) -> str:
    return f"step{step:06d}"


def partial_dir(root: Path, tag: str) -> Path:
    return Path(root) / PARTIAL / tag


def sha256(path: Path, chunk: int = 1 << 22) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def file_table(folder: Path) -> dict:
    """relative path -> {bytes, sha256} for every file under folder (the manifest aside)."""
    folder = Path(folder)
    return {str(p.relative_to(folder)): {"bytes": p.stat().st_size, "sha256": sha256(p)}
            for p in sorted(folder.rglob("*")) if p.is_file() and p.name != MANIFEST}


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def commit(root: Path, tag: str, meta: dict) -> Path:
    """Seal .partial/<tag> with its manifest and make it the newest checkpoint: the files
    and the folder flushed to disk, then renamed into place, then `latest` (flushed too)."""
    root, partial = Path(root), partial_dir(root, tag)
    manifest = {"format": 1, "tag": tag, "created": time.time(), **meta, "files": file_table(partial)}
    (partial / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    for p in [*partial.rglob("*"), partial]:
        _fsync(p)
    final = root / tag
    if final.exists():  # the same step from an earlier attempt (it was not whole, or we would have resumed
        aside = root / PARTIAL / f"{tag}.old"  # from it): moved aside, then replaced
        shutil.rmtree(aside, ignore_errors=True)
        os.replace(final, aside)
        shutil.rmtree(aside, ignore_errors=True)
    os.replace(partial, final)
    _fsync(root)
    write_atomic(root / LATEST, tag)
    _fsync(root / LATEST)
    _fsync(root)
    return final


def folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in Path(folder).rglob("*") if p.is_file())


def discard_partial(root: Path, tag: str) -> None:
    shutil.rmtree(partial_dir(root, tag), ignore_errors=True)


def read_manifest(folder: Path) -> dict | None:
    try:
        return json.loads((Path(folder) / MANIFEST).read_text())
    except (OSError, ValueError):
        return None


def problems(folder: Path) -> list[str]:
    """What is wrong with one checkpoint: empty when every file matches its manifest."""
    folder = Path(folder)
    manifest = read_manifest(folder)
    if manifest is None:
        return [f"{folder.name}: no readable {MANIFEST} (a checkpoint that was never completed)"]
    found = []
    for rel, want in manifest["files"].items():
        path = folder / rel
        if not path.is_file():
            found.append(f"{rel} is missing")
        elif path.stat().st_size != want["bytes"]:
            found.append(f"{rel} has {path.stat().st_size:,} bytes, the manifest says {want['bytes']:,} (truncated?)")
        elif sha256(path) != want["sha256"]:
            found.append(f"{rel} does not match its checksum (corrupted)")
    if manifest.get("base"):
        base = folder.parent / manifest["base"]
        found += [f"its base {manifest['base']}: {p}" for p in problems(base)] if base.exists() else \
                 [f"its base {manifest['base']} is missing"]
    return found


@dataclass
class Entry:
    tag: str
    path: Path
    manifest: dict | None
    problems: list = field(default_factory=list)

    @property
    def step(self) -> int:
        return self.manifest["step"] if self.manifest else int("".join(c for c in self.tag if c.isdigit()) or -1)

    @property
    def valid(self) -> bool:
        return not self.problems

    @property
    def bytes(self) -> int:
        return folder_bytes(self.path)


def entries(root: Path, verify: bool = True) -> list[Entry]:
    """Every checkpoint under root, newest first (by step)."""
    root = Path(root)
    if not root.is_dir():
        return []
    found = [Entry(p.name, p, read_manifest(p)) for p in root.iterdir() if p.is_dir() and p.name != PARTIAL]
    if verify:
        for e in found:
            e.problems = problems(e.path)
    return sorted(found, key=lambda e: (e.step, e.tag), reverse=True)


def latest_tag(root: Path) -> str | None:
    try:
        return (Path(root) / LATEST).read_text().strip() or None
    except OSError:
        return None


def open_root(root: Path, verify: bool = True) -> list[Entry]:
    """The checkpoints a user pointed at, verified; one clear error when there is nothing to resume."""
    root = Path(root)
    if not root.is_dir():
        raise UserError(f"No checkpoint folder at {root}: give the folder that holds `latest` "
                        f"(a run's checkpoints/ folder).")
    if latest_tag(root) is None:
        raise UserError(f"{root} has no `latest` file: it is not a checkpoint folder, or no checkpoint was ever "
                        f"completed there (list it with `plscale ckpt ls {root}`).")
    return entries(root, verify)


def check_writable(root: Path) -> None:
    """Fail before training, not at the first checkpoint, when root cannot be written."""
    root = Path(root)
    try:
        root.mkdir(parents=True, exist_ok=True)
        probe = root / f".probe-{os.getpid()}"
        probe.write_bytes(b"ok")
        probe.unlink()
    except OSError as exc:
        raise UserError(f"Cannot write checkpoints to {root} ({exc.strerror or exc}): "
                        f"pick a writable folder with --set ckpt.dir=PATH.") from None


def prune(root: Path, keep: int) -> list[str]:
    """Delete all but the newest `keep` full checkpoints up to `latest` and the deltas built on
    them. `latest`, its base, and folders without a manifest (not ours to judge) stay; anything
    newer than `latest` (left by a crashed attempt) goes."""
    items = [e for e in entries(root, verify=False) if e.manifest]
    latest = next((e for e in items if e.tag == latest_tag(root)), None)
    upto = latest.step if latest else float("inf")
    fulls = [e.tag for e in items if not e.manifest.get("base") and e.step <= upto][:keep]
    protected = set(fulls) | ({latest.tag, latest.manifest.get("base")} if latest else set())
    removed = []
    for e in items:
        if e.tag in protected or (e.manifest.get("base") in fulls and e.step <= upto):
            continue
        shutil.rmtree(e.path, ignore_errors=True)
        removed.append(e.tag)
    return removed
