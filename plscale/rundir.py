"""The run directory: runs/<time>-<lab>-<variant>/, written by the host and the ranks.

Host: command.txt, env.json, settings.json, ds_config.json, launcher.log.
Ranks: system.json (versions, hardware), metrics.jsonl, summary.json, rank_N.log, plots.
"""

import json
import os
import time
from pathlib import Path

from plscale.dsconfig.standard import write_atomic


def runs_root() -> Path:
    return Path(os.environ.get("PLSCALE_RUNS_DIR", "runs"))


def new_run_dir(lab_id: str, variant: str, root: Path | None = None, create: bool = True) -> Path:
    """A fresh runs/<time>-<lab>-<variant>/ (created unless create=False)."""
    root = root or runs_root()
    stamp = time.strftime("%Y%m%d-%H%M%S")
    path = root / f"{stamp}-{lab_id}-{variant}"
    n = 1
    while path.exists():
        n += 1
        path = root / f"{stamp}-{lab_id}-{variant}-{n}"
    if create:
        path.mkdir(parents=True)
    return path.resolve()


def write_json(path: Path, data) -> None:
    write_atomic(path, json.dumps(data, indent=2, default=str) + "\n")


def read_json(path: Path):
    return json.loads(Path(path).read_text())


def read_metrics(run_dir: Path) -> list[dict]:
    path = Path(run_dir) / "metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
