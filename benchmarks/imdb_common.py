"""Shared by the IMDB benchmarks: run the lab through the real CLI and read what it wrote."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHARED_IMDB = Path(os.environ.get("PLSCALE_SHARED_DATA", ROOT.parent / "shared" / "data")) / "imdb"
FIGURES = ROOT / "labs" / "02_imdb_ddp" / "figures"


def data_args(data_dir: str | None) -> list[str]:
    """--data-dir for real IMDB: the given folder, else ../shared/data/imdb when present."""
    folder = data_dir or (str(SHARED_IMDB) if SHARED_IMDB.is_dir() else None)
    if folder is None:
        print("note: no IMDB files found; the lab uses its offline fallback (not IMDB)")
    return ["--data-dir", folder] if folder else []


def run_lab(variant: str, gpus: int, sets: dict, steps: int | None = None, extra=()) -> tuple[dict, float]:
    """`plscale lab run VARIANT --gpus N --set k=v ...`; returns (summary.json, wall seconds)."""
    runs = Path(os.environ.get("PLSCALE_RUNS_DIR", "runs")).resolve()
    before = set(runs.iterdir()) if runs.exists() else set()
    argv = [sys.executable, "-m", "plscale.cli.main", "lab", "run", variant, "--gpus", str(gpus), *extra]
    argv += ["--steps", str(steps)] if steps else []
    for key, value in sets.items():
        argv += ["--set", f"{key}={value}"]
    print("$ plscale " + " ".join(argv[3:]), flush=True)
    start = time.perf_counter()
    result = subprocess.run(argv, capture_output=True, text=True, env={**os.environ, "PLSCALE_RUNS_DIR": str(runs)})
    wall = time.perf_counter() - start
    if result.returncode != 0:
        sys.exit(f"the run failed (exit {result.returncode}):\n{result.stdout[-2000:]}{result.stderr[-2000:]}")
    (run_dir,) = set(runs.iterdir()) - before
    summary = json.loads((run_dir / "summary.json").read_text())
    summary["run_dir"] = str(run_dir)
    return summary, wall


def fig(summary: dict, name: str):
    return next(f["value"] for f in summary["figures"] if f["name"] == name)


def table(header: list[str], rows: list[list]) -> str:
    """A markdown table, numbers formatted for reading."""
    cell = lambda v: f"{v:,.1f}" if isinstance(v, float) else ("-" if v is None else str(v))
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)
