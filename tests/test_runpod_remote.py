"""`plscale runpod ssh|sync|run|logs|fetch` for real, against sshd on loopback standing in for pods.

The API is the fake (tests/helpers/fake_runpod.py); the pods' SSH endpoints point at a real
sshd that logs this user in, with this virtualenv's `plscale` on its PATH as on a bootstrapped
pod. So the exact ssh and rsync commands a student runs are the ones tested, and the lab runs
for real on the "pod" (2 CPU ranks). Two pods at one sshd make a 2-node cluster.
"""

import getpass
import hashlib
import json

import pytest

from conftest import ROOT, run_cli
from plscale.hardware import free_port
from helpers import watchdogs
from helpers.fake_runpod import FakeRunPod


@pytest.fixture
def pods(tmp_path, sshd):
    """A cluster of `nodes` pods, up through the real CLI; torn down afterwards."""
    fake = FakeRunPod().start()
    fake.ssh_endpoints = [(sshd.host, sshd.port)]
    fake.environ_dir = tmp_path / "environ"  # each pod's container environment, where its watchdog reads its key
    env = {"XDG_CONFIG_HOME": str(tmp_path / "config"), "XDG_STATE_HOME": str(tmp_path / "state"),
           "PLSCALE_RUNPOD_API": fake.url, "RUNPOD_API_KEY": fake.key, "PLSCALE_RUNPOD_POLL": "0.1",
           "PLSCALE_RUNPOD_SSH_USER": getpass.getuser(), "PLSCALE_RUNS_DIR": str(tmp_path / "local_runs"),
           "PLSCALE_RUNPOD_POD_ENVIRON": str(tmp_path / "environ" / "{pod}"), "PLSCALE_RUNPOD_WATCHDOG_POLL": "0.5"}
    remote_dir = tmp_path / "pod"

    def up(nodes=1):
        # The pod is "bootstrapped" already (this virtualenv): sync's check finds the marker.
        (remote_dir / ".plscale").mkdir(parents=True, exist_ok=True)
        (remote_dir / ".plscale" / "bootstrapped").write_text(
            hashlib.sha256((ROOT / "pyproject.toml").read_bytes()).hexdigest() + "\n")
        done = cli("up", "--gpus", 1, "--gpu-type", "NVIDIA A40", "--nodes", nodes, "--ssh-key", sshd.key,
                   "--remote-dir", remote_dir, "--timeout", 30, "--yes")
        assert done.returncode == 0, done.stderr
        return done

    def cli(*args, **kwargs):
        return run_cli("runpod", *args, env=env, **kwargs)

    cli.up, cli.fake, cli.remote_dir, cli.env, cli.tmp = up, fake, remote_dir, env, tmp_path
    try:
        yield cli
        cli("down", "--all", "--yes")
        assert fake.alive() == [] and fake.clusters_alive() == []
        fake.check()  # every request and answer held to RunPod's published schema
    finally:
        watchdogs.stop(remote_dir)
        fake.stop()


def test_ssh_sync_and_run_on_one_pod(pods):
    pods.up()
    done = pods("ssh", "--", "echo hello from the pod; exit 3")  # words joined by spaces, as ssh does
    assert done.returncode == 3 and done.stdout.strip() == "hello from the pod"

    secrets = [ROOT / ".env", ROOT / "labs" / "plscale-test.pem"]  # a student's secrets in the checkout
    made = [p for p in secrets if not p.exists()]
    try:
        for path in made:
            path.write_text("RUNPOD_API_KEY=not-for-the-pod\n")
        done = pods("sync")
    finally:
        for path in made:
            path.unlink()
    assert done.returncode == 0, done.stderr
    copied = pods.remote_dir
    assert not (copied / ".env").exists() and not (copied / "labs" / "plscale-test.pem").exists()
    assert (copied / "pyproject.toml").read_bytes() == (ROOT / "pyproject.toml").read_bytes()
    assert (copied / "runpod" / "job.sh").is_file() and (copied / "labs").is_dir()
    assert not (copied / ".venv").exists() and not (copied / ".git").exists()

    done = pods("logs")
    assert done.returncode == 2 and "No run on node 0 yet" in done.stderr, done.stderr
    done = pods("run", "no-such-lab", "--no-sync")  # refused here, before anything is started
    assert done.returncode == 2 and "No lab named 'no-such-lab'" in done.stderr and not (copied / ".plscale" / "jobs").exists()
    done = pods("run", "collectives", "--cpu", "--gpus", "5", "--no-sync")  # refused by plscale on the pod
    assert done.returncode == 2 and "not 5" in done.stdout, done.stdout + done.stderr  # its line, streamed here
    assert (copied / ".plscale" / "jobs").is_dir()  # it ran there, as a job


def test_two_pods_form_one_world(pods):
    """`run` on 2 pods: each node starts runpod/launch_multinode.sh with its rank and node 0's address;
    the run's directory comes back with `fetch` and reads with `plscale report`."""
    pods.up(nodes=2)
    done = pods("run", "collectives", "--cpu", "--gpus", "5", timeout=120)  # syncs first; every node fails
    assert done.returncode == 2 and "Stopped the run on every node" in done.stderr, done.stdout + done.stderr

    done = pods("run", "mnist-dp", "--cpu", "--gpus", "1", "--steps", "5", "--master-port", free_port(), "--no-sync",
                timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    summaries = list((pods.remote_dir / "runs").glob("*/summary.json"))
    assert len(summaries) == 1, "node 0 holds global rank 0's summary"
    run_dir = summaries[0].parent
    assert json.loads((run_dir / "system.json").read_text())["world_size"] == 2
    assert json.loads(summaries[0].read_text())["passed"]
    jobs = pods.remote_dir / ".plscale" / "jobs"
    codes = {n.name: n.read_text().strip() for n in jobs.glob("*mnist-dp-node*.rc")}
    assert sorted(n.rsplit("-", 1)[1] for n in codes) == ["node0.rc", "node1.rc"] and set(codes.values()) == {"0"}

    done = pods("logs", "-n", "5")  # the latest job there (the two "pods" share this folder: either node's)
    tails = [log.read_text().splitlines()[-5:] for log in jobs.glob("*mnist-dp-node*.log")]
    assert done.returncode == 0 and done.stdout.splitlines() in tails, done.stderr

    done = pods("fetch", "20990101-000000-nope")
    assert done.returncode == 2 and run_dir.name in done.stderr, done.stderr
    done = pods("fetch")
    assert done.returncode == 0, done.stderr
    fetched = pods.tmp / "local_runs" / run_dir.name
    assert (fetched / "summary.json").read_bytes() == summaries[0].read_bytes()
    report = run_cli("report", fetched, env=pods.env)
    assert report.returncode == 0 and "mnist" in report.stdout.lower(), report.stderr
    assert pods.fake.key not in done.stdout + done.stderr + report.stdout
