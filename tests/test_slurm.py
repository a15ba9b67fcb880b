"""`plscale slurm` against a real Slurm: munge, slurmctld and slurmd on this machine (tests/slurm/start.sh:
two nodes, each a slurmd in its own network namespace, or one where namespaces cannot be made). The labs
are submitted through the CLI as a user would; the tests skip, saying why, where Slurm is not installed
or does not start. Bad input needs no Slurm."""

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT, load_summary, only_run, run_cli
from plscale.lab.rundir import node_scratch

START = ROOT / "tests" / "slurm" / "start.sh"
QUICK = ["--cpu", "--gpus", "2", "--set", "model.preset=tiny", "--set", "model.seq=32", "--set", "ds.micro_batch=2"]
SHARED = "--shared"  # the test cluster's nodes are this machine: its disk is shared in fact


@pytest.fixture(scope="module")
def slurm():
    """SLURM_CONF of a running one-node cluster, started here if it is not up yet."""
    if not (shutil.which("sbatch") and (shutil.which("slurmctld") or Path("/usr/sbin/slurmctld").exists())):
        pytest.skip("Slurm is not installed (apt-get install slurm-wlm munge; .ci/run installs it)")
    started = subprocess.run(["bash", str(START)], capture_output=True, text=True, timeout=120)
    if started.returncode != 0:
        pytest.skip(f"Slurm did not start here: {started.stderr.strip().splitlines()[-1:]}")
    return started.stdout.strip().splitlines()[-1]


@pytest.fixture
def submit(slurm, tmp_path):
    """`plscale slurm ...` with runs/ under a temporary folder, against the test cluster."""

    def call(*args, **kwargs):
        return run_cli("slurm", *args, env={"PLSCALE_RUNS_DIR": str(tmp_path / "slurm-runs"), "SLURM_CONF": slurm}, **kwargs)

    call.runs = tmp_path / "slurm-runs"
    call.env = {**os.environ, "PLSCALE_RUNS_DIR": str(tmp_path / "slurm-runs"), "SLURM_CONF": slurm, "HF_HUB_OFFLINE": "1",
                "COLUMNS": "200"}
    return call


def losses(run_dir: Path) -> list:
    return [row["loss"] for row in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines()) if "loss" in row]


@pytest.fixture(scope="module")
def here(tmp_path_factory):
    """The losses of the same run under `plscale lab run` on this machine: 2 CPU ranks."""
    runs = tmp_path_factory.mktemp("here")
    out = run_cli("lab", "run", "zero2", *QUICK, "--steps", "3", "--launcher", "torchrun",
                  env={"PLSCALE_RUNS_DIR": str(runs)})
    assert out.returncode == 0, out.stdout + out.stderr
    return losses(only_run(runs))


def test_a_lab_submitted_to_slurm_trains_as_it_does_here_and_its_run_directory_is_reported(submit, here):
    out = submit("submit", "zero2", *QUICK, SHARED, "--steps", "3")
    assert out.returncode == 0, out.stdout + out.stderr
    run_dir = only_run(submit.runs)
    job = json.loads((run_dir / "slurm.json").read_text())["job"]
    assert f"Submitted job {job}" in out.stdout and f"job {job}: RUNNING" in out.stdout
    assert "model states match the ZeRO model" in out.stdout  # rank 0's lines, followed from the job's output
    assert all(check["ok"] for check in load_summary(run_dir)["checks"])
    assert "rendezvous at" in (run_dir / f"slurm-{job}.out").read_text()
    assert losses(run_dir) == pytest.approx(here, abs=1e-6)  # the same ranks, settings and losses
    status = submit("status", job)
    assert "COMPLETED" in status.stdout and str(run_dir) in status.stdout and "3/3 loss" in status.stdout
    assert "model states match the ZeRO model" in submit("logs", job, "-n", "200").stdout
    assert "model: Llama-shaped 'tiny'" in submit("logs", str(run_dir), "--rank", "0", "-n", "200").stdout
    report = run_cli("report", run_dir)
    assert report.returncode == 0 and "model states per rank" in report.stdout


def test_two_nodes_meet_over_the_network_and_train_as_two_ranks_on_one_node(submit, slurm, here):
    nodes = subprocess.run(["sinfo", "-h", "-o", "%D"], capture_output=True, text=True, env=submit.env).stdout.split()
    if sum(map(int, nodes)) < 2:
        pytest.skip("the test cluster has one node here (no network namespaces: tests/slurm/start.sh)")
    args = [a if a != "2" else "1" for a in QUICK]  # --gpus 1: one rank a node
    out = submit("submit", "zero2", *args, "--nodes", "2", SHARED, "--steps", "3")
    assert out.returncode == 0, out.stdout + out.stderr
    run_dir = only_run(submit.runs)
    hosts = {(run_dir / "pids" / f"rank_{r}").read_text().split()[1] for r in (0, 1)}
    assert len(hosts) == 2, hosts  # a rank on each node, in its own network namespace
    assert losses(run_dir) == pytest.approx(here, abs=1e-6)


def test_a_failing_job_is_reported_failed_with_the_ranks_last_lines(submit):
    out = submit("submit", "ckpt", *QUICK, SHARED, "--steps", "6", "--set", "ckpt.every=2", "--set", "fault.step=3",
                 "--set", "fault.rank=1", "--set", "ckpt.strategy=multilevel", "--set", "ckpt.durable_every=4")
    assert out.returncode != 0 and out.returncode != 2, out.stdout + out.stderr
    assert "ended FAILED" in out.stdout, out.stdout
    # rank 0 fails in its next collective, or torchrun stops it first: a rank's last lines, or the job's
    assert "failed; its last lines" in out.stdout or "last lines of the launcher's output" in out.stdout, out.stdout
    assert "Diagnosis" in out.stdout and "labs/06_checkpointing/train.py" in out.stdout, out.stdout
    run_dir = only_run(submit.runs)
    job = json.loads((run_dir / "slurm.json").read_text())["job"]
    assert "FAILED" in submit("status", job).stdout
    assert "fast tier" in (run_dir / "rank_0.log").read_text()  # step 2 went to node-local memory...
    assert not node_scratch(run_dir).exists()  # ...which the job cleared on its way out, failed or not


def test_ctrl_c_asks_before_cancelling_and_cancel_ends_the_job(submit):
    def follow(*args):
        # Ctrl-C as at a terminal: a shell that starts the suite in the background (`... &`) passes SIGINT on ignored
        process = subprocess.Popen([sys.executable, "-m", "plscale.cli.main", "slurm", *args], cwd=ROOT, env=submit.env,
                                   stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                   preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        seen = []
        for line in process.stdout:  # until the ranks train
            seen.append(line)
            if "/400 loss" in line:
                return process, seen
        raise AssertionError("".join(seen))

    follower, seen = follow("submit", "zero2", *QUICK, SHARED, "--steps", "400")
    follower.send_signal(signal.SIGINT)
    answer, _ = follower.communicate("n\n", timeout=60)  # "no": the job goes on
    assert follower.returncode == 130 and "Cancel job" in answer and "goes on" in answer, "".join(seen) + answer
    run_dir = only_run(submit.runs)
    job = json.loads((run_dir / "slurm.json").read_text())["job"]
    queue = submit("status")
    assert job in queue.stdout and "RUNNING" in queue.stdout and "plscale-zero-zero2" in queue.stdout, queue.stdout
    again, _ = follow("logs", job, "-f")  # picks the job up again
    cancelled = submit("cancel", job)
    assert cancelled.returncode == 0 and "CANCELLED" in cancelled.stdout, cancelled.stdout + cancelled.stderr
    rest, _ = again.communicate(timeout=60)
    assert again.returncode == 130 and f"job {job} ended CANCELLED" in rest, rest
    assert "CANCELLED" in submit("status", str(run_dir)).stdout


def fake_commands(folder: Path, **scripts) -> dict:
    """PATH with Slurm commands that print and exit as told: name="text|code"."""
    folder.mkdir(exist_ok=True)
    for name, spec in scripts.items():
        text, code = spec.rsplit("|", 1)
        (folder / name).write_text(f"#!/bin/sh\ncat <<'EOF'\n{text}\nEOF\nexit {code}\n")
        (folder / name).chmod(0o755)
    return {"PATH": f"{folder}:{os.environ['PATH']}"}


def test_a_job_the_controller_forgot_is_read_from_accounting_then_from_its_run_directory(tmp_path, monkeypatch):
    from plscale.slurm import jobs

    forgot = "slurm_load_jobs error: Invalid job id specified|1"
    monkeypatch.setenv("PATH", fake_commands(tmp_path / "a", scontrol=forgot,
                                             sacct="42|TIMEOUT|None|0:15|plsn1|00:10:00|plscale-zero-zero2|0")["PATH"])
    known = jobs.state("42")
    assert (known.state, known.signal, known.finished, known.name) == ("TIMEOUT", 15, True, "plscale-zero-zero2")
    monkeypatch.setenv("PATH", fake_commands(tmp_path / "b", scontrol=forgot, sacct="|0")["PATH"])
    assert jobs.state("42") is None
    run_dir = tmp_path / "runs" / "20261203-120000-zero-zero2"
    run_dir.mkdir(parents=True)
    (run_dir / "slurm.json").write_text(json.dumps({"job": "42"}))
    assert jobs.find_run_dir("42", tmp_path / "runs") == run_dir
    monkeypatch.setenv("PATH", fake_commands(tmp_path / "c", scontrol="slurm_load_jobs error: Unable to contact "
                                             "slurm controller (connect failure)|1")["PATH"])
    with pytest.raises(jobs.Unreachable, match="Unable to contact slurm controller"):
        jobs.state("42")  # not "the job is gone": following goes on asking


@pytest.mark.parametrize("state, signal_number, code, fix", [
    ("TIMEOUT", 15, 124, "It ran past its --time"),
    ("OUT_OF_MEMORY", 125, 1, "--sbatch=--mem=64G"),
    ("NODE_FAIL", 0, 1, "submit it again (`sinfo -R`"),
])
def test_how_a_job_ended_is_said_with_its_fix_and_exit_code(tmp_path, state, signal_number, code, fix):
    from rich.console import Console

    from plscale.slurm import follow, jobs

    console = Console(record=True, width=200)
    final = jobs.JobState("42", state, "None", 0 if state != "NODE_FAIL" else 1, signal_number, "plsn1", "00:10:00",
                          "plscale-zero-zero2", str(tmp_path / "slurm-42.out"))
    assert follow.outcome(final, tmp_path, console) == code
    text = console.export_text()
    assert f"job 42 ended {state}" in text and fix in text, text
    assert "signal 125" not in text  # Slurm's mark of an out-of-memory kill, not a signal


def fake_venv(folder: Path, cuda: str) -> Path:
    """A virtualenv whose python says its torch was built for CUDA `cuda` ("" for a CPU-only build)."""
    (folder / "bin").mkdir(parents=True)
    (folder / "bin" / "activate").write_text("")
    (folder / "bin" / "python").write_text(f"#!/bin/sh\necho '{cuda}'\n")
    (folder / "bin" / "python").chmod(0o755)
    return folder


@pytest.mark.parametrize("args, message", [
    (["--cpu", SHARED, "--partition", "nope"], "Slurm refuses the job: invalid partition specified: nope"),
    (["--gpus", "2", SHARED, "--venv", "CUDA"], "this partition has no such GPUs: pick a GPU partition with --partition"),
    (["--gpus", "2", SHARED, "--venv", "CPU"], "has a CPU-only torch, so its GPU ranks would run on CPUs"),
    (["--cpu", "--cpus-per-node", "64", SHARED], "Requested node configuration is not available"),
    (["--cpu"], "is on this machine's own disk (ext4), and the job runs on compute nodes that must read it"),
])
def test_what_slurm_or_the_cluster_refuses_fails_in_one_line_and_submits_nothing(submit, args, message, tmp_path):
    venvs = {"CUDA": fake_venv(tmp_path / "cuda", "12.6"), "CPU": fake_venv(tmp_path / "cpu", "")}
    out = submit("submit", "zero2", *[str(venvs.get(a, a)) for a in args])
    assert out.returncode == 2 and message in out.stderr, out.stdout + out.stderr
    assert not submit.runs.exists() or not any(submit.runs.iterdir())
    queued = subprocess.run(["squeue", "-h", "-o", "%j"], capture_output=True, text=True, env=submit.env)
    assert "plscale-" not in queued.stdout


@pytest.mark.parametrize("args, message", [
    (["submit", "zero2", "--hostfile", "hosts"], "--hostfile: a Slurm job picks its nodes and port itself"),
    (["submit", "zero2", "--launcher", "deepspeed"], "A Slurm job starts torchrun on every node, and --launcher asks"),
    (["submit", "imdb", "--variant", "deepspeed"], "variant 'deepspeed' asks for deepspeed"),
    (["submit", "zero2", "--venv", "/nonexistent"], "--venv /nonexistent: no bin/activate there"),
    (["submit", "zero2", "--sbatch", "qos=high"], "give sbatch's long option with its value"),
    (["submit", "zero2", "--sbatch=--output=x.out"], "plscale sets --output itself (the job's output goes into the run"),
    (["submit", "zero2", "--sbatch=--gres=gpu:2"], "plscale sets --gres itself (use --gpus (per node) and --gpu-type)"),
    (["submit", "zero2", "--partiton", "gpu"], "plscale slurm submit: unrecognized arguments: --partiton gpu"),
    (["submit", "zero2", "--time", "-5"], "--time '-5': give Slurm's form: minutes (30), MM:SS, HH:MM:SS"),
    (["submit", "zero2", "--time", "1h"], "--time '1h': give Slurm's form"),
    (["submit", "zero2", "--set", "model.preset=smol"], "No model preset 'smol'"),
    (["status", "not-a-job"], "is neither a job id nor a run directory"),
    (["submit", "zero2", "--gpus", "3"], "Lab zero runs with 1, 2, 4, 8 ranks, not 3"),
    (["submit", "zero2", "--venv", "/", "--conda", "base"], "--venv and --conda: name one environment"),
])
def test_bad_input_fails_before_slurm_is_asked(quick_cli, args, message):
    out = quick_cli("slurm", *args)
    assert out.returncode == 2 and message in out.stderr, out.stdout + out.stderr


def test_without_sbatch_submit_says_where_to_run_it_and_dry_run_still_prints(quick_cli, tmp_path):
    env = {"PATH": str(tmp_path)}  # no Slurm command here
    out = quick_cli("slurm", "submit", "zero2", "--cpu", env=env)
    assert out.returncode == 2 and "sbatch is not on PATH: run plscale on the cluster's login node" in out.stderr
    dry = quick_cli("slurm", "submit", "zero2", "--cpu", "--dry-run", env=env)
    assert dry.returncode == 0 and "#SBATCH --job-name=plscale-zero-zero2" in dry.stdout
    assert not quick_cli.runs.exists()


def test_launcher_slurm_points_at_slurm_submit(quick_cli):
    out = quick_cli("lab", "run", "zero2", "--launcher", "slurm")
    assert out.returncode == 2 and "plscale slurm submit LAB" in out.stderr


def test_a_two_node_gpu_script_asks_for_what_the_run_needs_and_is_valid_bash(quick_cli, tmp_path):
    preamble = tmp_path / "preamble.sh"
    preamble.write_text("module load cuda/12.4\n")
    out = quick_cli("slurm", "submit", "zero2", "--nodes", "2", "--gpus", "4", "--partition", "gpu", "--account", "lab",
                    "--time", "1:00:00", "--sbatch=--qos=high", "--preamble", preamble, "--dry-run")
    assert out.returncode == 0, out.stderr
    text = out.stdout
    for line in ["#SBATCH --nodes=2", "#SBATCH --gpus-per-node=4", "#SBATCH --cpus-per-task=16",
                 "#SBATCH --partition=gpu", "#SBATCH --account=lab", "#SBATCH --time=1:00:00", "#SBATCH --qos=high",
                 "module load cuda/12.4", "torchrun --nnodes 2 --nproc_per_node 4 --rdzv_backend c10d",
                 "HF_HUB_OFFLINE=1", "labs/04_zero/train.py --run-dir"]:
        assert line in text, line
    assert "DS_ACCELERATOR" not in text  # NCCL ranks on the job's GPUs
    script = tmp_path / "job.sbatch"
    script.write_text(text)
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0


def test_a_cpu_partition_script_shares_the_jobs_cpus_and_activates_the_conda_environment(quick_cli):
    out = quick_cli("slurm", "submit", "zero2", "--cpu", "--gpus", "4", "--cpus-per-node", "16", "--conda", "course",
                    "--dry-run")
    assert out.returncode == 0, out.stderr
    for line in ["#SBATCH --cpus-per-task=16", "conda activate course", "DS_ACCELERATOR=cpu",
                 "export OMP_NUM_THREADS=$(( SLURM_CPUS_PER_TASK / 4 > 0 ? SLURM_CPUS_PER_TASK / 4 : 1 ))"]:
        assert line in out.stdout, line
    assert "--gpus-per-node" not in out.stdout and "source " not in out.stdout


def test_a_job_slurm_does_not_know_is_named_in_one_line(submit):
    for command in ("status", "cancel", "logs"):
        out = submit(command, "999999")
        assert out.returncode == 2 and "999999" in out.stderr and len(out.stderr.strip().splitlines()) == 1, \
            (command, out.stdout, out.stderr)


def test_doctor_says_whether_slurm_answers_here(submit, tmp_path):
    up = run_cli("doctor", env={"SLURM_CONF": submit.env["SLURM_CONF"]})
    assert "controller up: plscale slurm submit LAB" in up.stdout, up.stdout
    none = run_cli("doctor", env={"PATH": f"{tmp_path}:{os.path.dirname(sys.executable)}"})  # no Slurm command
    assert "no sbatch: `plscale slurm` runs on a Slurm cluster's login node" in none.stdout, none.stdout
