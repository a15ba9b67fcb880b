"""Shared fixtures: run the real CLI in a subprocess, find the shared datasets."""

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from plscale.lab.jaxenv import DEVICE_COUNT, with_device_count  # imports neither torch nor jax

# 4 simulated CPU devices for the JAX tests: XLA reads this when JAX starts its CPU backend.
if DEVICE_COUNT not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = with_device_count(os.environ.get("XLA_FLAGS", ""), 4)

# The labs' matmul peaks (plscale/rank/peak.py), measured under the suite's load: kept in a file of the
# suite's own, shared by its workers and runs, never in the user's ~/.cache.
os.environ.setdefault("PLSCALE_PEAK_CACHE", os.path.join(tempfile.gettempdir(), f"plscale-tests-peak-{os.getuid()}.json"))

ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = Path(os.environ.get("PLSCALE_SHARED_DATA", ROOT.parent / "shared" / "data"))


def run_cli(*args, env=None, cwd=None, timeout=600) -> subprocess.CompletedProcess:
    """`plscale ARGS` as a user would run it; stdout and stderr captured as text."""
    full_env = {**os.environ, "HF_HUB_OFFLINE": "1", "COLUMNS": "200", **(env or {})}
    return subprocess.run([sys.executable, "-m", "plscale.cli.main", *map(str, args)], env=full_env,
                          cwd=cwd or ROOT, capture_output=True, text=True, timeout=timeout)


@pytest.fixture
def cli(tmp_path):
    """Run the CLI with runs/ under a temporary folder."""

    def call(*args, env=None, **kwargs):
        return run_cli(*args, env={"PLSCALE_RUNS_DIR": str(tmp_path / "runs"), **(env or {})}, **kwargs)

    call.runs = tmp_path / "runs"
    return call


@pytest.fixture
def quick_cli(tmp_path, monkeypatch, capsys):
    """The CLI in this process, for input refused before anything starts: the same main() and
    exit code as `cli`, without starting an interpreter (0.5-1 s a call on 2 cores). Returns a
    CompletedProcess like `cli`; `cwd` as run_cli's (default: the repository)."""
    from plscale.cli import main as cli_main

    def call(*args, env=None, cwd=None):
        with monkeypatch.context() as patch:
            for key, value in {"PLSCALE_RUNS_DIR": str(tmp_path / "runs"), "HF_HUB_OFFLINE": "1", "COLUMNS": "200",
                               **(env or {})}.items():
                patch.setenv(key, value)
            patch.setattr(sys, "argv", ["plscale", *map(str, args)])
            patch.chdir(cwd or ROOT)
            capsys.readouterr()
            try:
                cli_main.main()
                code = 0
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
            out = capsys.readouterr()
        return subprocess.CompletedProcess(["plscale", *map(str, args)], code, out.out, out.err)

    call.runs = tmp_path / "runs"
    return call


def only_run(runs: Path) -> Path:
    dirs = [p for p in runs.iterdir() if p.is_dir()]
    assert len(dirs) == 1, dirs
    return dirs[0]


def load_summary(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


def figures(summary: dict) -> dict:
    return {f["name"]: f for f in summary["figures"]}


@pytest.fixture
def shared_data():
    """The path of a dataset under ../shared/data, or skip when it is absent."""

    def find(name: str) -> Path:
        path = SHARED_DATA / name
        if not path.is_dir():
            pytest.skip(f"{path} is absent (shared datasets exist on the project's machines only)")
        return path

    return find


@pytest.fixture
def four_jax_devices():
    """Skip unless JAX has the 4 devices set above. Asked inside a test, never at import: a JAX
    backend started while collecting would make the other tests' forks unsafe."""
    import jax
    if jax.device_count() < 4:
        pytest.skip("needs 4 JAX devices: XLA_FLAGS=--xla_force_host_platform_device_count=4")


# Test modules that run JAX in this process (its backend's threads started): after them, an
# os.fork() (DataLoader workers, multiprocessing, even subprocess) is unsafe, and JAX warns so.
JAX_IN_PROCESS = ("test_jax_collectives", "test_jax_hlo", "test_jax_layouts", "test_jax_model")


def pytest_collection_modifyitems(items):
    """Those modules run last, in their order; everything else keeps its order."""
    items[:] = sorted(items, key=lambda item: item.module.__name__ in JAX_IN_PROCESS)


@pytest.fixture(scope="session")
def sshd(tmp_path_factory):
    """A real sshd on loopback standing in for a pod (skips with the reason where none is installed)."""
    from helpers.sshd import LocalSSHD, missing
    reason = missing()
    if reason:
        pytest.skip(reason)
    try:
        server = LocalSSHD(tmp_path_factory.mktemp("sshd"))
    except RuntimeError as exc:  # e.g. no privilege separation directory for a user who may not make one
        pytest.skip(str(exc).strip().splitlines()[-1])
    yield server
    server.stop()
