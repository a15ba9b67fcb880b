"""`plscale runpod` against a fake of RunPod's REST API v2 (tests/helpers/fake_runpod.py).

The fake validates every request the CLI sends, and every answer it gives, against RunPod's
published OpenAPI document (tests/fixtures/runpod/openapi-v2-subset.json; the fake's own tests
are tests/test_runpod_fake.py), so the client and the fake are both held to RunPod's shapes, not
to each other: each test ends with `fake.check()`. The real CLI is driven through it in a
subprocess: gpus, up (cost first, the account's SSH key, the state file, the create bodies),
status, down, down --all, a 2-node Instant Cluster, the --max-hours watchdog on the pods, and
every failure: each exits 2 with one `error:` line and leaves nothing billing. `up` waits until
SSH really answers and starts the watchdog over SSH, so most tests point the pods at the `sshd`
fixture. Every CLI call of a test is checked for the full API key: in no output, no file under
tmp_path, no request but in its Authorization header.
"""

from __future__ import annotations

import getpass
import json
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import pytest

from conftest import ROOT, run_cli
from helpers import watchdogs
from helpers.fake_runpod import FakeRunPod

POLL = "0.05"  # PLSCALE_RUNPOD_POLL: seconds between the CLI's polls of the fake


class RunPodCLI:
    """`plscale runpod ARGS` in a subprocess, pointed at the fake, with every file under tmp_path.
    Keeps every output, so the fixture can check that the API key never shows."""

    def __init__(self, tmp_path, fake):
        self.tmp, self.fake, self.outputs = tmp_path, fake, []
        self.quick = None  # the `quick_cli` fixture, set by `rp_in_process`: commands then run in this process
        fake.environ_dir = tmp_path / "environ"  # each pod's container environment, as RunPod sets it
        self.env = {"XDG_CONFIG_HOME": str(tmp_path / "config"), "XDG_STATE_HOME": str(tmp_path / "state"),
                    "PLSCALE_RUNPOD_API": fake.url, "RUNPOD_API_KEY": fake.key, "PLSCALE_RUNPOD_POLL": POLL,
                    "PLSCALE_RUNPOD_SSH_USER": getpass.getuser(), "PLSCALE_RUNS_DIR": str(tmp_path / "runs"),
                    "PLSCALE_RUNPOD_RETRY_S": "3", "PLSCALE_RUNPOD_WATCHDOG_POLL": "0.2",
                    "PLSCALE_RUNPOD_POD_ENVIRON": str(tmp_path / "environ" / "{pod}")}

    def __call__(self, *args, env=None, input=None, timeout=60) -> subprocess.CompletedProcess:
        env = {**self.env, **(env or {})}
        if input is None and self.quick is not None:  # the same main() and exit code, no interpreter to start
            done = self.quick("runpod", *args, env=env)
        elif input is None:
            done = run_cli("runpod", *args, env=env, timeout=timeout)
        else:  # run_cli with a stdin: what a user types at the confirmation
            # A new session: no controlling terminal, so a hidden prompt reads stdin too.
            done = subprocess.run([sys.executable, "-m", "plscale.cli.main", "runpod", *map(str, args)],
                                  env={**os.environ, "COLUMNS": "200", **env}, cwd=ROOT, input=input, check=False,
                                  capture_output=True, text=True, timeout=timeout, start_new_session=True)
        self.outputs.append((args, done.stdout, done.stderr))
        return done

    @property
    def state_file(self) -> Path:
        return self.tmp / "state" / "plscale" / "runpod.json"

    def state(self) -> dict:
        return json.loads(self.state_file.read_text()) if self.state_file.exists() else {"clusters": {}}

    def up(self, *args, key=None, sshd=None, timeout=10, **kwargs) -> subprocess.CompletedProcess:
        """`up` with small A40 pods, a key pair (sshd's, whose address the pods then report), a remote
        dir here, a short --timeout."""
        if sshd is not None:
            self.fake.ssh_endpoints = [(sshd.host, sshd.port)]
            key = sshd.key
        defaults = {"--gpus": 1, "--gpu-type": "NVIDIA A40", "--ssh-key": key, "--remote-dir": self.tmp / "pod",
                    "--timeout": timeout}
        given = {a for a in args if str(a).startswith("--")}
        extra = [x for k, v in defaults.items() if k not in given for x in (k, v)]
        return self("up", *args, *extra, **kwargs)

    def watchdogs(self) -> dict[str, Path]:
        """Each pod's watchdog folder on the "pods" (the sshd's remote dir), by pod id."""
        return watchdogs.folders(self.tmp / "pod")

    def creates(self, path="/v2/pods") -> list[dict]:
        return [r["body"] for r in self.fake.requests if r["method"] == "POST" and r["path"] == path
                and r["status"] in (201, 502)]


@pytest.fixture
def rp(tmp_path):
    """The CLI against the fake. Afterwards: every request and answer held to RunPod's schema; the full
    API key showed in no output and no file under tmp_path, and was sent only in the Authorization
    header; the watchdogs started on the "pods" are stopped."""
    with FakeRunPod() as fake:
        cli = RunPodCLI(tmp_path, fake)
        try:
            yield cli
        finally:
            watchdogs.stop(tmp_path / "pod")
        fake.check()
    secret = fake.key
    for args, out, err in cli.outputs:
        assert secret not in out and secret not in err, f"the API key shows in the output of {args}"
    key_file = tmp_path / "config" / "plscale" / "runpod_api_key"  # where the key belongs
    for path in tmp_path.rglob("*"):
        if path.is_file() and not path.is_symlink() and path != key_file:
            assert secret.encode() not in path.read_bytes(), f"the API key is written in {path}"
    for request in fake.requests:
        assert secret not in json.dumps(request["body"]) + request["path"] + json.dumps(request["query"]), request


@pytest.fixture
def rp_in_process(rp, quick_cli):
    """`rp` with its commands run in this process (quick_cli), for those that end in an error before anything
    is created, or talk to the fake's API alone: no SSH, no stdin (those with `input=` still run in a
    subprocess). The same checks of `rp` hold afterwards; half a second of an interpreter's start saved a call."""
    rp.quick = quick_cli
    return rp


@pytest.fixture
def keypair(tmp_path) -> Path:
    """An SSH key pair for `up`s that fail before SSH is tried (no sshd needed)."""
    key = tmp_path / "keys" / "id_ed25519"
    key.parent.mkdir()
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    return key


def one_error(done: subprocess.CompletedProcess, *words: str, only: bool = True) -> str:
    """Exit 2 with one `error:` line, the last on stderr, holding `words`; no traceback.
    only: stderr is that line alone (the failure came before any progress line)."""
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2, (done.returncode, done.stdout, done.stderr)
    assert lines and lines[-1].startswith("error: "), done.stderr
    assert sum(line.startswith("error:") for line in lines) == 1 and "Traceback" not in done.stderr, done.stderr
    if only:
        assert len(lines) == 1, done.stderr
    for word in words:
        assert word.lower() in lines[-1].lower(), (word, lines[-1])
    return lines[-1]


def nothing_left(rp) -> None:
    """Nothing billing at the fake, nothing in the state file."""
    assert rp.fake.alive() == [] and rp.fake.clusters_alive() == []
    assert rp.state()["clusters"] == {}


def table_rows(text: str) -> dict[str, list[str]]:
    """A rich table's body rows, by their first cell."""
    rows = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("│┃").split("│")]
        if len(cells) >= 2 and cells[0]:
            rows[cells[0]] = cells
    return rows


def wait_for(condition, seconds=10.0) -> bool:
    end = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > end:
            return False
        time.sleep(0.05)
    return True


@pytest.mark.usefixtures("rp_in_process")
def test_gpus_lists_prices_and_stock(rp):
    rp.fake.availability[("NVIDIA H100 80GB HBM3", "COMMUNITY", "POD")] = "LOW"
    done = rp("gpus")
    assert done.returncode == 0, done.stderr
    rows = table_rows(done.stdout)
    assert rows["NVIDIA H100 80GB HBM3"][1:7] == ["H100 SXM", "80", "2.99", "HIGH", "2.69", "LOW"]
    assert rows["NVIDIA A40"][1:4] == ["A40", "48", "0.40"] and rows["NVIDIA A40"][5] == "0.35"
    assert rows["NVIDIA GeForce RTX 4090"][1:6] == ["RTX 4090", "24", "-", "-", "0.34"]
    queries = [r["query"] for r in rp.fake.requests if r["path"] == "/v2/catalog/gpus"]
    assert {q["cloud"] for q in queries} == {"SECURE", "COMMUNITY"} and all(
        q["include"] == "AVAILABILITY" and q["product"] == "POD" and q["count"] == "1" for q in queries)

    secure = table_rows(rp("gpus", "--cloud", "secure").stdout)
    assert "NVIDIA A40" in secure and "NVIDIA GeForce RTX 4090" not in secure
    nine = table_rows(rp("gpus", "--count", 9).stdout)
    assert nine["NVIDIA A40"][4] == "NONE"  # no A40 machine has 9 GPUs
    one_error(rp("gpus", "--cloud", "aws"), "--cloud")


def test_up_status_down(rp, sshd):
    started = datetime.now(timezone.utc)
    done = rp.up("--gpus", 2, "--max-hours", 1.5, "--yes", sshd=sshd)
    assert done.returncode == 0, done.stderr
    # The cost, before anything was created: the price and stock came from the catalog.
    rows = table_rows(done.stdout)
    assert "$0.40" in rows["per GPU-hour"][1] and "$0.80" in rows["per hour, all nodes"][1]
    assert "$1.20" in rows["for --max-hours 1.5"][1] and "****7890" in rows["API key"][1]
    paths = [(r["method"], r["path"]) for r in rp.fake.requests]
    assert paths.index(("GET", "/v2/catalog/gpus")) < paths.index(("POST", "/v2/pods"))
    # The account had no SSH keys: --yes added the student's public key before the create.
    public_key = Path(f"{sshd.key}.pub").read_text().strip()
    assert rp.fake.ssh_keys == [public_key] and "Added" in done.stdout
    assert paths.index(("PUT", "/v2/account/ssh-keys")) < paths.index(("POST", "/v2/pods"))

    [pod_id] = rp.fake.alive()
    [body] = rp.creates()
    assert body["gpu"] == {"id": "NVIDIA A40", "count": 2} and body["cloud"] == "SECURE"
    assert body["ports"] == ["22/tcp"] and body["startSsh"] is True and body["name"] == "plscale-plscale-0"
    assert "PUBLIC_KEY" not in body["env"]  # RunPod puts the account's keys on the pod (startSsh)
    assert rp.fake.pods[pod_id].public_key == public_key

    assert stat.S_IMODE(rp.state_file.stat().st_mode) == 0o600
    record = rp.state()["clusters"]["plscale"]
    assert [(p["id"], p["node"], p["host"], p["port"]) for p in record["pods"]] == [(pod_id, 0, sshd.host, sshd.port)]
    assert (record["gpus"], record["max_hours"], record["ssh_key"], record["cluster_id"]) == (2, 1.5, str(sshd.key), None)
    deadline = datetime.fromisoformat(record["terminate_after"])
    assert abs((deadline - started).total_seconds() - 1.5 * 3600) < 60
    # The watchdog on the pod: armed with that deadline, having read its pod with the pod's own key.
    folder = rp.watchdogs()[pod_id]
    assert (folder / "status").read_text().startswith("armed")
    assert abs(float((folder / "deadline").read_text()) - deadline.timestamp()) < 2
    assert any(r["key"] == f"pod:{pod_id}" and r["path"] == f"/v2/pods/{pod_id}" for r in rp.fake.requests)

    again = rp.up("--yes", sshd=sshd)  # the same --name: refused, nothing more created
    one_error(again, "already up")
    assert len(rp.creates()) == 1

    status = rp("status")
    assert status.returncode == 0, status.stderr
    assert pod_id in status.stdout and "RUNNING" in status.stdout and "$0.80/h" in status.stdout
    assert "armed" in table_rows(status.stdout)["0"][-1]

    kept = rp("down", input="n\n")  # declining deletes nothing
    assert kept.returncode == 1 and "Nothing deleted" in kept.stdout, kept.stderr
    assert rp.fake.alive() == [pod_id] and not any(r["method"] == "DELETE" for r in rp.fake.requests)

    down = rp("down", "--yes")
    assert down.returncode == 0, down.stderr
    assert "nothing left billing" in down.stdout and pod_id in down.stdout
    nothing_left(rp)
    assert wait_for(lambda: (folder / "status").read_text().startswith("gone"))  # the watchdog saw it go
    assert "No pods" in rp("status").stdout


def test_the_watchdog_ends_its_pod_at_the_deadline(rp, sshd):
    """--max-hours holds with nothing running here: at the deadline the pod's watchdog deletes the pod
    with the pod's own key. The deadline file on the pod is moved to now rather than slept through."""
    done = rp.up("--max-hours", 1, "--yes", sshd=sshd)
    assert done.returncode == 0, done.stderr
    [pod_id] = rp.fake.alive()
    folder = rp.watchdogs()[pod_id]
    (folder / "deadline").write_text(f"{time.time() - 1:.0f}\n")
    assert wait_for(lambda: rp.fake.alive() == []), (folder / "status").read_text()
    # the watchdog writes its status just after its DELETE is answered: wait for it, as for the pod
    assert wait_for(lambda: (folder / "status").read_text().startswith("ended")), (folder / "status").read_text()
    [delete] = [r for r in rp.fake.requests if r["method"] == "DELETE"]
    assert (delete["path"], delete["key"]) == (f"/v2/pods/{pod_id}", f"pod:{pod_id}")
    status = rp("status")
    assert status.returncode == 0 and "no longer lists" in status.stdout, status.stdout
    down = rp("down", "--yes")
    assert down.returncode == 0 and "nothing left billing" in down.stdout, down.stderr
    nothing_left(rp)


def test_a_two_node_instant_cluster(rp, sshd):
    """Several nodes are one Instant Cluster: one create, members filed by rank, a watchdog on each node,
    and deleting the cluster (by node 1's watchdog here, with its pod key) ends every node."""
    rp.fake.ports_after = 3
    community = rp.up("--nodes", 2, "--cloud", "community", "--name", "duo", "--yes", sshd=sshd)
    one_error(community, "--cloud secure")  # Instant Clusters are the secure cloud's only
    done = rp.up("--nodes", 2, "--name", "duo", "--yes", sshd=sshd)
    assert done.returncode == 0, done.stderr
    assert "$0.80" in table_rows(done.stdout)["per hour, all nodes"][1]  # 2 nodes x 1 x 0.40
    assert [q["product"] for q in (r["query"] for r in rp.fake.requests if r["path"] == "/v2/catalog/gpus")] == ["CLUSTER"]
    assert rp.creates() == []
    [body] = rp.creates("/v2/clusters")
    assert body["compute"] == {"gpuTypeId": "NVIDIA A40", "gpuCountPerPod": 1, "podCount": 2}
    assert body["type"] == "TRAINING" and body["name"] == "plscale-duo" and body["startSsh"] is True
    [cluster_id] = rp.fake.clusters_alive()
    record = rp.state()["clusters"]["duo"]
    assert record["cluster_id"] == cluster_id and [p["node"] for p in record["pods"]] == [0, 1]
    assert sorted(p["id"] for p in record["pods"]) == sorted(rp.fake.alive())
    assert all(rp.watchdogs()[p["id"]].joinpath("status").read_text().startswith("armed") for p in record["pods"])

    node1 = record["pods"][1]["id"]
    rp.watchdogs()[node1].joinpath("deadline").write_text("0\n")
    assert wait_for(lambda: rp.fake.clusters_alive() == [])
    [delete] = [r for r in rp.fake.requests if r["method"] == "DELETE"]
    assert (delete["path"], delete["key"]) == (f"/v2/clusters/{cluster_id}", f"pod:{node1}")
    assert rp.fake.alive() == []
    down = rp("down", "--name", "duo", "--yes")
    assert down.returncode == 0 and "nothing left billing" in down.stdout, down.stderr
    nothing_left(rp)


def test_a_watchdog_refused_is_seen_and_down_still_ends_it(rp, sshd):
    """RunPod does not document whether a pod's key may delete its cluster: where it may not, the watchdog
    says so, `status` shows it, and every command names the cluster past its deadline."""
    rp.fake.pod_key_may_delete_cluster = False
    assert rp.up("--nodes", 2, "--name", "duo", "--yes", sshd=sshd).returncode == 0
    record = rp.state()["clusters"]["duo"]
    folder = rp.watchdogs()[record["pods"][0]["id"]]
    folder.joinpath("deadline").write_text("0\n")
    assert wait_for(lambda: folder.joinpath("status").read_text().startswith("refused"))
    assert "403" in folder.joinpath("status").read_text() and rp.fake.clusters_alive() == [record["cluster_id"]]
    record["terminate_after"] = "2020-01-01T00:00:00+00:00"  # as if its --max-hours had passed
    rp.state_file.write_text(json.dumps({"clusters": {"duo": record}}))
    status = rp("status")
    assert status.returncode == 0 and "refused" in status.stdout, status.stdout
    assert "passed its --max-hours" in status.stdout and "plscale runpod down --name duo" in status.stdout
    down = rp("down", "--yes")
    assert down.returncode == 0 and "nothing left billing" in down.stdout, down.stderr
    nothing_left(rp)


def test_a_watchdog_that_cannot_arm_fails_up(rp, sshd):
    """No pod key where the watchdog looks: `up` does not report ready, and deletes the pod."""
    done = rp.up("--yes", sshd=sshd, env={"PLSCALE_RUNPOD_POD_ENVIRON": str(rp.tmp / "nowhere")})
    one_error(done, "watchdog", "did not arm", "cannot read the pod's environment", "nothing left billing",
              only=False)
    nothing_left(rp)


def test_a_key_already_registered_is_not_sent_again(rp, sshd):
    other = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOtherKeyOfTheAccount0000000000000000000 laptop"
    mine = Path(f"{sshd.key}.pub").read_text().strip()
    rp.fake.ssh_keys = [other, " ".join(mine.split()[:2]) + " another-comment"]
    assert rp.up("--yes", sshd=sshd).returncode == 0
    assert not any(r["method"] == "PUT" for r in rp.fake.requests)
    assert rp("down", "--yes").returncode == 0
    nothing_left(rp)


def test_adding_the_key_is_asked_and_keeps_the_others(rp, keypair):
    other = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOtherKeyOfTheAccount0000000000000000000 laptop"
    rp.fake.ssh_keys = [other]
    declined = rp.up(key=keypair, input="y\nn\n")  # yes to the cost, no to the key
    assert declined.returncode == 1 and "not among your RunPod account's SSH keys" in declined.stdout
    assert rp.fake.ssh_keys == [other] and rp.creates() == []
    rp.fake.capacity = 0  # the create is refused after the key went in: the key stays, nothing bills
    done = rp.up(key=keypair, input="y\ny\n")
    one_error(done, "could not place", only=False)
    assert rp.fake.ssh_keys == [other, keypair.with_name("id_ed25519.pub").read_text().strip()]
    nothing_left(rp)


def test_declining_creates_nothing(rp, keypair):
    done = rp.up("--gpus", 2, key=keypair, input="n\n")
    assert done.returncode == 1, done.stderr
    assert "$0.80" in table_rows(done.stdout)["per hour, all nodes"][1] and "Nothing created" in done.stdout
    assert not any(r["method"] in ("POST", "PUT") for r in rp.fake.requests)
    nothing_left(rp)


def test_down_all_also_finds_what_the_state_lost(rp, sshd):
    assert rp.up("--yes", sshd=sshd).returncode == 0
    [mine] = rp.fake.alive()
    lost = rp.fake.add_pod("plscale-old-0")
    lost_cluster = rp.fake.add_cluster("plscale-big", 2)
    other = rp.fake.add_pod("my-notebook")
    status = rp("status")
    assert status.returncode == 0 and lost in status.stdout and lost_cluster in status.stdout, status.stdout
    assert other not in status.stdout

    done = rp("down", "--all", "--yes")
    assert done.returncode == 0, done.stderr
    assert "nothing left billing" in done.stdout
    assert rp.fake.alive() == [other] and rp.fake.clusters_alive() == []
    assert rp.state()["clusters"] == {}

    rp.fake.add_pod("plscale-older-0")  # no state file at all
    rp.state_file.unlink()
    done = rp("down", "--all", "--yes")
    assert done.returncode == 0 and "nothing left billing" in done.stdout, done.stderr
    assert rp.fake.alive() == [other] and mine not in rp.fake.alive()


def test_a_node_that_never_gets_ssh_ends_the_whole_cluster(rp, keypair):
    rp.fake.never_ready_nodes = {1}
    done = rp.up("--nodes", 2, "--yes", key=keypair, timeout=1)
    one_error(done, "--timeout", "node 1", "nothing left billing", only=False)
    nothing_left(rp)


@pytest.mark.usefixtures("rp_in_process")
def test_bad_key_is_refused(rp, keypair):
    wrong = "rpa_WRONGKEY_0000000000000000abcd"
    for args in (["gpus"], ["status"], ["up", "--gpus", 1, "--gpu-type", "NVIDIA A40", "--ssh-key", keypair,
                                        "--yes"]):
        done = rp(*args, env={"RUNPOD_API_KEY": wrong})
        one_error(done, "refused the API key", "401")
        assert wrong not in done.stdout + done.stderr
    nothing_left(rp)


@pytest.mark.usefixtures("rp_in_process")
def test_a_key_without_access_is_told_apart(rp, keypair):
    """403: RunPod knows the key but it lacks the permission (not 'a bad key')."""
    rp.fake.forbidden = True
    line = one_error(rp("gpus"), "403", "no access", "permission All")
    assert "refused the API key" not in line


@pytest.mark.usefixtures("rp_in_process")
def test_no_key_at_all(rp, keypair):
    for args in (["gpus"], ["up", "--gpus", 1, "--gpu-type", "NVIDIA A40", "--ssh-key", keypair, "--yes"]):
        one_error(rp(*args, env={"RUNPOD_API_KEY": ""}), "No RunPod API key", "RUNPOD_API_KEY")
    assert rp.fake.requests == []  # nothing was sent without a key
    nothing_left(rp)


@pytest.mark.usefixtures("rp_in_process")
def test_key_file_readable_by_others_is_refused(rp, tmp_path):
    path = tmp_path / "config" / "plscale" / "runpod_api_key"
    path.parent.mkdir(parents=True)
    path.write_text(rp.fake.key + "\n")
    path.chmod(0o644)
    line = one_error(rp("gpus", env={"RUNPOD_API_KEY": ""}), "chmod 600", str(path))
    assert "644" in line and rp.fake.requests == []
    path.chmod(0o600)
    done = rp("gpus", env={"RUNPOD_API_KEY": ""})
    assert done.returncode == 0, done.stderr
    assert rp.fake.requests[-1]["key"] == "account"


def test_login_stores_the_key_privately(rp, tmp_path):
    path = tmp_path / "config" / "plscale" / "runpod_api_key"
    one_error(rp("login", env={"RUNPOD_API_KEY": ""}, input="rpa_WRONGKEY_0000000000000000abcd\n"),
              "refused the API key", only=False)
    assert not path.exists()  # a key RunPod refuses is not kept
    done = rp("login", env={"RUNPOD_API_KEY": ""}, input=rp.fake.key + "\n")
    assert done.returncode == 0, done.stderr
    assert "****7890" in done.stdout and path.read_text().strip() == rp.fake.key
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert rp("gpus", env={"RUNPOD_API_KEY": ""}).returncode == 0


@pytest.mark.usefixtures("rp_in_process")
def test_out_of_stock_is_said_before_creating(rp, keypair):
    rp.fake.availability[("NVIDIA A40", "SECURE", "POD")] = "NONE"
    one_error(rp.up("--yes", key=keypair), "no NVIDIA A40 pods", "in stock", "--cloud community")
    assert rp.creates() == []
    nothing_left(rp)


@pytest.mark.usefixtures("rp_in_process")
def test_no_capacity_at_create(rp, keypair):
    rp.fake.capacity = 0
    one_error(rp.up("--yes", key=keypair), "could not place", "--gpu-type", only=False)
    assert rp.creates() == []
    nothing_left(rp)


def test_a_pod_stuck_starting_is_deleted(rp, keypair):
    rp.fake.never_ready = True
    t0 = time.monotonic()
    done = rp.up("--yes", key=keypair, timeout=1)
    one_error(done, "--timeout", "no direct SSH endpoint", "nothing left billing", only=False)
    assert time.monotonic() - t0 < 15
    nothing_left(rp)


def test_ssh_never_answering_is_deleted(rp, keypair):
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    rp.fake.ssh_endpoints = [("127.0.0.1", closed)]
    rp.fake.ports_after = 0
    done = rp.up("--yes", key=keypair, timeout=1)
    one_error(done, "SSH never answered", f"127.0.0.1:{closed}", "nothing left billing", only=False)
    nothing_left(rp)


def start_up(rp, *args) -> subprocess.Popen:
    """`up` in the background (to interrupt or kill it); its output lands in rp.outputs at finish()."""
    args = ["up", "--gpus", 1, "--gpu-type", "NVIDIA A40", *args, "--yes"]
    proc = subprocess.Popen([sys.executable, "-m", "plscale.cli.main", "runpod", *map(str, args)],
                            env={**os.environ, "COLUMNS": "200", **rp.env}, cwd=ROOT, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            # Ctrl-C as at a terminal, even where pytest runs as a background job (SIGINT ignored)
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    assert wait_for(lambda: sum(r["method"] == "GET" and r["path"].startswith("/v2/pods/")
                                for r in rp.fake.requests) >= 2, 20)  # waiting for its SSH endpoint
    return proc


def finish(rp, proc) -> tuple[str, str]:
    out, err = proc.communicate(timeout=30)
    rp.outputs.append((proc.args, out, err))
    return out, err


def test_interrupted_up_deletes_its_pod(rp, keypair):
    rp.fake.never_ready = True
    proc = start_up(rp, "--ssh-key", keypair, "--timeout", 60)
    proc.send_signal(signal.SIGINT)
    out, err = finish(rp, proc)
    assert proc.returncode == 130, (out, err)
    assert "Interrupted" in err.strip().splitlines()[-1] and "nothing left billing" in err
    nothing_left(rp)


def test_killed_up_leaves_its_pod_recorded_for_down(rp, keypair):
    """The state file holds the pod from the moment RunPod answers: `down` finds it after a crash."""
    rp.fake.never_ready = True
    proc = start_up(rp, "--ssh-key", keypair, "--timeout", 60)
    proc.kill()
    finish(rp, proc)
    [pod_id] = rp.fake.alive()
    assert [p["id"] for p in rp.state()["clusters"]["plscale"]["pods"]] == [pod_id]
    assert stat.S_IMODE(rp.state_file.stat().st_mode) == 0o600
    overdue = rp("ssh", "--", "true")  # no SSH address yet: said, with the way out
    one_error(overdue, "no SSH address", "plscale runpod down --name plscale")
    down = rp("down", "--yes")
    assert down.returncode == 0 and "nothing left billing" in down.stdout, down.stderr
    nothing_left(rp)


def test_down_retries_a_refused_delete_and_shows_runpod_s_reason(rp):
    """One delete answered with a server error (a blip) must not leave the pod billing; deletes that keep
    failing are reported with RunPod's own reason and the command that tries again."""
    rp.fake.add_pod("plscale-blip-0")
    rp.fake.fail_delete = 1
    done = rp("down", "--all", "--yes", timeout=30)
    assert done.returncode == 0 and rp.fake.alive() == [], done.stderr

    pod_id = rp.fake.add_pod("plscale-stuck-0")
    rp.fake.fail_delete = 10**6
    done = rp("down", "--all", "--yes", env={"PLSCALE_RUNPOD_RETRY_S": "0"}, timeout=60)
    line = one_error(done, "still lists", pod_id, "plscale runpod down --all", only=False)
    assert "RunPod said" in line
    assert rp.fake.alive() == [pod_id]
    rp.fake.fail_delete = 0
    assert rp("down", "--all", "--yes").returncode == 0
    nothing_left(rp)


def test_rate_limits_are_waited_out(rp):
    rp.fake.rate_limit, rp.fake.retry_after = 2, 1
    t0 = time.monotonic()
    done = rp("gpus")
    assert done.returncode == 0, done.stderr
    assert time.monotonic() - t0 >= 2  # Retry-After honoured, twice
    assert [r["status"] for r in rp.fake.requests][:3] == [429, 429, 200]
    rp.fake.rate_limit = 10**6
    one_error(rp("gpus", env={"PLSCALE_RUNPOD_RETRY_S": "1"}), "rate limiting", "429")


@pytest.mark.usefixtures("rp_in_process")
@pytest.mark.parametrize("args, words", [
    (["--gpus", 0], ["--gpus 0"]),
    (["--cloud", "aws"], ["--cloud aws"]),
    (["--max-hours", 0], ["--max-hours"]),
    (["--max-hours", 100], ["--max-hours", "72"]),
    (["--gpu-type", "NVIDIA A4O"], ["not a RunPod GPU type", "NVIDIA A40"]),
    (["--gpu-type", "NVIDIA GeForce RTX 4090"], ["--cloud community"]),
    (["--gpus", 9], ["at most 8"]),
    (["--name", "Bad_Name"], ["--name"]),
    (["--remote-dir", "plscale"], ["--remote-dir", "absolute"]),
    (["--disk", 5], ["--disk"]),
    (["--volume", 5], ["--volume", "10 GB"]),
    (["--nodes", 300], ["at most 250"]),
    (["--timeout", 0], ["--timeout 0"]),
    (["--image", ""], ["--image is empty"]),
    (["--max-hours", 0.0001], ["--max-hours", "0.01"]),
    (["--gpu-type", "h100"], ["not a RunPod GPU type", "NVIDIA H100 80GB HBM3"]),
])
def test_bad_up_input(rp, keypair, args, words):
    one_error(rp.up(*args, "--yes", key=keypair), *words)
    assert not any(r["method"] in ("POST", "PUT") for r in rp.fake.requests)
    nothing_left(rp)


@pytest.mark.usefixtures("rp_in_process")
def test_missing_ssh_key(rp, tmp_path, keypair):
    one_error(rp.up("--yes", key=tmp_path / "nope" / "id_ed25519"), "ssh-keygen", "--ssh-key")
    one_error(rp.up("--yes", key=f"{keypair}.pub"), "give the private key", str(keypair))
    assert not any(r["method"] in ("POST", "PUT") for r in rp.fake.requests)


def test_up_forgets_a_record_whose_pod_is_gone(rp, sshd):
    assert rp.up("--yes", sshd=sshd).returncode == 0
    [pod_id] = rp.fake.alive()
    rp.fake.delete_pod(pod_id)  # ended in the console
    done = rp.up("--yes", sshd=sshd)
    assert done.returncode == 0 and "no longer lists the earlier" in done.stdout, done.stderr
    assert len(rp.state()["clusters"]["plscale"]["pods"]) == 1 and len(rp.fake.alive()) == 1
    assert rp("down", "--yes").returncode == 0
    nothing_left(rp)


@pytest.mark.usefixtures("rp_in_process")
@pytest.mark.parametrize("trouble, words", [
    ("server_error", ["HTTP 500", "status.runpod.io"]),
    ("unreachable", ["Cannot reach RunPod", "PLSCALE_RUNPOD_API"]),
])
def test_service_trouble(rp, trouble, words):
    env = {"PLSCALE_RUNPOD_RETRY_S": "2"}
    if trouble == "server_error":
        rp.fake.server_error = True
    else:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            env["PLSCALE_RUNPOD_API"] = f"http://127.0.0.1:{s.getsockname()[1]}"
    t0 = time.monotonic()
    one_error(rp("gpus", env=env), *words)
    if trouble == "server_error":  # retried with backoff (1 s, then the bound), not given up at once
        assert sum(r["status"] == 500 for r in rp.fake.requests) >= 2 and time.monotonic() - t0 >= 1


def test_sync_without_rsync(rp, sshd, tmp_path):
    assert rp.up("--yes", sshd=sshd).returncode == 0
    bin_dir = tmp_path / "bin"  # ssh and the basics, no rsync
    bin_dir.mkdir()
    for tool in ("ssh", "ssh-keygen", "sh", "bash"):
        if shutil.which(tool):
            (bin_dir / tool).symlink_to(shutil.which(tool))
    done = rp("sync", env={"PATH": str(bin_dir)})
    one_error(done, "rsync is not installed", "apt install rsync", only=False)
    assert len(rp.fake.alive()) == 1  # a failed sync leaves the pods up
    assert rp("down", "--yes").returncode == 0
    nothing_left(rp)


@pytest.mark.parametrize("nodes", [1, 2])
def test_a_create_whose_answer_was_lost_is_found_by_name_and_deleted(rp, keypair, nodes):
    """RunPod made the pod (or cluster) but the answer never came (a gateway timeout): `up` does not
    create again, it looks for the name and deletes what it finds."""
    rp.fake.lose_create_answer = True
    done = rp.up("--nodes", nodes, "--yes", key=keypair)
    one_error(done, "HTTP 502", "Deleted what it had created", "nothing left billing", only=False)
    assert len(rp.creates("/v2/pods" if nodes == 1 else "/v2/clusters")) == 1
    assert any(r["method"] == "DELETE" for r in rp.fake.requests)
    nothing_left(rp)


@pytest.mark.usefixtures("rp_in_process")
def test_a_key_with_a_passphrase_must_be_in_the_agent(rp, tmp_path):
    key = tmp_path / "locked" / "id_ed25519"
    key.parent.mkdir()
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "a passphrase", "-f", str(key)], check=True)
    done = rp.up("--yes", key=key, env={"SSH_AUTH_SOCK": ""})
    one_error(done, "passphrase", f"ssh-add {key}")
    assert rp.creates() == []


def test_state_writes_keep_the_other_clusters(tmp_path, monkeypatch):
    """Each command rewrites only its own record, under a lock: one `up` cannot drop another's."""
    from plscale.runpod import local, provision
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    local.put_cluster({"name": "a", "cluster_id": None, "pods": [{"id": "p1"}]})
    local.put_cluster({"name": "b", "cluster_id": None, "pods": [{"id": "p2"}, {"id": "p3"}]})
    provision.keep(local.load_state()["clusters"]["b"], [("pod", "p3")])
    provision.keep(local.load_state()["clusters"]["a"], [])
    assert local.load_state() == {"clusters": {"b": {"name": "b", "cluster_id": None, "pods": [{"id": "p3"}],
                                                     "stray_clusters": []}}}
    assert stat.S_IMODE(local.state_file().stat().st_mode) == 0o600


@pytest.mark.usefixtures("rp_in_process")
def test_a_pod_listed_as_terminated_counts_as_gone(rp):
    """RunPod may still answer a deleted pod for a while, with status TERMINATED: that is not billing."""
    rp.fake.terminated_visible = True
    pod_id = rp.fake.add_pod("plscale-late-0")
    done = rp("down", "--all", "--yes")
    assert done.returncode == 0 and "nothing left billing" in done.stdout, done.stderr
    assert [r["status"] for r in rp.fake.requests if r["path"] == f"/v2/pods/{pod_id}"][-1] == 200  # still answered
    assert rp.fake.alive() == []
