"""Fault injection: one rank dies at one step, once, the way a crashed GPU or node does.

    fault.maybe_inject(run_dir, step, settings["fault"], rank)   # in the training loop

With `fault.step` K >= 0, rank `fault.rank` writes fault.json (step, rank, time) into the
run directory and kills itself with SIGKILL at the start of step K: no cleanup, no
goodbye to the other ranks, who then fail in their next collective. Only the first
attempt does this; under torchrun --max-restarts the restarted group (attempt 1, 2, ...)
reads fault.json to report the time to recover and the steps lost.
"""

import json
import os
import signal
import time
from pathlib import Path

from plscale.rank import distributed

RECORD = "fault.json"


def maybe_inject(run_dir: Path, step: int, fault: dict, rank: int) -> None:
    if step != fault["step"] or rank != fault["rank"] or distributed.restart_count() > 0:
        return
    (Path(run_dir) / RECORD).write_text(json.dumps({"step": step, "rank": rank, "time": time.time()}))
    print(f"fault injection: rank {rank} dies at step {step}", flush=True)
    os.kill(os.getpid(), signal.SIGKILL)


def last(run_dir: Path) -> dict | None:
    """The injected failure this run survived, if any."""
    try:
        return json.loads((Path(run_dir) / RECORD).read_text())
    except (OSError, ValueError):
        return None
