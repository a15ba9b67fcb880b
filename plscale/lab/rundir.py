"""The run directory: runs/<time>-<lab>-<variant>/, the one hand-off from host to ranks.

Host (before any rank starts): settings.json (the resolved settings: exactly what runs),
ds_config.json, command.txt, env.json, hostfile (multi-node), launcher.log.
Ranks: system.json (versions, hardware), metrics.jsonl, summary.json, rank_N.log, plots.
"""

import hashlib
import os
import shlex
import shutil
import tempfile
import time
from pathlib import Path

from plscale.errors import UserError
from plscale.files import read_json, write_json

INPUTS = ("settings.json", "ds_config.json")


def runs_root() -> Path:
    return Path(os.environ.get("PLSCALE_RUNS_DIR", "runs"))


def new_run_dir(lab_id: str, variant: str, root: Path | None = None, create: bool = True) -> Path:
    """A fresh runs/<time>-<lab>-<variant>/. With create=True it is claimed atomically, so
    runs started in the same second (two nodes sharing runs/, say) never get the same one;
    create=False only names one, for a plan that is not run (--dry-run)."""
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


def node_scratch(run_dir: Path) -> Path:
    """This run's folder in memory-backed storage on this node (/dev/shm when it has 1 GiB
    free, else the run directory): for what must outlive a crashed process but not the run, such as lab 06's
    fast checkpoint tier. Named after the run directory's full path, so two runs never share
    it; the host removes it when the ranks are gone (`clear_node_scratch`)."""
    run_dir = Path(run_dir).resolve()
    shm = Path("/dev/shm")
    if shm.is_dir() and os.access(shm, os.W_OK) and shutil.disk_usage(shm).free >= 2**30:  # (Docker's is 64 MiB)
        digest = hashlib.sha1(str(run_dir).encode()).hexdigest()[:8]
        return shm / f"plscale-{run_dir.name}-{digest}"
    return run_dir / "node-scratch"


def clear_node_scratch(run_dir: Path) -> None:
    shutil.rmtree(node_scratch(run_dir), ignore_errors=True)
    shutil.rmtree(asking_dir(run_dir), ignore_errors=True)


def asking_dir(run_dir: Path) -> Path:
    """Where this node's ranks of a run keep the FIFOs `plscale stacks` writes to (plscale/rank/flight.py):
    in the temporary directory, not the run directory, which is copied and synced (a FIFO is not a file)."""
    run_dir = Path(run_dir).resolve()
    digest = hashlib.sha1(str(run_dir).encode()).hexdigest()[:8]
    return Path(tempfile.gettempdir()) / f"plscale-ask-{run_dir.name}-{digest}"


def write_inputs(run_dir: Path, plan, resolved, command: list[str], started_by: str | None = None) -> None:
    """Everything the ranks and a later reader need, written before any rank starts. command.txt: the
    command, then what starts the ranks (`started_by`, else the launcher's command line)."""
    for name, text in plan.files.items():
        (run_dir / name).write_text(text)
    write_json(run_dir / "ds_config.json", resolved.ds_config)
    write_json(run_dir / "settings.json", resolved.record())
    (run_dir / "command.txt").write_text(shlex.join(command) + "\n" + (started_by or plan.shell()) + "\n")
    write_json(run_dir / "env.json", plan.env)


def read_inputs(run_dir: Path) -> tuple[dict, dict]:
    """(settings.json, ds_config.json) as the host wrote them."""
    missing = [name for name in INPUTS if not (Path(run_dir) / name).is_file()]
    if missing:
        raise UserError(f"{run_dir} lacks {', '.join(missing)}: start runs with `plscale lab run` (or a plain "
                        f"launcher without --run-dir); over ssh with a hostfile, runs/ must be on a filesystem "
                        f"every node sees (PLSCALE_RUNS_DIR).")
    return read_json(Path(run_dir) / "settings.json"), read_json(Path(run_dir) / "ds_config.json")
