"""`plscale runpod` against a fake RunPod GraphQL API (tests/helpers/fake_runpod.py).

First the fake itself is checked with plain urllib (so a fake that drifts from the spec shows up
here, not as a puzzling CLI failure); then the real CLI is driven through it in a subprocess:
gpus, up (cost first, state file, the CreatePod input), status, down, down --all, --max-hours held
by the service, and every failure: each exits 2 with one `error:` line and leaves nothing billing.
`up` waits until SSH really answers, so its tests point the pods at the `sshd` fixture. Every CLI
call of a test is checked for the full API key: in no output, no file under tmp_path, no request
body.
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
import urllib.error
import urllib.request
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from conftest import ROOT, run_cli
from helpers.fake_runpod import LOW_BALANCE, NO_CAPACITY, FakeRunPod, parse_utc


@pytest.fixture
def fake():
    with FakeRunPod() as f:
        yield f


# ---------------------------------------------------------------- the fake, with urllib

def gql(fake, op, variables=None, key=None):
    """POST one operation; (HTTP status, parsed JSON body or text)."""
    body = json.dumps({"operationName": op, "query": f"query {op} {{ x }}",
                       "variables": variables or {}}).encode()
    headers = {"Content-Type": "application/json"}
    if key is not False:
        headers["Authorization"] = f"Bearer {key or fake.key}"
    req = urllib.request.Request(fake.url, data=body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        text = e.read().decode()
        try:
            return e.code, json.loads(text)
        except ValueError:
            return e.code, text


def iso(seconds_from_now: float) -> str:
    when = datetime.now(timezone.utc) + timedelta(seconds=seconds_from_now)
    return when.strftime("%Y-%m-%dT%H:%M:%S.%fZ") if seconds_from_now < 60 else \
        when.strftime("%Y-%m-%dT%H:%M:%SZ")


def pod_input(**over):
    inp = {"name": "plscale-t-0", "imageName": "runpod/pytorch:x", "gpuTypeId": "NVIDIA A40",
           "gpuCount": 2, "cloudType": "SECURE", "containerDiskInGb": 40, "volumeInGb": 20,
           "volumeMountPath": "/workspace", "ports": "22/tcp", "startSsh": True,
           "supportPublicIp": True, "env": [{"key": "PUBLIC_KEY", "value": "ssh-ed25519 AAAA x"}],
           "terminateAfter": iso(3600)}
    inp.update(over)
    return {k: v for k, v in inp.items() if v is not None}


def test_fake_refuses_a_missing_or_bad_key(fake):
    assert gql(fake, "Myself", key=False)[0] == 401
    assert gql(fake, "Myself", key="rpa_wrong")[0] == 401
    status, body = gql(fake, "Myself")
    assert status == 200 and body["data"]["myself"]["clientBalance"] == 25.0
    assert fake.requests[0]["headers"].get("Authorization") is None


def test_fake_catalog(fake):
    _, body = gql(fake, "GpuTypes", {"count": 1})
    gpus = {g["id"]: g for g in body["data"]["gpuTypes"]}
    h100 = gpus["NVIDIA H100 80GB HBM3"]
    assert (h100["memoryInGb"], h100["securePrice"], h100["communityPrice"]) == (80, 2.99, 2.69)
    assert h100["secure"]["stockStatus"] == "High" and h100["community"]["stockStatus"] == "Low"
    rtx = gpus["NVIDIA GeForce RTX 4090"]
    assert rtx["securePrice"] is None and rtx["secureCloud"] is False and rtx["communityPrice"] == 0.34


def test_fake_pod_life_cycle(fake):
    fake.ports_after = 2
    fake.ssh_endpoints = [("127.0.0.1", 41000), ("127.0.0.1", 41001)]
    _, body = gql(fake, "CreatePod", {"input": pod_input()})
    made = body["data"]["podFindAndDeployOnDemand"]
    assert made["costPerHr"] == pytest.approx(0.80) and made["desiredStatus"] == "RUNNING"
    pod_id = made["id"]
    for _ in range(2):
        assert gql(fake, "Pod", {"podId": pod_id})[1]["data"]["pod"]["runtime"] is None
    runtime = gql(fake, "Pod", {"podId": pod_id})[1]["data"]["pod"]["runtime"]
    public = [p for p in runtime["ports"] if p["privatePort"] == 22 and p["isIpPublic"]]
    assert public == [{"ip": "127.0.0.1", "isIpPublic": True, "privatePort": 22,
                       "publicPort": 41000, "type": "tcp"}]
    pods = gql(fake, "Myself")[1]["data"]["myself"]["pods"]
    assert [p["id"] for p in pods] == [pod_id] == fake.alive()
    assert gql(fake, "TerminatePod", {"input": {"podId": pod_id}})[1] == {"data": {"podTerminate": None}}
    assert gql(fake, "Pod", {"podId": pod_id})[1]["data"]["pod"] is None
    assert fake.alive() == [] and fake.terminated == [pod_id]
    assert gql(fake, "Myself")[1]["data"]["myself"]["pods"] == []


def test_fake_enforces_terminate_after(fake):
    fake.ports_after = 0
    _, body = gql(fake, "CreatePod", {"input": pod_input(terminateAfter=iso(1.0))})
    pod_id = body["data"]["podFindAndDeployOnDemand"]["id"]
    assert gql(fake, "Pod", {"podId": pod_id})[1]["data"]["pod"]["runtime"] is not None
    time.sleep(1.1)  # the real clock passes the deadline; nobody terminates the pod
    assert gql(fake, "Pod", {"podId": pod_id})[1]["data"]["pod"] is None
    assert fake.alive() == []


@pytest.mark.parametrize("bad", [
    {"cloudType": "ALL"}, {"ports": "8888/http"}, {"gpuTypeId": "NVIDIA B999"},
    {"env": [{"key": "PUBLIC_KEY", "value": "AAAA"}]}, {"env": []}, {"terminateAfter": "tomorrow"},
    {"terminateAfter": "2020-01-01T00:00:00Z"}, {"terminateAfter": "2999-01-01T00:00:00"},
    {"gpuCount": "2"}, {"startSsh": None}, {"bogusField": 1},
])
def test_fake_refuses_a_bad_create_input(fake, bad):
    status, body = gql(fake, "CreatePod", {"input": pod_input(**bad)})
    assert status == 400 and body["data"] == {"podFindAndDeployOnDemand": None}  # GraphQL validation: 400
    assert body["errors"][0]["message"] and fake.alive() == [] and fake.created == []


def test_fake_refusals(fake):
    fake.capacity = 1
    assert "podFindAndDeployOnDemand" in gql(fake, "CreatePod", {"input": pod_input()})[1]["data"]
    assert gql(fake, "CreatePod", {"input": pod_input()})[1]["errors"][0]["message"] == NO_CAPACITY
    fake.capacity = None
    fake.low_balance_error = True
    assert gql(fake, "CreatePod", {"input": pod_input()})[1]["errors"][0]["message"] == LOW_BALANCE
    fake.low_balance_error = False
    fake.fail_create_at = 3
    assert "errors" in gql(fake, "CreatePod", {"input": pod_input()})[1]
    assert len(fake.alive()) == 1
    seeded = fake.add_pod("plscale-lost-0")
    assert seeded in fake.alive() and len(fake.alive()) == 2
    assert "plscale-lost-0" in [p["name"] for p in gql(fake, "Myself")[1]["data"]["myself"]["pods"]]


def test_fake_clock_advances(fake):
    fake.ports_after = 0
    _, body = gql(fake, "CreatePod", {"input": pod_input(terminateAfter=iso(600))})
    pod_id = body["data"]["podFindAndDeployOnDemand"]["id"]
    fake.advance(599)
    assert fake.alive() == [pod_id]
    fake.advance(2)
    assert fake.alive() == [] and gql(fake, "Pod", {"podId": pod_id})[1]["data"]["pod"] is None


# ---------------------------------------------------------------- the real CLI against the fake

POLL = "0.05"  # PLSCALE_RUNPOD_POLL: seconds between the CLI's polls of the fake


class RunPodCLI:
    """`plscale runpod ARGS` in a subprocess, pointed at the fake, with every file under tmp_path.
    Keeps every output, so the fixture can check that the API key never shows."""

    def __init__(self, tmp_path, fake):
        self.tmp, self.fake, self.outputs = tmp_path, fake, []
        self.env = {"XDG_CONFIG_HOME": str(tmp_path / "config"), "XDG_STATE_HOME": str(tmp_path / "state"),
                    "PLSCALE_RUNPOD_API": fake.url, "RUNPOD_API_KEY": fake.key, "PLSCALE_RUNPOD_POLL": POLL,
                    "PLSCALE_RUNPOD_SSH_USER": getpass.getuser(), "PLSCALE_RUNS_DIR": str(tmp_path / "runs")}

    def __call__(self, *args, env=None, input=None, timeout=60) -> subprocess.CompletedProcess:
        env = {**self.env, **(env or {})}
        if input is None:
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


@pytest.fixture
def rp(tmp_path, fake):
    """The CLI against the fake. Afterwards: the full API key showed in no output and no file under
    tmp_path, and was sent only in the Authorization header."""
    cli = RunPodCLI(tmp_path, fake)
    yield cli
    secret = fake.key
    for args, out, err in cli.outputs:
        assert secret not in out and secret not in err, f"the API key shows in the output of {args}"
    key_file = tmp_path / "config" / "plscale" / "runpod_api_key"  # where the key belongs
    for path in tmp_path.rglob("*"):
        if path.is_file() and not path.is_symlink() and path != key_file:
            assert secret.encode() not in path.read_bytes(), f"the API key is written in {path}"
    for request in fake.requests:
        assert secret not in request["body"] and secret not in request["path"], request["operationName"]


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
    """No pod billing at the fake, none in the state file."""
    assert rp.fake.alive() == []
    assert rp.state()["clusters"] == {}


def table_rows(text: str) -> dict[str, list[str]]:
    """A rich table's body rows, by their first cell."""
    rows = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("│┃").split("│")]
        if len(cells) >= 2 and cells[0]:
            rows[cells[0]] = cells
    return rows


def test_gpus_lists_prices_and_stock(rp):
    done = rp("gpus")
    assert done.returncode == 0, done.stderr
    rows = table_rows(done.stdout)
    assert rows["NVIDIA H100 80GB HBM3"][1:] == ["H100 SXM", "80", "2.99", "High", "2.69", "Low"]
    assert rows["NVIDIA A40"][1:] == ["A40", "48", "0.40", "Medium", "0.35", "High"]
    assert rows["NVIDIA GeForce RTX 4090"][1:] == ["RTX 4090", "24", "-", "-", "0.34", "High"]
    assert rp.fake.requests[-1]["variables"] == {"count": 1}

    secure = table_rows(rp("gpus", "--cloud", "secure").stdout)
    assert "NVIDIA A40" in secure and "NVIDIA GeForce RTX 4090" not in secure
    nine = rp("gpus", "--count", 9)
    assert rp.fake.requests[-1]["variables"] == {"count": 9}
    assert table_rows(nine.stdout)["NVIDIA A40"][1:] == ["A40", "48", "0.40", "-", "0.35", "-"]
    one_error(rp("gpus", "--cloud", "aws"), "--cloud")


def test_up_status_down(rp, sshd):
    started = datetime.now(timezone.utc)
    done = rp.up("--gpus", 2, "--max-hours", 1.5, "--yes", sshd=sshd)
    assert done.returncode == 0, done.stderr
    # The cost, before anything was created: the price came from GpuTypes, the balance from Myself.
    rows = table_rows(done.stdout)
    assert "$0.40" in rows["per GPU-hour"][1] and "$0.80" in rows["per hour, all pods"][1]
    assert "$1.20" in rows["for --max-hours 1.5"][1]
    assert "$25.00" in rows["your balance"][1] and "****7890" in rows["your balance"][1]
    ops = rp.fake.ops()
    assert ops.index("GpuTypes") < ops.index("CreatePod") and ops.index("Myself") < ops.index("CreatePod")

    [pod_id] = rp.fake.alive()
    [spec] = rp.fake.created
    assert (spec["gpuCount"], spec["gpuTypeId"], spec["cloudType"]) == (2, "NVIDIA A40", "SECURE")
    assert "22/tcp" in spec["ports"].split(",") and spec["name"] == "plscale-plscale-0"
    assert "globalNetwork" not in spec or spec["globalNetwork"] is False
    public_key = [e["value"] for e in spec["env"] if e["key"] == "PUBLIC_KEY"]
    assert public_key == [Path(f"{sshd.key}.pub").read_text().strip()]
    deadline = parse_utc(spec["terminateAfter"])
    assert abs((deadline - started).total_seconds() - 1.5 * 3600) < 60

    assert stat.S_IMODE(rp.state_file.stat().st_mode) == 0o600
    cluster = rp.state()["clusters"]["plscale"]
    assert [(p["id"], p["node"], p["host"], p["port"]) for p in cluster["pods"]] == \
        [(pod_id, 0, sshd.host, sshd.port)]
    assert (cluster["gpus"], cluster["max_hours"], cluster["ssh_key"]) == (2, 1.5, str(sshd.key))
    assert parse_utc(cluster["terminate_after"].replace("+00:00", "Z")) == deadline
    assert pod_id in done.stdout

    again = rp.up("--yes", sshd=sshd)  # the same --name: refused, nothing more created
    one_error(again, "already up")
    assert len(rp.fake.created) == 1

    status = rp("status")
    assert status.returncode == 0, status.stderr
    assert pod_id in status.stdout and "RUNNING" in status.stdout and "$0.80/h" in status.stdout

    kept = rp("down", input="n\n")  # declining terminates nothing
    assert kept.returncode == 1 and "Nothing terminated" in kept.stdout, kept.stderr
    assert rp.fake.alive() == [pod_id] and "TerminatePod" not in rp.fake.ops()

    down = rp("down", "--yes")
    assert down.returncode == 0, down.stderr
    assert "nothing left billing" in down.stdout and pod_id in down.stdout
    assert rp.fake.terminated == [pod_id]
    nothing_left(rp)
    assert "No pods" in rp("status").stdout


def test_up_two_nodes_on_a_private_network(rp, sshd):
    rp.fake.ports_after = 3
    community = rp.up("--nodes", 2, "--cloud", "community", "--name", "duo", "--yes", sshd=sshd)
    one_error(community, "--cloud secure")  # RunPod's private network is the secure cloud's only
    done = rp.up("--nodes", 2, "--name", "duo", "--yes", sshd=sshd)
    assert done.returncode == 0, done.stderr
    assert "$0.80" in table_rows(done.stdout)["per hour, all pods"][1]  # 2 pods x 1 x 0.40
    assert [s["name"] for s in rp.fake.created] == ["plscale-duo-0", "plscale-duo-1"]
    assert all(s["globalNetwork"] is True and s["cloudType"] == "SECURE" for s in rp.fake.created)
    assert [p["node"] for p in rp.state()["clusters"]["duo"]["pods"]] == [0, 1]
    down = rp("down", "--name", "duo", "--yes")
    assert down.returncode == 0 and "nothing left billing" in down.stdout, down.stderr
    nothing_left(rp)


def test_declining_creates_nothing(rp, keypair):
    done = rp.up("--gpus", 2, key=keypair, input="n\n")
    assert done.returncode == 1, done.stderr
    assert "$0.80" in table_rows(done.stdout)["per hour, all pods"][1] and "Nothing created" in done.stdout
    assert "CreatePod" not in rp.fake.ops() and rp.fake.created == []
    nothing_left(rp)


def test_down_all_also_finds_pods_the_state_lost(rp, sshd):
    assert rp.up("--yes", sshd=sshd).returncode == 0
    [mine] = rp.fake.alive()
    lost = rp.fake.add_pod("plscale-old-0")
    other = rp.fake.add_pod("my-notebook")
    status = rp("status")
    assert status.returncode == 0 and lost in status.stdout and other not in status.stdout, status.stdout

    done = rp("down", "--all", "--yes")
    assert done.returncode == 0, done.stderr
    assert "nothing left billing" in done.stdout
    assert sorted(rp.fake.terminated) == sorted([mine, lost])
    assert rp.fake.alive() == [other]
    assert rp.state()["clusters"] == {}

    rp.fake.add_pod("plscale-older-1")  # no state file entry at all
    rp.state_file.unlink()
    done = rp("down", "--all", "--yes")
    assert done.returncode == 0 and "nothing left billing" in done.stdout, done.stderr
    assert rp.fake.alive_names() == ["my-notebook"]


def test_max_hours_is_enforced_by_runpod(rp, sshd):
    """RunPod itself ends the pods at terminateAfter: nothing here needs to be running then. The fake's
    clock is moved on rather than slept through (test_fake_enforces_terminate_after does it in real time)."""
    done = rp.up("--max-hours", 0.01, "--yes", sshd=sshd)  # 36 s
    assert done.returncode == 0, done.stderr
    assert len(rp.fake.alive()) == 1 and "for --max-hours 0.01" in done.stdout
    rp.fake.advance(37)  # the service's clock passes the deadline; no CLI call in between
    assert rp.fake.alive() == [] and rp.fake.terminated == []
    status = rp("status")
    assert status.returncode == 0 and "no longer lists" in status.stdout, status.stdout
    down = rp("down", "--yes")
    assert down.returncode == 0 and "nothing left billing" in down.stdout, down.stderr
    nothing_left(rp)


@pytest.mark.parametrize("knob, words", [
    ({"capacity": 1}, ["no free GPUs"]),
    ({"fail_create_at": 1}, ["CreatePod"]),
])
def test_second_pod_fails_first_is_terminated(rp, keypair, knob, words):
    for name, value in knob.items():
        setattr(rp.fake, name, value)
    done = rp.up("--nodes", 2, "--yes", key=keypair)
    line = one_error(done, *words, "terminated", "nothing left billing", only=False)
    first = rp.fake.terminated
    assert len(rp.fake.created) == 1 and len(first) == 1 and first[0] in line
    nothing_left(rp)


def test_bad_key_is_refused(rp, keypair):
    wrong = "rpa_WRONGKEY_0000000000000000abcd"
    for args in (["gpus"], ["status"], ["up", "--gpus", 1, "--gpu-type", "NVIDIA A40", "--ssh-key", keypair,
                                        "--yes"]):
        done = rp(*args, env={"RUNPOD_API_KEY": wrong})
        one_error(done, "refused the API key", "401")
        assert wrong not in done.stdout + done.stderr
    assert rp.fake.created == []
    nothing_left(rp)


def test_no_key_at_all(rp, keypair):
    for args in (["gpus"], ["up", "--gpus", 1, "--gpu-type", "NVIDIA A40", "--ssh-key", keypair, "--yes"]):
        one_error(rp(*args, env={"RUNPOD_API_KEY": ""}), "No RunPod API key", "RUNPOD_API_KEY")
    assert rp.fake.requests == []  # nothing was sent without a key
    nothing_left(rp)


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
    assert rp.fake.requests[-1]["headers"]["Authorization"] == f"Bearer {rp.fake.key}"


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


def test_no_capacity(rp, keypair):
    rp.fake.capacity = 0
    one_error(rp.up("--yes", key=keypair), "no free GPUs", "--gpu-type", only=False)
    assert len(rp.fake.requests) and rp.fake.created == []
    nothing_left(rp)


def test_balance_too_low_checked_before_creating(rp, keypair):
    rp.fake.balance = 0.5
    one_error(rp.up("--gpus", 2, "--yes", key=keypair), "balance", "$0.50", "$0.80")
    assert "CreatePod" not in rp.fake.ops()
    nothing_left(rp)


def test_balance_refused_by_runpod(rp, keypair):
    rp.fake.low_balance_error = True
    one_error(rp.up("--yes", key=keypair), "balance is too low", "billing", only=False)
    assert rp.fake.created == []
    nothing_left(rp)


def test_pod_stuck_pending_is_terminated(rp, keypair):
    rp.fake.never_ready = True
    t0 = time.monotonic()
    done = rp.up("--nodes", 2, "--yes", key=keypair, timeout=1)
    one_error(done, "stuck pending", "--timeout", "terminated the 2 pod(s)", "nothing left billing", only=False)
    assert time.monotonic() - t0 < 15
    assert sorted(rp.fake.terminated) == sorted(rp.fake.pods)
    nothing_left(rp)


def test_ssh_never_answering_is_terminated(rp, keypair):
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    rp.fake.ssh_endpoints = [("127.0.0.1", closed)]
    rp.fake.ports_after = 0
    done = rp.up("--yes", key=keypair, timeout=1)
    one_error(done, "SSH never answered", f"127.0.0.1:{closed}", "terminated", only=False)
    assert len(rp.fake.terminated) == 1
    nothing_left(rp)


def start_up(rp, *args) -> subprocess.Popen:
    """`up` in the background (to interrupt or kill it); its output lands in rp.outputs at finish()."""
    args = ["up", "--gpus", 1, "--gpu-type", "NVIDIA A40", *args, "--yes"]
    proc = subprocess.Popen([sys.executable, "-m", "plscale.cli.main", "runpod", *map(str, args)],
                            env={**os.environ, "COLUMNS": "200", **rp.env}, cwd=ROOT, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            # Ctrl-C as at a terminal, even where pytest runs as a background job (SIGINT ignored)
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 20
    while rp.fake.ops().count("Pod") < 2 and time.monotonic() < deadline:  # waiting for its ports
        time.sleep(0.05)
    return proc


def finish(rp, proc) -> tuple[str, str]:
    out, err = proc.communicate(timeout=30)
    rp.outputs.append((proc.args, out, err))
    return out, err


def test_interrupted_up_terminates_its_pods(rp, keypair):
    rp.fake.never_ready = True
    proc = start_up(rp, "--ssh-key", keypair, "--timeout", 60)
    proc.send_signal(signal.SIGINT)
    out, err = finish(rp, proc)
    assert proc.returncode == 130, (out, err)
    assert "Interrupted" in err.strip().splitlines()[-1] and "nothing left billing" in err
    assert len(rp.fake.terminated) == 1
    nothing_left(rp)


def test_killed_up_leaves_its_pods_recorded_for_down(rp, keypair):
    """The state file holds each pod from the moment it exists: `down` finds it after a crash."""
    rp.fake.never_ready = True
    proc = start_up(rp, "--ssh-key", keypair, "--timeout", 60)
    proc.kill()
    finish(rp, proc)
    [pod_id] = rp.fake.alive()
    assert [p["id"] for p in rp.state()["clusters"]["plscale"]["pods"]] == [pod_id]
    assert stat.S_IMODE(rp.state_file.stat().st_mode) == 0o600
    down = rp("down", "--yes")
    assert down.returncode == 0 and "nothing left billing" in down.stdout, down.stderr
    nothing_left(rp)


def test_down_retries_a_refused_terminate(rp):
    """RunPod answering one TerminatePod with an error (a blip) must not leave the pod billing."""
    pod_id = rp.fake.add_pod("plscale-blip-0")
    rp.fake.fail_terminate = 1
    done = rp("down", "--all", "--yes", timeout=4)  # fixed: well under 1 s
    assert done.returncode == 0 and rp.fake.alive() == [], done.stderr
    assert rp.fake.terminated == [pod_id]


@pytest.mark.parametrize("args, words", [
    (["--gpus", 0], ["--gpus 0"]),
    (["--cloud", "aws"], ["--cloud aws"]),
    (["--max-hours", 0], ["--max-hours"]),
    (["--max-hours", 100], ["--max-hours", "72"]),
    (["--gpu-type", "NVIDIA A4O"], ["not a RunPod GPU type", "NVIDIA A40"]),
    (["--gpu-type", "NVIDIA GeForce RTX 4090"], ["--cloud community"]),
    (["--name", "Bad_Name"], ["--name"]),
    (["--remote-dir", "plscale"], ["--remote-dir", "absolute"]),
    (["--disk", 5], ["--disk"]),
    (["--timeout", 0], ["--timeout 0"]),
    (["--image", ""], ["--image is empty"]),
    (["--max-hours", 0.0001], ["--max-hours", "0.01"]),
    (["--gpu-type", "h100"], ["not a RunPod GPU type", "NVIDIA H100 80GB HBM3"]),
])
def test_bad_up_input(rp, keypair, args, words):
    one_error(rp.up(*args, "--yes", key=keypair), *words)
    assert "CreatePod" not in rp.fake.ops()
    nothing_left(rp)


def test_missing_ssh_key(rp, tmp_path, keypair):
    one_error(rp.up("--yes", key=tmp_path / "nope" / "id_ed25519"), "ssh-keygen", "--ssh-key")
    one_error(rp.up("--yes", key=f"{keypair}.pub"), "give the private key", str(keypair))
    assert rp.fake.requests == []


def test_up_forgets_a_cluster_whose_pods_are_gone(rp, sshd):
    assert rp.up("--max-hours", 0.01, "--yes", sshd=sshd).returncode == 0
    rp.fake.advance(60)  # past its --max-hours: RunPod ended it
    done = rp.up("--yes", sshd=sshd)
    assert done.returncode == 0 and "no longer lists the pods of the earlier cluster" in done.stdout, done.stderr
    assert len(rp.state()["clusters"]["plscale"]["pods"]) == 1 and len(rp.fake.alive()) == 1
    assert rp("down", "--yes").returncode == 0
    nothing_left(rp)


@pytest.mark.parametrize("trouble, words", [
    ("server_error", ["HTTP 500", "status.runpod.io"]),
    ("unreachable", ["Cannot reach RunPod", "PLSCALE_RUNPOD_API"]),
])
def test_service_trouble(rp, trouble, words):
    env = {}
    if trouble == "server_error":
        rp.fake.server_error = True
    else:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            env["PLSCALE_RUNPOD_API"] = f"http://127.0.0.1:{s.getsockname()[1]}/graphql"
    one_error(rp("gpus", env=env), *words)


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


def test_a_pod_whose_create_answer_was_lost_is_found_by_name_and_terminated(rp, keypair):
    """RunPod made the pod but the answer never came (a gateway timeout): `up` looks for its name."""
    rp.fake.lose_create_answer = True
    done = rp.up("--yes", key=keypair)
    one_error(done, "HTTP 502", "terminated the 1 pod(s)", "nothing left billing", only=False)
    assert len(rp.fake.created) == 1 and rp.fake.terminated != []
    nothing_left(rp)


def test_a_field_the_api_refuses_is_named(rp, keypair):
    rp.fake.unknown_fields = {"globalNetwork"}
    done = rp.up("--nodes", 2, "--yes", key=keypair)
    one_error(done, "refused CreatePod", "globalNetwork", only=False)
    assert rp.fake.created == []
    nothing_left(rp)


def test_a_key_runpod_does_not_know(rp, keypair):
    rp.fake.null_myself = True
    one_error(rp.up("--yes", key=keypair), "does not know this API key")
    assert rp.fake.created == []


def test_a_key_with_a_passphrase_must_be_in_the_agent(rp, tmp_path):
    key = tmp_path / "locked" / "id_ed25519"
    key.parent.mkdir()
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "a passphrase", "-f", str(key)], check=True)
    done = rp.up("--yes", key=key, env={"SSH_AUTH_SOCK": ""})
    one_error(done, "passphrase", f"ssh-add {key}")
    assert rp.fake.created == []


def test_state_writes_keep_the_other_clusters(tmp_path, monkeypatch):
    """Each command rewrites only its own cluster, under a lock: one `up` cannot drop another's record."""
    from plscale.runpod import local
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    local.put_cluster({"name": "a", "pods": [{"id": "p1"}]})
    local.put_cluster({"name": "b", "pods": [{"id": "p2"}, {"id": "p3"}]})
    local.keep_pods(local.load_state()["clusters"]["b"], ["p3"])
    local.drop_cluster("a")
    assert local.load_state() == {"clusters": {"b": {"name": "b", "pods": [{"id": "p3"}]}}}
    assert stat.S_IMODE(local.state_file().stat().st_mode) == 0o600
