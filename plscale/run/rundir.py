"""The run directory: runs/<time>-<lab>-<variant>/, written by the host and the ranks.

Host: command.txt, env.json, settings.json, ds_config.json, launcher.log.
Ranks: system.json (versions, hardware), metrics.jsonl, summary.json, rank_N.log, plots.
"""

import json
import os
import time
from pathlib import Path



def runs_root() -> Path:
    return Path(os.environ.get("PLSCALE_RUNS_DIR", "runs"))


def new_run_dir(lab_id: str, variant: str, root: Path | None = None, create: bool = True) -> Path:
    """A fresh runs/<time>-<lab>-<variant>/. With create=True it is claimed atomically, so
    runs started in the same second (two nodes sharing runs/, say) never get the same one;
    create=False only names one, for a plan that may still be refused."""
    root = root or runs_root()
    stamp = time.strftime("%Y%m%d-%H%M%S")
    n = 1
    while True:
        path = root / (f"{stamp}-{lab_id}-{variant}" + (f"-{n}" if n > 1 else ""))
        if not create:
            if not path.exists():
                return path.resolve()
        else:
            root.mkdir(parents=True, exist_ok=True)
            try:
                path.mkdir()
                return path.resolve()
            except FileExistsError:
                pass
        n += 1


def read_metrics(run_dir: Path) -> list[dict]:
    path = Path(run_dir) / "metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
