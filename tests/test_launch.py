"""The launch plan: argv and environment for each launcher, device and topology."""

from pathlib import Path

import pytest

from plscale.run import labs
from plscale.errors import UserError
from plscale.run.launch import Options, plan

RUN = Path("/tmp/run-x")


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
