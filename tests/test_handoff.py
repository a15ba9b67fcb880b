"""The run directory is the one hand-off from host to ranks: what settings.json says is what
ran. Under a plain launcher each rank resolves the run itself, lab checks included."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT, only_run

pytestmark = pytest.mark.e2e
TORCHRUN = str(Path(sys.executable).parent / "torchrun")


def test_settings_json_says_what_ran(cli):
    result = cli("lab", "run", "mnist-dp", "--gpus", "2", "--cpu", "--steps", "3", "--set", "ds.micro_batch=32")
    assert result.returncode == 0, result.stdout[-3000:]
    run = only_run(cli.runs)
    record = json.loads((run / "settings.json").read_text())
    assert record["settings"]["train"]["steps"] == 3 and record["settings"]["ds"]["micro_batch"] == 32
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert len([r for r in rows if r["phase"] == "deepspeed"]) == 3
    assert json.loads((run / "ds_config.json").read_text())["train_micro_batch_size_per_gpu"] == 32
    # the ranks were handed the run directory, not the settings
    command = (run / "command.txt").read_text().splitlines()[1]
    assert command.endswith(f"train.py --run-dir {run}") and "--set" not in command


def _torchrun(tmp_path, *script_args):
    env = {**os.environ, "PLSCALE_RUNS_DIR": str(tmp_path / "runs"), "DS_ACCELERATOR": "cpu",
           "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    return subprocess.run([TORCHRUN, "--standalone", "--nproc_per_node", "2",
                           str(ROOT / "labs" / "03_collectives" / "collectives.py"), *script_args],
                          env=env, capture_output=True, text=True, timeout=300)


def test_plain_launcher_resolves_and_records(tmp_path):
    out = _torchrun(tmp_path, "--set", "tour.ops=broadcast,all_reduce")
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    run = only_run(tmp_path / "runs")
    record = json.loads((run / "settings.json").read_text())
    assert record["variant"] == "tour" and record["settings"]["tour"]["ops"] == "broadcast,all_reduce"
    checks = {c["name"] for c in json.loads((run / "summary.json").read_text())["checks"]}
    assert {"broadcast", "all_reduce"} <= checks and "scatter" not in checks


def test_plain_launcher_runs_the_labs_check(tmp_path):
    out = _torchrun(tmp_path, "--set", "tour.ops=foo")
    assert out.returncode != 0
    errors = [line for line in out.stderr.splitlines() if line.startswith("error: ")]
    # each rank that got to say something said the same one line (torchrun stops the other on the first exit)
    assert errors and all("tour.ops: unknown primitive 'foo'" in line for line in errors), out.stderr
    assert "collectives.py\", line" not in out.stderr  # no traceback from the lab script
    assert not (tmp_path / "runs").exists()  # nothing written: no rank got as far as a run directory
