"""The launch plan: argv and environment for each launcher, device and topology."""

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT, load_summary, only_run
from plscale.lab import labs
from plscale.errors import UserError
from plscale.run.launch import Options, plan

RUN = Path("/tmp/run-x")
FIXTURE_LABS = ROOT / "tests" / "fixtures" / "labs"


def planned(*args, **kwargs):
    """A plan bound to its run directory, as it runs."""
    return plan(*args, **kwargs).at(RUN)


@pytest.fixture
def mnist():
    return labs.find("mnist-dp")


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv("MKL_NUM_THREADS", raising=False)


def test_cpu_plan_uses_gloo_environment(mnist, monkeypatch):
    monkeypatch.setattr("plscale.run.launch.cpu_cores", lambda: 8)
    p = planned(*mnist, Options(gpus=2), gpus_present=[])
    assert p.device == "cpu" and p.ranks == 2 and p.world_size == 2
    assert p.env["DS_ACCELERATOR"] == "cpu"
    assert p.env["OMP_NUM_THREADS"] == "4"  # cores / ranks: no oversubscription
    assert p.env["HF_HUB_OFFLINE"] == "1"
    assert Path(p.argv[0]).name == "deepspeed"
    assert p.argv[1:3] == ["--num_gpus", "2"]
    assert str(mnist[0].entry_path) in p.argv
    assert "--run-dir" in p.argv and str(RUN) in p.argv
    assert "gloo" in p.notice and "2 CPU ranks" in p.notice


def test_threads_never_below_one(mnist, monkeypatch):
    monkeypatch.setattr("plscale.run.launch.cpu_cores", lambda: 2)
    assert planned(*mnist, Options(gpus=8), gpus_present=[]).env["OMP_NUM_THREADS"] == "1"


def test_gpu_plan_and_cpu_override(mnist):
    p = planned(*mnist, Options(gpus=2), gpus_present=["H100", "H100"])
    assert p.device == "cuda" and "DS_ACCELERATOR" not in p.env and "NCCL" in p.notice
    p = planned(*mnist, Options(gpus=2, cpu=True), gpus_present=["H100", "H100"])
    assert p.device == "cpu" and p.env["DS_ACCELERATOR"] == "cpu"


def test_more_gpus_than_present_is_a_user_error(mnist):
    with pytest.raises(UserError, match="Asked for 4 GPUs but this machine has 1: use --gpus 1, or --cpu"):
        planned(*mnist, Options(gpus=4), gpus_present=["H100"])


@pytest.mark.parametrize("gpus, match", [(0, "at least 1 rank"), (3, "runs with 1, 2, 4, 8 ranks")])
def test_bad_rank_counts(mnist, gpus, match):
    with pytest.raises(UserError, match=match):
        planned(*mnist, Options(gpus=gpus), gpus_present=[])


def test_torchrun_plan(mnist):
    p = planned(*mnist, Options(gpus=2, launcher="torchrun", master_port=1234), gpus_present=[])
    assert Path(p.argv[0]).name == "torchrun"
    assert p.argv[1:11] == ["--nnodes", "1", "--nproc_per_node", "2", "--node_rank", "0",
                            "--master_addr", "127.0.0.1", "--master_port", "1234"]


def test_the_command_carries_only_the_run_dir(mnist):
    p = planned(*mnist, Options(gpus=2, steps=5, sets=["train.lr=1"]), gpus_present=[])
    # the ranks read settings from the run directory; the command carries only its path
    assert p.argv[p.argv.index(str(mnist[0].entry_path)):] == [str(mnist[0].entry_path), "--run-dir", str(RUN)]


def test_multinode_deepspeed_without_ssh(mnist):
    p = planned(*mnist, Options(gpus=2, nodes=2, node_rank=1, master_addr="10.0.0.1"), gpus_present=[])
    argv = p.argv
    assert argv[argv.index("--num_nodes") + 1] == "2" and "--no_ssh" in argv
    assert argv[argv.index("--node_rank") + 1] == "1" and argv[argv.index("--master_addr") + 1] == "10.0.0.1"
    assert argv[argv.index("--master_port") + 1] == "29500"
    assert p.world_size == 4
    # deepspeed's --no_ssh mode wants every node listed: plscale writes that hostfile itself
    assert argv[argv.index("--hostfile") + 1] == str(RUN / "hostfile")
    assert p.files == {"hostfile": "node0 slots=2\nnode1 slots=2\n"}


def test_multinode_needs_hostfile_or_node_rank(mnist, tmp_path):
    with pytest.raises(UserError, match="--hostfile"):
        planned(*mnist, Options(gpus=2, nodes=2), gpus_present=[])
    with pytest.raises(UserError, match="does not exist"):
        planned(*mnist, Options(gpus=2, nodes=2, hostfile=str(tmp_path / "nope")), gpus_present=[])
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("node0 slots=2\nnode1 slots=2\n")
    p = planned(*mnist, Options(gpus=2, nodes=2, hostfile=str(hostfile)), gpus_present=[])
    assert p.argv[p.argv.index("--hostfile") + 1] == str(hostfile)


def test_unknown_launcher(mnist):
    with pytest.raises(UserError, match="deepspeed, torchrun or accelerate"):
        planned(*mnist, Options(launcher="mpirun"), gpus_present=[])


def test_variant_launcher_is_the_default_and_enforced(mnist):
    lab, variant = mnist
    variant.launcher = "torchrun"
    assert Path(planned(lab, variant, Options(), gpus_present=[]).argv[0]).name == "torchrun"
    with pytest.raises(UserError, match="runs under torchrun"):
        planned(lab, variant, Options(launcher="deepspeed"), gpus_present=[])


def test_data_dir_is_passed_absolute(mnist, tmp_path):
    p = planned(*mnist, Options(data_dir=str(tmp_path)), gpus_present=[])
    assert p.env["PLSCALE_DATA_DIR"] == str(tmp_path.resolve())


def test_torchrun_max_restarts(mnist):
    p = planned(*mnist, Options(gpus=2, launcher="torchrun", max_restarts=2), gpus_present=[])
    argv = p.argv
    assert p.max_restarts == 2 and argv[argv.index("--max-restarts") + 1] == "2"
    assert argv.index("--max-restarts") < argv.index(str(mnist[0].entry_path))  # torchrun's flag, not the lab's
    assert "restarts every rank up to 2" in p.notice
    assert "--max-restarts" not in planned(*mnist, Options(gpus=2, launcher="torchrun"), gpus_present=[]).argv


def test_variant_restarts_are_the_default(mnist):
    lab, variant = mnist
    variant.launcher, variant.restarts = "torchrun", 1
    assert planned(lab, variant, Options(), gpus_present=[]).max_restarts == 1
    p = planned(lab, variant, Options(max_restarts=0), gpus_present=[])  # the option wins, 0 included
    assert p.max_restarts == 0 and "--max-restarts" not in p.argv


@pytest.mark.parametrize("opts, match", [
    (Options(launcher="torchrun", max_restarts=-1), "--max-restarts -1: use 0"),
    (Options(max_restarts=1), "--max-restarts 1: the deepspeed launcher does not restart failed ranks; "
                              "use --launcher torchrun."),
    (Options(launcher="accelerate", max_restarts=1), "the accelerate launcher does not restart"),
])
def test_bad_max_restarts(mnist, opts, match):
    with pytest.raises(UserError, match=re.escape(match)):
        planned(*mnist, opts, gpus_present=[])


def test_variant_restarts_need_torchrun(mnist):
    lab, variant = mnist
    variant.restarts = 1
    with pytest.raises(UserError, match=r"Variant 'default' \(restarts: 1\).*use --launcher torchrun, or --max-restarts 0"):
        planned(lab, variant, Options(), gpus_present=[])


@pytest.mark.parametrize("args, message", [
    (["--max-restarts", "1"], "--max-restarts 1: the deepspeed launcher does not restart failed ranks; "
                              "use --launcher torchrun."),
    (["--launcher", "torchrun", "--max-restarts", "-2"], "--max-restarts -2: use 0 (no restart) or more."),
])
def test_bad_max_restarts_exit_2(quick_cli, args, message):
    cli = quick_cli  # refused before launch: in this process
    result = cli("lab", "run", "mnist", "--cpu", *args)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], result.stderr
    assert not cli.runs.exists() or not any(cli.runs.iterdir())


def test_dry_run_shows_the_variant_restarts(cli):
    result = cli("lab", "run", "restart", "--cpu", "--dry-run", env={"PLSCALE_LABS_DIR": str(FIXTURE_LABS)})
    assert result.returncode == 0, result.stderr
    assert "torchrun" in result.stdout and "--max-restarts 1" in result.stdout


@pytest.mark.e2e
def test_torchrun_restarts_the_group_after_a_rank_dies(tmp_path):
    """Attempt 0: rank 1 exits hard; torchrun restarts both ranks; attempt 1 forms a new gloo
    group (a fresh store prefix per attempt, see distributed.init) and completes an all_reduce.
    Over the dead attempt's store keys it would fail or hang in connectFullMesh: on a hang,
    Ctrl-C stops every rank (plscale's runner does) and the test fails."""
    env = {**os.environ, "PLSCALE_LABS_DIR": str(FIXTURE_LABS), "PLSCALE_RUNS_DIR": str(tmp_path / "runs"),
           "HF_HUB_OFFLINE": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "plscale.cli.main", "lab", "run", "restart", "--cpu"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        out, _ = proc.communicate(timeout=240)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=60)
        pytest.fail("the restarted ranks hung (gloo's rendezvous over the dead attempt's keys?)\n" + out[-3000:])
    run = only_run(tmp_path / "runs")
    assert proc.returncode == 0, out[-3000:] + (run / "launcher.log").read_text()[-3000:]
    summary = load_summary(run)
    assert summary["passed"] and summary["restart_count"] == 1
    attempts = [json.loads(line)["attempt"] for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert attempts == [0, 1]  # metrics.jsonl is appended to: both attempts are there


def test_a_master_port_in_use_is_refused_before_launch(mnist):
    """torch's store would fail with EADDRINUSE after the ranks started; the plan says so first."""
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(UserError, match=f"--master-port {port} is in use on this machine"):
            planned(*mnist, Options(gpus=2, master_port=port), gpus_present=[])
    assert planned(*mnist, Options(gpus=2, master_port=port), gpus_present=[]).master_port == port  # free again
