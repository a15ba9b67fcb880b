"""metrics.jsonl (one line per step), summary.json (figures beside predictions), progress."""

import json
import os
import time
from pathlib import Path

from plscale.figures import fmt
from plscale.files import write_json


def figure(name: str, value, unit: str = "", predicted=None, note: str = "") -> dict:
    """One measured figure, with its unit and the prediction it tests."""
    return {"name": name, "value": value, "unit": unit, "predicted": predicted, "note": note}


class Metrics:
    """Written by rank 0 only; other ranks' calls do nothing."""

    def __init__(self, run_dir: Path, rank: int):
        self.run_dir = run_dir
        self.active = rank == 0
        self.file = open(run_dir / "metrics.jsonl", "a", buffering=1) if self.active else None
        self.cli = os.environ.get("PLSCALE_CLI") == "1"
        self.profiler = None  # --profile: a plscale.rank.profile.StepProfiler, told of every train step

    def close(self) -> None:
        if self.file:
            self.file.close()

    def step(self, **fields) -> None:
        if self.profiler is not None and fields.get("phase", "train") == "train" and "step" in fields:
            self.profiler.on_step(fields["step"])  # on every rank: each records its own trace
        if self.active:
            self.file.write(json.dumps({"time": round(time.time(), 3), **fields}) + "\n")

    def progress(self, phase: str, step: int, total: int, text: str = "") -> None:
        """A live progress bar under `plscale lab run`; a plain line every tenth otherwise."""
        if not self.active:
            return
        if self.cli:
            print("PLSCALE_PROGRESS " + json.dumps({"phase": phase, "step": step, "total": total, "text": text}),
                  flush=True)
        elif step == total or step % max(1, total // 10) == 0:
            print(f"{phase} {step}/{total} {text}", flush=True)

    def summary(self, lab: str, variant: str, figures: list[dict], **extra) -> None:
        if not self.active:
            return
        write_json(self.run_dir / "summary.json", {"lab": lab, "variant": variant, "figures": figures, **extra})
        if not self.cli:  # under a plain launcher, print the table as text
            print(f"\nsummary of {lab} / {variant}:")
            for f in figures:
                predicted = "" if f["predicted"] is None else f"  (predicted {fmt(f['predicted'])})"
                print(f"  {f['name']}: {fmt(f['value'])} {f['unit']}{predicted}  {f['note']}")
            print(f"run directory: {self.run_dir}")
