"""What `plscale runpod` keeps on this machine: the API key and the pods it created.

The key comes from RUNPOD_API_KEY, else from a file only its owner can read
($XDG_CONFIG_HOME/plscale/runpod_api_key). It is shown masked, never printed, logged
or written anywhere else. The state file ($XDG_STATE_HOME/plscale/runpod.json) records
every pod `up` created, written atomically after each one, so `down` finds them all
even after a crash.
"""

import fcntl
import json
import os
import stat
import tempfile
from contextlib import contextmanager
from pathlib import Path

from plscale.errors import UserError


def _xdg(variable: str, default: str) -> Path:
    return Path(os.environ.get(variable) or Path.home() / default) / "plscale"


def key_file() -> Path:
    return _xdg("XDG_CONFIG_HOME", ".config") / "runpod_api_key"


def state_dir() -> Path:
    return _xdg("XDG_STATE_HOME", ".local/state")


def state_file() -> Path:
    return state_dir() / "runpod.json"


def known_hosts() -> Path:
    return state_dir() / "known_hosts"


def mask(key: str) -> str:
    return "****" + key[-4:] if len(key) > 8 else "****"


def api_key() -> str:
    return key_and_source()[0]


def key_and_source() -> tuple[str, str]:
    """The API key and where it came from (said when RunPod refuses it)."""
    key = os.environ.get("RUNPOD_API_KEY", "").strip()
    if key:
        return key, "RUNPOD_API_KEY"
    path = key_file()
    if not path.is_file():
        raise UserError("No RunPod API key: make one at https://www.runpod.io/console/user/settings, then "
                        "`export RUNPOD_API_KEY=...` or store it with `plscale runpod login`.")
    mode = stat.S_IMODE(path.stat().st_mode)
    if mode & 0o077:
        raise UserError(f"{path} can be read by others (mode {mode:o}): run `chmod 600 {path}`, "
                        f"and make a new key if others could have read it.")
    key = path.read_text().strip()
    if not key:
        raise UserError(f"{path} is empty: store a key with `plscale runpod login`.")
    return key, str(path)


def write_private(path: Path, text: str) -> None:
    """Write `text` to `path`, readable by its owner only, replacing the old file in one step."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o600)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def save_key(key: str) -> Path:
    path = key_file()
    write_private(path, key.strip() + "\n")
    return path


def load_state() -> dict:
    path = state_file()
    if not path.is_file():
        return {"clusters": {}}
    try:
        state = json.loads(path.read_text())
    except ValueError:
        state = None
    if not isinstance(state, dict) or not isinstance(state.get("clusters", {}), dict):
        raise UserError(f"{path} is not a plscale state file: check the RunPod console for pods named plscale-*, "
                        f"then move the file away (`plscale runpod down --all` finds those pods by name).")
    state.setdefault("clusters", {})
    return state


@contextmanager
def _locked():
    """One writer at a time: two commands at once (an `up` and a `down`, say) must not lose a cluster."""
    state_dir().mkdir(parents=True, exist_ok=True, mode=0o700)
    with open(state_dir() / "runpod.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def put_cluster(cluster: dict) -> None:
    """Record a cluster as it is now (re-reading the file, so other clusters' records stay as they are)."""
    with _locked():
        state = load_state()
        state["clusters"][cluster["name"]] = cluster
        write_private(state_file(), json.dumps(state, indent=2) + "\n")


def drop_cluster(name: str) -> None:
    with _locked():
        state = load_state()
        state["clusters"].pop(name, None)
        write_private(state_file(), json.dumps(state, indent=2) + "\n")


def cluster_of(state: dict, name: str | None) -> dict:
    """The cluster called `name`, or the only one when no name is given."""
    clusters = state["clusters"]
    if name is not None:
        if name not in clusters:
            have = ", ".join(clusters) or "none"
            raise UserError(f"No cluster {name!r} in {state_file()} (have: {have}): `plscale runpod status` lists them.")
        return clusters[name]
    if not clusters:
        raise UserError("No pods: start some with `plscale runpod up --gpus N --gpu-type T`.")
    if len(clusters) > 1:
        raise UserError(f"Several clusters ({', '.join(clusters)}): pick one with --name (`down --all` ends them all).")
    return next(iter(clusters.values()))
