"""The scripts that run on a pod (runpod/*.sh), run here in bash: jobs that outlive ssh, one node
of a multi-node run from the cluster's variables (through plscale's --dry-run), the hostfile, this
node's address, and bootstrap with stand-ins for python, pip and plscale. No network, no GPU."""

import hashlib
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from plscale.run.hostfile import read_hostfile

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ROOT / "runpod"
CLUSTER_VARS = ("PRIMARY_ADDR", "MASTER_ADDR", "PRIMARY_PORT", "MASTER_PORT", "NODE_RANK", "NUM_NODES",
                "NUM_TRAINERS", "NODE_ADDR", "NODE_ADDRS", "RUNPOD_POD_ID", "NCCL_SOCKET_IFNAME")


def _missing_tools() -> str | None:
    for tool in ("bash", "setsid", "tail"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed"
    version = subprocess.run(["tail", "--version"], capture_output=True, text=True).stdout
    return None if "GNU" in version else "tail is not GNU tail (job.sh follows with --pid)"


pytestmark = pytest.mark.skipif(_missing_tools() is not None, reason=str(_missing_tools()))


def run(script, *args, env=None, cwd=None, timeout=30) -> subprocess.CompletedProcess:
    """`bash runpod/SCRIPT ARGS`, without the cluster's variables of this machine, and never reading
    the container environment of its PID 1."""
    base = {k: v for k, v in os.environ.items() if k not in CLUSTER_VARS}
    full = {**base, "PLSCALE_CONTAINER_ENV": os.devnull, "HF_HUB_OFFLINE": "1", **(env or {})}
    return subprocess.run(["bash", str(SCRIPTS / script), *map(str, args)], env=full, cwd=cwd,
                          capture_output=True, text=True, timeout=timeout)


# --- job.sh ---------------------------------------------------------------------------------------

def job(tmp_path, *args, **kw):
    return run("job.sh", *args, cwd=tmp_path, **kw)


def test_job_runs_detached_and_reports_its_exit_code(tmp_path):
    started = job(tmp_path, "start", "one", "--", "bash", "-c", "echo first; echo oops >&2; sleep 0.5; echo last; exit 3")
    assert started.returncode == 0, started.stderr
    pid = int(started.stdout)
    assert os.getsid(pid) == pid  # its own session: the ssh session's end does not reach it
    assert (tmp_path / ".plscale/jobs/one.pid").read_text().strip() == str(pid)
    assert job(tmp_path, "status", "one").stdout == "running\n"

    again = job(tmp_path, "start", "one", "--", "true")
    assert again.returncode == 2 and "running" in again.stderr

    followed = job(tmp_path, "follow", "one")
    assert followed.returncode == 3
    assert followed.stdout.split() == ["first", "oops", "last"]
    assert (tmp_path / ".plscale/jobs/one.rc").read_text().strip() == "3"
    assert job(tmp_path, "status", "one").stdout == "exited 3\n"
    assert job(tmp_path, "tail", "one", "1").stdout == "last\n"
    assert job(tmp_path, "tail", "one").stdout.split() == ["first", "oops", "last"]
    assert job(tmp_path, "follow", "one").returncode == 3  # an ended job: its log, then its code
    assert job(tmp_path, "stop", "one").returncode == 0    # ended already: nothing to do


def test_job_stdin_is_empty_and_latest_is_the_last_started(tmp_path):
    assert job(tmp_path, "latest").returncode == 2
    job(tmp_path, "start", "first", "--", "cat")
    job(tmp_path, "start", "second", "--", "cat")  # reads /dev/null: ends at once
    latest = job(tmp_path, "latest")
    assert latest.returncode == 0 and latest.stdout == "second\n"
    assert job(tmp_path, "follow", "second").returncode == 0


def test_job_stop_ends_the_whole_process_group(tmp_path):
    pid = int(job(tmp_path, "start", "long", "--", "bash", "-c", "sleep 60 & sleep 60; wait").stdout)
    stopped = job(tmp_path, "stop", "long")
    assert stopped.returncode == 0, stopped.stderr
    assert job(tmp_path, "status", "long").stdout == "exited 143\n"
    assert not _live_members(pid)
    assert job(tmp_path, "stop", "long").returncode == 0


def test_job_stop_kills_what_ignores_term(tmp_path):
    pid = int(job(tmp_path, "start", "stubborn", "--", "bash", "-c", "trap '' TERM; sleep 60").stdout)
    time.sleep(0.3)  # let it set its trap
    stopped = job(tmp_path, "stop", "stubborn", env={"PLSCALE_JOB_GRACE": "1"})
    assert stopped.returncode == 0
    assert job(tmp_path, "status", "stubborn").stdout == "exited 137\n"
    assert not _live_members(pid)


def test_job_killed_from_outside_reports_no_exit_code(tmp_path):
    pid = int(job(tmp_path, "start", "gone", "--", "sleep", "60").stdout)
    os.killpg(pid, signal.SIGKILL)
    deadline = time.time() + 5
    while _live_members(pid) and time.time() < deadline:
        time.sleep(0.05)
    followed = job(tmp_path, "follow", "gone")
    assert followed.returncode == 1 and "exit code" in followed.stderr
    assert job(tmp_path, "status", "gone").stdout == "exited 1\n"


@pytest.mark.parametrize("args", [["follow", "nope"], ["status", "nope"], ["tail", "nope"], ["stop", "nope"],
                                  ["start", "../x", "--", "true"], ["start", "x"], ["start", "x", "true"],
                                  ["frobnicate"]])
def test_job_refuses_unknown_jobs_and_bad_use(tmp_path, args):
    result = job(tmp_path, *args)
    assert result.returncode == 2
    assert result.stderr.startswith("job.sh: ") and result.stderr.count("\n") == 1


def _live_members(pgid: int) -> list:
    """Processes of group pgid that have not ended (zombies, ended but not yet reaped, do not count)."""
    live = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            live.append(stat.parent.name)
    return live


# --- launch_multinode.sh --------------------------------------------------------------------------

CLUSTER = {"PRIMARY_ADDR": "10.65.0.2", "PRIMARY_PORT": "29601", "NODE_RANK": "1", "NUM_NODES": "2",
           "NUM_TRAINERS": "2"}


def launch(tmp_path, env, *args):
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"  # plscale resolves
    return run("launch_multinode.sh", "zero2", *args, "--dry-run", cwd=tmp_path,
               env={"PATH": path, "PLSCALE_RUNS_DIR": str(tmp_path / "runs"), **env})


def test_launch_multinode_starts_this_node_without_ssh(tmp_path):
    result = launch(tmp_path, CLUSTER)
    assert result.returncode == 0, result.stderr
    for part in ("--no_ssh", "--node_rank 1", "--master_addr 10.65.0.2", "--master_port 29601",
                 "--num_nodes 2", "--num_gpus 2"):
        assert part in result.stdout, (part, result.stdout)
    assert "node 1 of 2" in result.stderr


def test_launch_multinode_takes_master_names_and_the_default_port(tmp_path):
    env = {"MASTER_ADDR": "node0.example", "NODE_RANK": "0", "NUM_NODES": "2", "NUM_TRAINERS": "2",
           "NCCL_SOCKET_IFNAME": "lo"}
    result = launch(tmp_path, env)
    assert result.returncode == 0, result.stderr
    assert "--master_addr node0.example" in result.stdout and "--node_rank 0" in result.stdout
    assert "--master_port 29500" in result.stdout
    assert "NCCL_SOCKET_IFNAME=lo" in result.stderr  # the user's choice stays


def test_launch_multinode_reads_the_container_environment(tmp_path):
    """Over ssh the cluster's variables are missing: they come from PID 1's environment."""
    environ = tmp_path / "environ"
    environ.write_bytes(b"".join(f"{k}={v}\0".encode() for k, v in {**CLUSTER, "NODE_RANK": "0"}.items()))
    result = launch(tmp_path, {"PLSCALE_CONTAINER_ENV": str(environ), "NODE_RANK": "1"})
    assert result.returncode == 0, result.stderr
    assert "--master_addr 10.65.0.2" in result.stdout and "--node_rank 1" in result.stdout  # set here wins


@pytest.mark.parametrize("name", ["PRIMARY_ADDR", "NODE_RANK", "NUM_NODES", "NUM_TRAINERS"])
def test_launch_multinode_names_a_missing_variable(tmp_path, name):
    result = launch(tmp_path, {k: v for k, v in CLUSTER.items() if k != name})
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and f"{name} is not set" in result.stderr
    assert "export" in result.stderr


def test_launch_multinode_needs_a_lab(tmp_path):
    result = run("launch_multinode.sh", env=CLUSTER)
    assert result.returncode == 2 and "usage" in result.stderr


# --- hostfile.sh and node_addr.sh -----------------------------------------------------------------

def test_hostfile_from_node_addrs(tmp_path):
    result = run("hostfile.sh", tmp_path / "hosts",
                 env={"NODE_ADDRS": "10.65.0.2 10.65.0.3", "NUM_NODES": "2", "NUM_TRAINERS": "8"})
    assert result.returncode == 0, result.stderr
    assert result.stdout == "10.65.0.2 slots=8\n10.65.0.3 slots=8\n"
    assert (tmp_path / "hosts").read_text() == result.stdout
    assert read_hostfile(str(tmp_path / "hosts")) == {"10.65.0.2": 8, "10.65.0.3": 8}  # plscale accepts it


def test_hostfile_defaults_to_the_primary_and_node_names(tmp_path):
    result = run("hostfile.sh", env={"PRIMARY_ADDR": "10.65.0.2", "NUM_NODES": "3", "NUM_TRAINERS": "4"},
                 cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "hostfile").read_text() == "10.65.0.2 slots=4\nnode-1 slots=4\nnode-2 slots=4\n"


@pytest.mark.parametrize("env", [{"NUM_NODES": "2"}, {"NUM_NODES": "x", "NUM_TRAINERS": "2"},
                                 {"NODE_ADDRS": "a b c", "NUM_NODES": "2", "NUM_TRAINERS": "2"}])
def test_hostfile_refuses_a_bad_environment(tmp_path, env):
    result = run("hostfile.sh", env=env, cwd=tmp_path)
    assert result.returncode == 2 and result.stderr.count("\n") == 1
    assert not (tmp_path / "hostfile").exists()


def test_node_addr_prefers_node_addr():
    result = run("node_addr.sh", env={"NODE_ADDR": "10.65.0.3", "RUNPOD_POD_ID": "abc123"})
    assert (result.returncode, result.stdout) == (0, "10.65.0.3\n")


def test_node_addr_uses_the_global_network_name_when_it_resolves(tmp_path):
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "getent").write_text('#!/bin/sh\n[ "$2" = abc123.runpod.internal ] && echo "10.0.0.7 $2"\n')
    (fake / "getent").chmod(0o755)
    env = {"RUNPOD_POD_ID": "abc123", "PATH": f"{fake}{os.pathsep}{os.environ['PATH']}"}
    result = run("node_addr.sh", env=env)
    assert (result.returncode, result.stdout) == (0, "abc123.runpod.internal\n")
    other = run("node_addr.sh", env={**env, "RUNPOD_POD_ID": "zzz"})  # no such name: hostname -I
    assert other.stdout.strip() != "zzz.runpod.internal"


# --- bootstrap.sh, with stand-ins ------------------------------------------------------------------

STAND_IN_PYTHON = """#!/bin/bash
echo "python $*" >> "$CALLS"
case "$*" in
  *cuda.is_available*) exit "${FAKE_CUDA_RC:-0}" ;;
  *torch.__version__*) echo 2.8.0+cu128 ;;
  *sysconfig*) echo /opt/fake/bin ;;
esac
"""


def bootstrap_env(tmp_path, gpu: bool) -> tuple:
    project = tmp_path / "project"
    (project / "runpod").mkdir(parents=True)
    shutil.copy(SCRIPTS / "bootstrap.sh", project / "runpod")
    (project / "pyproject.toml").write_text('[project]\nname = "plscale"\n')
    shutil.copy(SCRIPTS.parent / "constraints.txt", project)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    stand_ins = {"python": STAND_IN_PYTHON, "plscale": '#!/bin/bash\necho "plscale $*" >> "$CALLS"\n',
                 "rsync": "#!/bin/sh\n"}
    if gpu:
        stand_ins["nvidia-smi"] = "#!/bin/sh\necho 'GPU 0: NVIDIA A40'\n"
    for name, text in stand_ins.items():
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    calls = tmp_path / "calls"
    env = {"PATH": f"{bin_dir}{os.pathsep}/usr/bin{os.pathsep}/bin", "PYTHON": "python", "CALLS": str(calls)}
    return project, env, calls


def test_bootstrap_installs_keeps_torch_and_records_pyproject(tmp_path):
    project, env, calls = bootstrap_env(tmp_path, gpu=True)
    for _ in range(2):  # idempotent
        result = subprocess.run(["bash", "runpod/bootstrap.sh"], cwd=project, env=env, capture_output=True,
                                text=True, timeout=30)
        assert result.returncode == 0, result.stderr
    log = calls.read_text()
    assert log.count("python -m pip install -q -c .plscale/constraints-pod.txt -e .") == 2
    pins = (project / ".plscale/constraints-pod.txt").read_text()   # the references' versions, not their torch
    assert "deepspeed==" in pins and "\ntorch==" not in "\n" + pins
    assert "cuda.is_available" in log and log.count("plscale doctor") == 2
    digest = hashlib.sha256((project / "pyproject.toml").read_bytes()).hexdigest()
    assert (project / ".plscale/bootstrapped").read_text() == digest + "\n"


def test_bootstrap_refuses_a_torch_without_cuda_on_a_gpu_pod(tmp_path):
    project, env, calls = bootstrap_env(tmp_path, gpu=True)
    result = subprocess.run(["bash", str(project / "runpod/bootstrap.sh")], cwd=tmp_path,
                            env={**env, "FAKE_CUDA_RC": "1"}, capture_output=True, text=True, timeout=30)
    assert result.returncode == 2 and "does not see CUDA" in result.stderr
    assert not (project / ".plscale/bootstrapped").exists()
