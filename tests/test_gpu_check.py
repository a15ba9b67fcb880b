"""benchmarks/gpu_check.py: its plan for a GPU machine (dry run), a rehearsal of it on one CPU
rank through the real CLI, and the loud stop at the first lab that does not run."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from plscale.lab.labs import all_labs

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "benchmarks" / "gpu_check.py"


def check(*args, **kw):
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, cwd=ROOT, **kw)


def test_dry_run_plans_every_lab_on_1_2_and_all_gpus():
    out = check("--dry-run", "--gpus", "8")
    assert out.returncode == 0, out.stderr
    lines = [line for line in out.stdout.splitlines() if "plscale lab run" in line]
    targets = [line for line in lines if "# MFU target" in line]
    runs = re.findall(r"plscale lab run (\S+) --variant (\S+) --gpus (\d+)", "\n".join(set(lines) - set(targets)))
    for lab in all_labs():
        counts = {int(g) for name, _, g in runs if name == lab.id}
        fixed = lab.variants[lab.default_variant].ranks
        most = max(n for n in lab.allowed_ranks if n <= 8)     # all 8, or as many as the lab takes
        want = {g for g in ({fixed} if fixed else {1, 2, most}) if g in lab.allowed_ranks}
        if lab.launcher == "jax" and f"{lab.id}: jax is not installed" in out.stdout:
            continue  # left out, and said why
        assert all(v == lab.default_variant for n, v, _ in runs if n == lab.id)
        for g in ({fixed} if fixed else {1, 2, most}) - counts:
            assert f"{lab.id} on {g} GPU" in out.stdout, (lab.id, g)   # every run left out is said, with why
        assert counts >= want - {g for g in want if f"{lab.id} on {g} GPU" in out.stdout}
    assert "4d on 1 GPU: the lab runs on 4, 8, 16 ranks" in out.stdout
    # a layout the lab's own settings cannot take on that many ranks: the CLI's reason, before anything runs
    assert "pipeline on 1 GPU: parallel.pp=2 on 1 rank" in out.stdout
    # a lab that cannot take all 8 runs on the most it can
    assert ("recompute", "strategies", "4") in runs and ("debug", "healthy", "4") in runs
    # the MFU targets, first: the 124M preset in bf16 on one GPU, under DeepSpeed and under FSDP2 compiled
    assert lines[:2] == targets
    assert re.search(r"lab run zero --variant zero2 --gpus 1 .*model.preset=124m.*ds.precision=bf16", targets[0])
    assert re.search(r"lab run zero --variant fsdp2-bf16 --gpus 1 .*model.preset=124m.*fsdp.compile=true", targets[1])


def test_no_gpu_is_one_line_and_exit_2():
    out = check(env={"PATH": "/nonexistent"})  # no nvidia-smi to find
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and "--dry-run" in out.stderr


def test_unknown_lab_is_one_line_and_exit_2():
    out = check("--dry-run", "--gpus", "2", "--labs", "zero,nope")
    assert out.returncode == 2 and "unknown lab(s) nope" in out.stderr


@pytest.mark.e2e
def test_rehearsal_on_a_cpu_rank_builds_the_table(tmp_path):
    # one thread, as a lab's ranks run on 2 cores: a 2-thread GEMM's peak, measured while other tests load the
    # cores, waits for its slower thread and can come out below what the run then reaches
    out = check("--cpu", "--gpus", "1", "--labs", "zero", "--steps", "3", "--set", "model.preset=tiny",
                "--set", "model.seq=64", "--set", "data.val_blocks=8", "--out", str(tmp_path),
                env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    record = json.loads((tmp_path / "gpu_check.json").read_text())
    [row] = record["results"]
    assert row["lab"] == "zero" and row["gpus"] == 1 and row["passed"]
    figures = row["figures"]
    assert figures["throughput"]["unit"] == "tokens/s" and figures["throughput"]["value"] > 0
    assert 0 < figures["MFU"]["value"] < 100 and "measured matmul, 1 thread," in figures["MFU"]["note"]
    states = figures["model states per rank (max)"]
    assert abs(states["value"] - states["predicted"]) <= 0.05 * states["predicted"]
    assert "| zero | zero2 | 1 |" in (tmp_path / "gpu_check.md").read_text()


@pytest.mark.parametrize("args, said", [
    (["--set", "model.preset=nonexistent"], "zero with --set model.preset=nonexistent: "),
    (["--steps", "0"], "--steps 0: use 1 or more"),
    (["--timeout-s", "-5"], "--timeout-s -5: use 1 or more")])
def test_bad_values_are_one_line_exit_2_and_nothing_written(tmp_path, args, said):
    out = check("--cpu", "--gpus", "1", "--labs", "zero", "--out", str(tmp_path / "out"), *args)
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and said in out.stderr, out.stderr
    assert not (tmp_path / "out").exists()


def test_the_first_failing_run_stops_the_check(tmp_path):
    # a run the CLI accepts whose checks fail: one step, so the census comes before Adam's moments exist
    out = check("--cpu", "--gpus", "1", "--labs", "zero", "--steps", "1", "--set", "model.preset=tiny",
                "--set", "model.seq=64", "--set", "data.val_blocks=8", "--out", str(tmp_path))
    assert out.returncode == 1
    assert "FAILED: plscale lab run zero --variant zero2 --gpus 1" in out.stderr and "exit code 1" in out.stderr
    assert not (tmp_path / "gpu_check.json").exists()


def test_keep_going_records_the_failed_run_and_still_exits_1(tmp_path):
    # the same failing run, then the check goes on: the table is written after every run, the failure in its row
    out = check("--cpu", "--gpus", "1", "--labs", "zero", "--steps", "1", "--keep-going", "--set", "model.preset=tiny",
                "--set", "model.seq=64", "--set", "data.val_blocks=8", "--out", str(tmp_path))
    assert out.returncode == 1 and "FAILED: plscale lab run zero --variant zero2 --gpus 1" in out.stderr
    [row] = json.loads((tmp_path / "gpu_check.json").read_text())["results"]
    assert row["exit_code"] == 1 and row["passed"] is False and row["figures"]["throughput"]["value"] > 0
    assert "| zero | zero2 | 1 | checks failed |" in (tmp_path / "gpu_check.md").read_text()
