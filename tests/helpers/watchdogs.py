"""The --max-hours watchdogs `plscale runpod up` starts on the "pods" (here: processes of this machine,
reached through the loopback sshd), found by their folders and stopped after a test."""

import os
import signal
from pathlib import Path


def folders(remote_dir: Path) -> dict[str, Path]:
    """Each pod's watchdog folder under the pods' remote dir, by pod id."""
    return {d.name.removeprefix("watchdog-"): d for d in (Path(remote_dir) / ".plscale").glob("watchdog-*")}


def stop(remote_dir: Path) -> None:
    """Stop every watchdog still running (one that ended its pod, or saw it go, has exited already)."""
    for folder in folders(remote_dir).values():
        try:
            pid = int((folder / "pid").read_text())
            if str(folder) in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace"):
                os.kill(pid, signal.SIGTERM)
        except (OSError, ValueError):
            pass  # never started, or gone already
