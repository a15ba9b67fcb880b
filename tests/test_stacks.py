"""`plscale stacks RUN`: the Python stack of every rank of a lab that is still running (each rank
answers SIGUSR1 through faulthandler, plscale/rank/logs.py), and a clear line for one that is not."""

import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from conftest import ROOT, run_cli


@pytest.mark.e2e
def test_stacks_of_a_running_lab(tmp_path):
    runs = tmp_path / "runs"
    env = {**os.environ, "PLSCALE_RUNS_DIR": str(runs), "COLUMNS": "200"}
    lab = subprocess.Popen([sys.executable, "-m", "plscale.cli.main", "lab", "run", "zero2", "--gpus", "2", "--cpu",
                            "--steps", "400", "--set", "model.preset=tiny", "--set", "model.seq=64",
                            "--set", "data.val_blocks=16"], env=env, cwd=ROOT, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        run_dir = None
        while time.monotonic() < deadline:  # training: both ranks up, steps being logged
            found = [p for p in runs.glob("*") if (p / "metrics.jsonl").is_file()] if runs.exists() else []
            if found and len(list((found[0] / "pids").glob("rank_*"))) == 2 and \
                    len((found[0] / "metrics.jsonl").read_text().splitlines()) >= 2:
                run_dir = found[0]
                break
            time.sleep(0.2)
        assert run_dir is not None, "the lab did not start training within 2 minutes"
        done = run_cli("stacks", run_dir, env={"PLSCALE_RUNS_DIR": str(runs)})
        assert done.returncode == 0, done.stderr
        assert "rank 0 (pid" in done.stdout and "rank 1 (pid" in done.stdout, done.stdout
        assert "2 of 2 rank(s) answered" in done.stdout
        # each rank's stack goes through the lab's own script, and names its main thread first
        for block in done.stdout.split("rank 1 (pid"):
            assert "labs/04_zero/train.py" in block and "most recent call first" in block, block[-2000:]
        # then each rank's newest collective, from its Flight Recorder, asked through its FIFO
        flight = done.stdout.split("Flight Recorder: each rank's newest collective")[-1]
        for rank in (0, 1):
            assert re.search(rf"rank {rank}: \S.* #\d+ \w+", flight), done.stdout[-2000:]
            assert (run_dir / "flight" / "live" / f"rank_{rank}.pkl").is_file()
        assert not (run_dir / "flight" / "rank_0.pkl").exists()  # where a failure's record goes: untouched
        assert lab.poll() is None, "a rank that answered keeps running"
    finally:
        os.killpg(lab.pid, signal.SIGTERM)
        lab.wait(timeout=60)
    for _ in range(60):  # every rank gone now (the ranks end a moment after the launcher)
        done = run_cli("stacks", run_dir, env={"PLSCALE_RUNS_DIR": str(runs)})
        if done.returncode != 0:
            break
        time.sleep(0.5)
    assert done.returncode == 2 and "No rank of" in done.stderr and "is running on this machine" in done.stderr


def test_stacks_without_a_run(tmp_path):
    done = run_cli("stacks", env={"PLSCALE_RUNS_DIR": str(tmp_path / "none")})
    assert done.returncode == 2 and "No runs under" in done.stderr, done.stderr
    done = run_cli("stacks", tmp_path, env={"PLSCALE_RUNS_DIR": str(tmp_path)})
    assert done.returncode == 2 and "is not a run directory" in done.stderr, done.stderr
