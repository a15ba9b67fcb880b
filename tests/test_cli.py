"""The real CLI in a subprocess: fast host-side commands, bad input, failures, Ctrl-C."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from conftest import ROOT, only_run, run_cli

FIXTURE_LABS = ROOT / "tests" / "fixtures" / "labs"


def test_host_commands_do_not_import_torch():
    code = ("import sys; from plscale.cli import main; "
            "bad = [m for m in ('torch', 'deepspeed', 'transformers', 'datasets') if m in sys.modules]; "
            "print(','.join(bad))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "", f"importing the CLI pulled in {out.strip()}"


def test_version_and_help():
    assert run_cli("--version").stdout.startswith("plscale ")
    result = run_cli("--help")
    assert result.returncode == 0 and "lab" in result.stdout and "config" in result.stdout


def test_lab_list_and_show():
    listing = run_cli("lab", "list")
    assert listing.returncode == 0 and "mnist-pseudo-dp" in listing.stdout
    shown = run_cli("lab", "show", "mnist-dp")
    assert shown.returncode == 0 and "train.steps" in shown.stdout and "accum" in shown.stdout


@pytest.mark.parametrize("args, message", [
    (["lab", "run", "mnistt"], "No lab named 'mnistt'. Did you mean: mnist"),
    (["lab", "show", "zzz"], "No lab named 'zzz'"),
    (["lab", "run", "mnist", "--gpus", "0"], "--gpus 0: a run needs at least 1 rank"),
    (["lab", "run", "mnist", "--set", "foo"], "is not of the form key=value"),
    (["lab", "run", "mnist", "--set", "train.stepz=2"], "Unknown setting 'train.stepz'"),
    (["lab", "run", "mnist", "--steps", "0"], "--steps 0: use 1 or more"),
    (["lab", "run", "mnist", "--variant", "zero9"], "has no variant 'zero9'"),
    (["lab", "run", "mnist", "--launcher", "mpirun"], "Unknown launcher 'mpirun'"),
    (["lab", "run", "mnist", "--data-dir", "/nonexistent"], "is not a folder"),
    (["lab", "run", "mnist", "--sweep"], "has no sweep"),
    (["report", "/nonexistent"], "is not a run directory"),
    (["lab", "run", "zero2", "--set", "model.preset=smol"], "No model preset 'smol'. Did you mean: small?"),
    (["lab", "run", "collectives", "--set", "tour.ops=foo"], "tour.ops: unknown primitive 'foo'"),
    (["lab", "run", "mnist", "--steps", "-3"], "--steps -3: use 1 or more"),
    (["lab", "run", "mnist", "--set", "train.steps=0"], "train.steps 0: use 1 or more"),
    (["lab", "run", "zero2", "--set", "train.steps=-1"], "train.steps -1: use 1 or more"),
    (["lab", "run", "mnist", "--nodes", "2", "--node-rank", "2"], "--node-rank 2 with --nodes 2: use 0 to 1"),
    (["lab", "run", "mnist", "--nodes", "2", "--node-rank", "-1"], "--node-rank -1 with --nodes 2"),
    (["lab", "run", "mnist", "--master-port", "70000"], "--master-port 70000: use a port from 1 to 65535"),
    (["lab", "run", "mnist", "--master-port", "0"], "--master-port 0: use a port from 1 to 65535"),
    (["lab", "run", "mnist", "--master-addr", " "], "--master-addr ' ': give node 0's host name"),
    (["lab", "run", "mnist", "--nodes", "0"], "--nodes 0: use 1 or more"),
    (["lab", "run", "mnist", "--hostfile", "/nonexistent"], "--hostfile lists the nodes of a multi-node run"),
    (["lab", "run", "mnist", "--nodes", "2", "--hostfile", "/nonexistent"], "Hostfile /nonexistent does not exist"),
    (["lab", "run", "mnist", "--nodes", "2", "--node-rank", "0", "--launcher", "torchrun", "--hostfile", "/etc/hostname"],
     "--hostfile is for the deepspeed launcher"),
    (["lab", "run", "zero", "--sweep", "--variant", "zero1"], "--sweep runs the lab's sweep variants"),
    (["lab", "run", "zero2", "--set", "ds.micro_batch=0"], "micro_batch must be at least 1"),
    (["lab", "run", "mnist", "--set", "ds.micro_batch=5000"], "Global batch 10000"),
    (["lab", "run", "zero2", "--set", "memory.census_step=-1"], "memory.census_step -1: use 0 or more"),
    (["doctor", "--gpus", "2"], "add --distributed"),
    (["lab", "run", "mnist", "--set", "ds.lr=-1"], "lr must be positive"),
    (["lab", "run", "mnist", "--set", "ds.grad_clip=-1"], "must be 0 (off) or positive"),
    (["lab", "run", "zero2", "--set", "ds.bucket_size=0"], "bucket_size must be at least 1"),
    (["config", "new", "/tmp/plscale-never-written.json", "--gpus", "-2"], "world_size must be 0"),
    (["estimate", "memory", "--seq", "0"], "--seq 0: a sequence has at least one token"),
    (["estimate", "memory", "--budget", "-1"], "--budget -1: give the GiB one device has"),
])
def test_bad_input_is_one_line_and_exit_2(quick_cli, args, message):
    cli = quick_cli
    result = cli(*args, env={"CUDA_VISIBLE_DEVICES": ""})  # as on a CPU machine, whatever this one has
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], result.stderr
    assert "Traceback" not in result.stderr
    assert not cli.runs.exists() or not any(cli.runs.iterdir()), "a failed command left a run directory"


@pytest.mark.parametrize("text, line", [
    ("node0 slots=2\nnode1\n", "line 2: 'node1' is not 'host slots=N'"),
    ("node0 slots=0\nnode1 slots=2\n", "line 1: 'node0 slots=0' is not 'host slots=N' with N >= 1"),
    ("node0 slots=2\nnode0 slots=2\n", "host 'node0' is listed twice"),
    ("# only a comment\n", "lists no host"),
    ("node0 slots=2\n", "lists 1 host(s) but --nodes is 2"),
])
def test_malformed_hostfile_is_one_line_before_launch(quick_cli, tmp_path, text, line):
    cli = quick_cli
    hostfile = tmp_path / "hostfile"
    hostfile.write_text(text)
    result = cli("lab", "run", "mnist", "--gpus", "2", "--cpu", "--nodes", "2", "--hostfile", hostfile)
    assert result.returncode == 2 and line in result.stderr, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and not cli.runs.exists()


def test_data_dir_without_the_files(quick_cli, tmp_path):
    cli = quick_cli  # refused before launch: in this process
    (tmp_path / "empty").mkdir()
    result = cli("lab", "run", "mnist", "--data-dir", tmp_path / "empty")
    assert result.returncode == 2 and "has no MNIST idx files" in result.stderr


def test_bad_ds_config_files(quick_cli, tmp_path):
    cli = quick_cli  # refused before launch: in this process
    bad = tmp_path / "bad.json"
    bad.write_text("{oops")
    result = cli("lab", "run", "mnist", "--ds-config", bad)
    assert result.returncode == 2 and "is not valid JSON" in result.stderr
    bad.write_text(json.dumps({"train_batch_size": 30, "train_micro_batch_size_per_gpu": 4,
                               "gradient_accumulation_steps": 1}))
    result = cli("lab", "run", "mnist", "--gpus", "2", "--ds-config", bad)
    assert result.returncode == 2 and "30 != micro batch 4 x accumulation 1 x world size 2 = 8" in result.stderr
    result = cli("lab", "run", "mnist", "--ds-config", tmp_path / "missing.json")
    assert result.returncode == 2 and "Cannot read DeepSpeed config" in result.stderr


def test_config_commands(quick_cli, tmp_path):
    cli = quick_cli  # refused before launch: in this process
    out = tmp_path / "z3.json"
    assert cli("config", "new", out, "--stage", "3", "--gpus", "2").returncode == 0
    assert json.loads(out.read_text())["train_batch_size"] == 16
    refused = cli("config", "new", out, "--stage", "1")
    assert refused.returncode == 2 and "--force" in refused.stderr
    assert json.loads(out.read_text())["zero_optimization"]["stage"] == 3  # the good file survives
    bad = cli("config", "new", tmp_path / "x.json", "--stage", "2", "--offload-param")
    assert bad.returncode == 2 and "Parameter offload needs ZeRO stage 3" in bad.stderr
    assert not (tmp_path / "x.json").exists()
    assert cli("config", "check", out, "--gpus", "2").returncode == 0
    checked = cli("config", "check", out, "--gpus", "4")
    assert checked.returncode == 2 and "16 != micro batch 8 x accumulation 1 x world size 4 = 32" in checked.stdout
    diffed = cli("config", "diff", ROOT / "ds_configs" / "zero1.json", ROOT / "ds_configs" / "zero2.json")
    assert diffed.returncode == 0 and "zero_optimization.stage" in diffed.stdout
    assert cli("config", "sync", "--check").returncode == 0


def test_dry_run_prints_the_command_and_runs_nothing(cli):
    result = cli("lab", "run", "mnist", "--gpus", "2", "--cpu", "--dry-run")
    assert result.returncode == 0
    assert "DS_ACCELERATOR=cpu" in result.stdout and "--num_gpus 2" in result.stdout
    assert not cli.runs.exists()


def test_without_cpu_the_backend_follows_the_machine(cli):
    """No --cpu: NCCL on a machine with GPUs, gloo without; the same test passes on both."""
    from plscale.hardware import cuda_gpus

    result = cli("lab", "run", "mnist", "--gpus", "1", "--dry-run")
    assert result.returncode == 0, result.stderr
    if cuda_gpus():
        assert "over NCCL" in result.stdout and "DS_ACCELERATOR" not in result.stdout
    else:
        assert "over gloo" in result.stdout and "DS_ACCELERATOR=cpu" in result.stdout


@pytest.mark.e2e
def test_failing_rank_is_reported_with_its_last_lines(cli):
    result = cli("lab", "run", "crash", "--cpu", env={"PLSCALE_LABS_DIR": str(FIXTURE_LABS)}, timeout=300)
    assert result.returncode != 0
    assert "rank 1 failed; its last lines" in result.stdout
    assert "deliberate failure on rank 1" in result.stdout
    run = only_run(cli.runs)
    assert (run / "rank_1.error").exists() and (run / "rank_0.log").exists()


@pytest.mark.e2e
def test_ctrl_c_stops_every_rank(tmp_path):
    env = {**os.environ, "PLSCALE_LABS_DIR": str(FIXTURE_LABS), "PLSCALE_RUNS_DIR": str(tmp_path),
           "HF_HUB_OFFLINE": "1"}
    # A shell's background job starts with SIGINT ignored, and Python then installs no Ctrl-C
    # handler in its children: give the CLI the default, as a terminal would.
    proc = subprocess.Popen([sys.executable, "-m", "plscale.cli.main", "lab", "run", "hang", "--cpu"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.time() + 240
    while time.time() < deadline and len(list(tmp_path.glob("*/ready_*"))) < 2:
        time.sleep(0.5)
    assert len(list(tmp_path.glob("*/ready_*"))) == 2, "the ranks never started"
    run_dir = next(tmp_path.glob("*-hang-*"))
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=30) == 130
    time.sleep(1)
    left = subprocess.run(["pgrep", "-f", str(run_dir)], capture_output=True, text=True).stdout.split()
    assert left == [], f"orphan rank processes: {left}"


@pytest.mark.e2e
def test_two_nodes_on_one_machine(tmp_path):
    """--nodes 2 --node-rank R (no ssh): two plscale commands, one per 'node', form one world."""
    from plscale.hardware import free_port

    port = str(free_port())
    env = {**os.environ, "PLSCALE_RUNS_DIR": str(tmp_path), "HF_HUB_OFFLINE": "1"}
    base = [sys.executable, "-m", "plscale.cli.main", "lab", "run", "mnist-dp", "--gpus", "1", "--cpu", "--nodes", "2",
            "--master-addr", "127.0.0.1", "--master-port", port, "--steps", "10"]
    nodes = [subprocess.Popen(base + ["--node-rank", str(r)], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for r in (0, 1)]
    deadline = time.time() + 300
    while time.time() < deadline and any(node.poll() is None for node in nodes):
        if any(node.poll() not in (None, 0) for node in nodes):
            break  # one node failed: the other would wait for it forever
        time.sleep(0.5)
    for node in nodes:
        if node.poll() is None:
            node.kill()
    outputs = [node.communicate()[0] for node in nodes]
    assert [node.returncode for node in nodes] == [0, 0], outputs
    summaries = list(tmp_path.glob("*/summary.json"))
    assert len(summaries) == 1, "exactly one node (node 0) holds global rank 0"
    system = json.loads((summaries[0].parent / "system.json").read_text())
    assert system["world_size"] == 2
    assert json.loads(summaries[0].read_text())["passed"]
    assert len(list(tmp_path.glob("*/rank_1.log"))) == 1 and "node 0's run directory" in outputs[1]
