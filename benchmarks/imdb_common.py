"""Shared by the IMDB benchmarks: run the lab as `plscale lab run` does (plscale.run.flow, in this
process) and read what it wrote."""

import io
import json
import os
import sys
import time
from pathlib import Path

from rich.console import Console

from plscale.errors import UserError
from plscale.run import flow

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
    """`plscale lab run VARIANT --gpus N --set k=v ...` in this process (plscale.run.flow), its
    output kept and shown only on a failure; returns (summary.json, wall seconds)."""
    runs = Path(os.environ.get("PLSCALE_RUNS_DIR", "runs")).resolve()
    words = ["lab", "run", variant, "--gpus", str(gpus), *map(str, extra)]
    words += ["--steps", str(steps)] if steps else []
    for key, value in sets.items():
        words += ["--set", f"{key}={value}"]
    print("$ plscale " + " ".join(words), flush=True)
    output = io.StringIO()
    start = time.perf_counter()
    try:
        request = flow.parse(words)
        run_dir = flow.run(request.name, request.opts, request.variant, Console(file=output, width=160),
                           ["plscale", *words], runs)
    except (UserError, flow.RunFailed) as exc:
        sys.exit(f"the run failed ({exc}):\n{output.getvalue()[-4000:]}")
    wall = time.perf_counter() - start
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
