"""Pods up and down, so that nothing is ever left billing by accident.

`up` prices the request from RunPod's catalog before anything exists, makes sure the
account's SSH keys hold the student's public key (RunPod's `startSsh` puts those keys on the
pods), then creates one pod, or for several nodes one Instant Cluster (`/v2/clusters`, every
node alike, on a private network). The record is written to the state file the moment RunPod
answers. It waits until SSH answers on every node, then starts the watchdog
(plscale/runpod/watchdog.py) on each, which ends the pod or the cluster at --max-hours with
the pod's own key, whatever happens to this machine. If anything fails once something
exists, everything it created is deleted and checked gone before the error is shown.
`down` deletes and then asks RunPod whether anything is still there.
"""

import difflib
import os
import re
import shlex
import subprocess
import time
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path

from plscale.errors import UserError
from plscale.runpod import local, ssh
from plscale.runpod.api import NoCapacity, NotFound, RunPodAPI, RunPodError

PREFIX = "plscale-"
NAME = re.compile(r"^[a-z0-9][a-z0-9-]{0,30}$")
OUR_POD = re.compile(rf"^{PREFIX}[a-z0-9][a-z0-9-]*-\d+$")    # plscale-NAME-0: the pod `up` makes for one node
OUR_CLUSTER = re.compile(rf"^{PREFIX}[a-z0-9][a-z0-9-]*$")     # plscale-NAME: the cluster it makes for several


@dataclass
class Request:
    gpus: int
    gpu_type: str
    nodes: int = 1
    cloud: str = "secure"
    volume: int = 20
    disk: int = 40
    image: str = "runpod/pytorch:2.8.0-py3.11-cuda12.8.1-cudnn-devel-ubuntu22.04"
    max_hours: float = 2.0
    name: str = "plscale"
    ssh_key: str | None = None
    remote_dir: str = "/workspace/plscale"
    timeout: float = 900
    # The seam for RunPod's managed Slurm: an Instant Cluster of type SLURM has a controller at
    # rank 0 and compute nodes; the labs would then go through the Slurm launcher (not built yet).
    cluster_type: str = "TRAINING"


@dataclass
class Quote:
    gpu: dict
    per_gpu_hour: float
    per_hour: float      # all nodes together
    for_max_hours: float
    availability: str


def check(req: Request, state: dict) -> Path:
    """Bad input, found before RunPod is asked anything. Returns the private key's path."""
    if req.gpus < 1 or req.nodes < 1:
        raise UserError(f"--gpus {req.gpus} --nodes {req.nodes}: use 1 or more of each.")
    if req.nodes > 250:
        raise UserError(f"--nodes {req.nodes}: a RunPod Instant Cluster has at most 250 nodes.")
    req.cloud = req.cloud.lower()
    if req.cloud not in ("secure", "community"):
        raise UserError(f"--cloud {req.cloud}: use secure or community.")
    if not 0.01 <= req.max_hours <= 72:
        raise UserError(f"--max-hours {req.max_hours:g}: use a number of hours from 0.01 to 72; the pods end "
                        f"themselves then, so pick what the labs need plus a margin.")
    if not req.timeout > 0:
        raise UserError(f"--timeout {req.timeout:g}: give the seconds to wait for SSH, above 0 (default 900).")
    if not req.image.strip():
        raise UserError("--image is empty: give a container image, e.g. the default " + Request.image + ".")
    if not (req.volume == 0 or req.volume >= 10) or req.disk < 10:
        raise UserError(f"--volume {req.volume} --disk {req.disk}: the volume is 0 (none) or 10 GB or more "
                        f"(RunPod's floor), the disk 10 GB or more.")
    if not NAME.match(req.name):
        raise UserError(f"--name {req.name!r}: use lowercase letters, digits and '-', up to 31 characters.")
    if req.name in state["clusters"]:
        raise UserError(f"Cluster {req.name!r} is already up: `plscale runpod down --name {req.name}` first, "
                        f"or pick another --name.")
    if req.nodes > 1 and req.cloud != "secure":
        raise UserError(f"--nodes {req.nodes} --cloud {req.cloud}: several nodes are one RunPod Instant Cluster, "
                        f"which only the secure cloud has: use --cloud secure.")
    if not req.remote_dir.startswith("/") or any(c.isspace() for c in req.remote_dir):
        raise UserError(f"--remote-dir {req.remote_dir!r}: give an absolute path on the pod without spaces, "
                        f"e.g. /workspace/plscale.")
    for tool in ("ssh", "ssh-keygen"):
        ssh.require(tool)
    key = private_key(req.ssh_key)
    ssh.check_key(key)
    return key


def private_key(given: str | None) -> Path:
    if given and given.endswith(".pub"):
        raise UserError(f"--ssh-key {given}: give the private key, {given[:-4]} (its .pub goes to the pods).")
    candidates = [Path(given).expanduser()] if given else [Path.home() / ".ssh" / n for n in ("id_ed25519", "id_rsa")]
    for key in candidates:
        if key.is_file() and key.with_name(key.name + ".pub").is_file():
            return key
    where = given or "~/.ssh/id_ed25519"
    raise UserError(f"No SSH key pair at {where} (and {where}.pub): make one with `ssh-keygen -t ed25519`, "
                    f"or point --ssh-key at yours.")


def quote(api: RunPodAPI, req: Request) -> Quote:
    """The price and stock of the request, from RunPod's catalog (pods or clusters, this cloud, this count)."""
    cloud = req.cloud.upper()
    types = api.gpus(req.gpus, "CLUSTER" if req.nodes > 1 else "POD", cloud)
    by_name = {(t.get("id") or "").lower(): t for t in types} | {(t.get("name") or "").lower(): t for t in types}
    gpu = by_name.get(req.gpu_type.lower())
    if gpu is None:
        close = difflib.get_close_matches(req.gpu_type.lower(), list(by_name), n=1, cutoff=0.75) or \
            [n for n in by_name if req.gpu_type.lower() in n][:1]
        hint = f" Did you mean {by_name[close[0]]['id']!r}?" if close else ""
        raise UserError(f"--gpu-type {req.gpu_type!r} is not a RunPod GPU type.{hint} `plscale runpod gpus` lists them.")
    other = "community" if req.cloud == "secure" else "secure"
    price = (gpu.get("price") or {}).get(req.cloud)
    if not gpu.get(req.cloud) or not price:
        raise UserError(f"{gpu['id']} is not offered in RunPod's {req.cloud} cloud: try --cloud {other}.")
    most = (gpu.get("maxCount") or {}).get(req.cloud) or 0
    if req.gpus > most:
        raise UserError(f"--gpus {req.gpus}: a {gpu['id']} pod in the {req.cloud} cloud has at most {most} GPUs; "
                        f"ask for fewer per pod (and more --nodes).")
    availability = gpu.get("availability") or "NONE"
    if availability == "NONE":
        what = f"{req.nodes}-node clusters" if req.nodes > 1 else "pods"
        raise NoCapacity(f"RunPod has no {gpu['id']} {what} with {req.gpus} GPU(s) in stock in the {req.cloud} cloud "
                         f"now: try {'--cloud ' + other + ', ' if req.nodes == 1 else ''}fewer --gpus, another "
                         f"--gpu-type (`plscale runpod gpus` shows stock), or again later.")
    per_hour = price * req.gpus * req.nodes
    return Quote(gpu, price, per_hour, per_hour * req.max_hours, availability)


def public_key(key: Path) -> str:
    return key.with_name(key.name + ".pub").read_text().strip()


def key_registered(api: RunPodAPI, key: Path) -> tuple[bool, list[str]]:
    """Whether the account's SSH keys hold this public key (type and base64 compared, not the comment)."""
    keys = api.ssh_keys()
    ours = public_key(key).split()[:2]
    return any(k.split()[:2] == ours for k in keys), keys


def register_key(api: RunPodAPI, key: Path, keys: list[str]) -> None:
    """Add the public key to the account's set (a PUT replaces the set: the others are sent too)."""
    now = api.set_ssh_keys([*keys, public_key(key)])
    if not any(k.split()[:2] == public_key(key).split()[:2] for k in now):
        raise RunPodError(f"RunPod did not keep the SSH key {key}.pub: add it by hand at "
                          f"https://www.runpod.io/console/user/settings (SSH Public Keys), then `up` again.")


def deadline_of(req: Request) -> datetime:
    return datetime.now(timezone.utc) + timedelta(hours=req.max_hours)


def container(req: Request, deadline: datetime) -> dict:
    """What every node's container gets: image, disks, the SSH port, the account's keys, the deadline."""
    spec = {"image": req.image, "disk": req.disk, "ports": ["22/tcp"], "startSsh": True,
            "env": {"PLSCALE_DEADLINE": deadline.strftime("%Y-%m-%dT%H:%M:%SZ")}}
    if req.volume:
        spec["mounts"] = {"persistent": {"size": req.volume, "path": "/workspace"}}
    return spec


def pod_body(req: Request, q: Quote, deadline: datetime) -> dict:
    return {"name": f"{PREFIX}{req.name}-0", "gpu": {"id": q.gpu["id"], "count": req.gpus},
            "cloud": req.cloud.upper(), **container(req, deadline)}


def cluster_body(req: Request, q: Quote, deadline: datetime) -> dict:
    return {"name": f"{PREFIX}{req.name}", "type": req.cluster_type,
            "compute": {"gpuTypeId": q.gpu["id"], "gpuCountPerPod": req.gpus, "podCount": req.nodes},
            **container(req, deadline)}


def create(api: RunPodAPI, req: Request, q: Quote, key: Path, status) -> dict:
    """Create the pod or the cluster, wait until SSH answers on every node and its watchdog is armed.
    On any failure (Ctrl-C included) whatever was created is deleted and checked gone, then the error goes on."""
    deadline = deadline_of(req)
    record = {"name": req.name, "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
              "gpu_type": q.gpu["id"], "gpus": req.gpus, "nodes": req.nodes, "cloud": req.cloud,
              "image": req.image, "max_hours": req.max_hours, "terminate_after": deadline.isoformat(timespec="seconds"),
              "remote_dir": req.remote_dir, "ssh_key": str(key), "cluster_id": None, "pods": []}
    try:
        if req.nodes == 1:
            status(f"creating a pod ({req.gpus} x {q.gpu['id']})")
            made = api.create_pod(pod_body(req, q, deadline))
            record["pods"].append({"id": made["id"], "node": 0, "cost_per_hr": made.get("cost"), "host": None,
                                   "port": None})
        else:
            status(f"creating an Instant Cluster of {req.nodes} nodes ({req.gpus} x {q.gpu['id']} each)")
            record["cluster_id"] = api.create_cluster(cluster_body(req, q, deadline))["id"]
        local.put_cluster(record)
        wait_for_ssh(api, record, req.timeout, status)
        for pod in record["pods"]:
            status(f"starting the --max-hours watchdog on node {pod['node']}")
            arm(api, record, pod)
    except BaseException as exc:
        try:
            created, left, reasons = undo(api, record, status)
        except KeyboardInterrupt:
            raise Interrupted(f"Interrupted while deleting: {', '.join(i for _, i in resources(record))} may still "
                              f"be running: `plscale runpod down --name {record['name']}` ends them.") from None
        if isinstance(exc, (UserError, KeyboardInterrupt)) and created:
            interrupted = isinstance(exc, KeyboardInterrupt)
            error = (Interrupted if interrupted else RunPodError)(
                f"{'Interrupted' if interrupted else str(exc).rstrip('.')}. Deleted what it had created "
                f"({', '.join(created)}); {_gone(record, left, reasons)}")
            raise error from None
        raise
    local.put_cluster(record)
    return record


def resources(record: dict) -> list[tuple[str, str]]:
    """What bills for a record: its cluster (deleting it ends every node), or its pods."""
    if record.get("cluster_id"):
        return [("cluster", record["cluster_id"])]
    return [("pod", p["id"]) for p in record["pods"]]


def undo(api: RunPodAPI, record: dict, status) -> tuple[list[str], list[tuple[str, str]], dict]:
    """Delete a half-made record: what is on record, and anything RunPod lists under its names (a create
    whose answer was lost may have made one). Returns (created, still listed, RunPod's reasons)."""
    made = resources(record)
    try:
        made += [r for r in named(api, record["name"]) if r not in made]
    except RunPodError:
        pass  # unreachable: what is on record at least is tried below
    left, reasons = made, {}
    if made:
        status(f"deleting {', '.join(i for _, i in made)}")
        try:
            left, reasons = terminate_all(api, made)
        except RunPodError:
            pass  # RunPod unreachable: everything stays in the state file for `down`
    keep(record, left)
    return [f"{kind} {i}" for kind, i in made], left, reasons


def named(api: RunPodAPI, name: str) -> list[tuple[str, str]]:
    """The pod or cluster RunPod lists under the names `up` gives for cluster `name`."""
    found = [("cluster", c["id"]) for c in api.clusters() if c.get("name") == f"{PREFIX}{name}"]
    return found + [("pod", p["id"]) for p in api.pods()
                    if p.get("name") == f"{PREFIX}{name}-0" and not p.get("cluster")]


def keep(record: dict, left: list[tuple[str, str]]) -> None:
    """Keep on record only what RunPod still lists; a record left with nothing leaves the file."""
    ids = {i for _, i in left}
    clusters = [i for kind, i in left if kind == "cluster"]
    if record.get("cluster_id") not in ids and (record.get("cluster_id") or clusters):
        # its cluster deleted (or one found by name, of a create whose answer was lost, takes its place)
        record["cluster_id"], record["pods"] = (clusters[0] if clusters else None), []
    record["stray_clusters"] = [i for i in clusters if i != record["cluster_id"]]
    if not record["cluster_id"]:
        known = {p["id"] for p in record["pods"]}
        record["pods"] = [p for p in record["pods"] if p["id"] in ids] + \
            [{"id": i, "node": None, "host": None, "port": None} for kind, i in left if kind == "pod" and i not in known]
    if record["pods"] or record["cluster_id"] or record["stray_clusters"]:
        local.put_cluster(record)
    else:
        local.drop_cluster(record["name"])


class Interrupted(RunPodError):
    exit_code = 130


def _gone(record: dict, left: list, reasons: dict) -> str:
    if left:
        why = "; ".join(f"{i}: {reasons[i]}" for _, i in left if i in reasons)
        return (f"RunPod still lists {', '.join(i for _, i in left)}{' (' + why + ')' if why else ''}: "
                f"`plscale runpod down --name {record['name']}` tries again, or delete it in the console "
                f"(https://www.runpod.io/console/pods).")
    return "RunPod lists none of it now: nothing left billing."


def wait_for_ssh(api: RunPodAPI, record: dict, timeout: float, status) -> None:
    """Every node's direct SSH endpoint first (RunPod reports it once the pod runs), then sshd itself."""
    start, poll = time.monotonic(), poll_interval()
    while True:
        live = nodes(api, record)
        for pod in record["pods"]:
            found = live.get(pod["id"])
            direct = ((found or {}).get("ssh") or {}).get("direct")
            if direct and pod["host"] is None:
                pod["host"], pod["port"] = direct["host"], int(direct["port"])
                ssh.forget_host(pod)
        local.put_cluster(record)
        waiting = [p for p in record["pods"] if p["host"] is None]
        if record["pods"] and not waiting and len(record["pods"]) == record["nodes"]:
            break
        states = ", ".join(f"node {p['node']} {(live.get(p['id']) or {}).get('status', '?')}" for p in waiting) or \
            f"{len(record['pods'])} of {record['nodes']} nodes placed"
        _tick(start, timeout, status, f"starting ({states})",
              f"{states}: RunPod gave no direct SSH endpoint; try again with a larger --timeout, or another "
              f"--gpu-type or --cloud")
        time.sleep(poll)
    for pod in record["pods"]:
        while not ssh.answers(record, pod):
            _tick(start, timeout, status, f"waiting for sshd on node {pod['node']} ({pod['host']}:{pod['port']})",
                  f"node {pod['node']} is up, but SSH never answered at {pod['host']}:{pod['port']} with key "
                  f"{record['ssh_key']}; check that --image starts sshd from PUBLIC_KEY (RunPod's images do) and "
                  f"that no firewall blocks the port")
            time.sleep(poll)
    status("every node answers over SSH")


def nodes(api: RunPodAPI, record: dict) -> dict:
    """The record's pods as RunPod lists them now, by id (a cluster's members filed in by rank)."""
    if not record.get("cluster_id"):
        found = {p["id"]: api.pod(p["id"]) for p in record["pods"]}
        gone = [i for i, p in found.items() if p is None]
        if gone:
            raise RunPodError(f"Pod {', '.join(gone)} disappeared while starting (deleted in the console?): run "
                              f"`plscale runpod up` again.")
        return found
    if api.cluster(record["cluster_id"]) is None:
        raise RunPodError(f"Cluster {record['cluster_id']} disappeared while starting (deleted in the console?): "
                          f"run `plscale runpod up` again.")
    members = {p["id"]: p for p in api.cluster_pods(record["cluster_id"])}
    known = {p["id"] for p in record["pods"]}
    for pod in sorted(members.values(), key=lambda p: (p.get("cluster") or {}).get("rank") or 0):
        rank = (pod.get("cluster") or {}).get("rank")
        if pod["id"] not in known and rank is not None:
            record["pods"].append({"id": pod["id"], "node": rank, "cost_per_hr": pod.get("cost"),
                                   "host": None, "port": None})
    record["pods"].sort(key=lambda p: p["node"])
    return members


def _tick(start: float, timeout: float, status, what: str, failure: str) -> None:
    waited = time.monotonic() - start
    if waited > timeout:
        raise RunPodError(f"Not ready after --timeout {timeout:g} s: {failure}")
    status(f"{what} ({waited:.0f} s)")


# ---- the watchdog, on every node ----
def watchdog_dir(record: dict, pod: dict) -> str:
    # By pod id: on RunPod a pod has its own disk, but nodes may share a folder (the tests' sshd does).
    return f"{record['remote_dir'].rstrip('/')}/.plscale/watchdog-{pod['id']}"


def arm(api: RunPodAPI, record: dict, pod: dict, wait: float = 60) -> None:
    """Copy the watchdog to the node, start it detached with the deadline, and wait until it says `armed`
    (it has read its own pod with the pod's key)."""
    where = watchdog_dir(record, pod)
    deadline = datetime.fromisoformat(record["terminate_after"]).timestamp()
    environ = os.environ.get("PLSCALE_RUNPOD_POD_ENVIRON", "/proc/1/environ").format(pod=pod["id"])
    argv = ["python3", f"{where}/watchdog.py", "--pod", pod["id"], "--api", api.base, "--dir", where,
            "--poll", os.environ.get("PLSCALE_RUNPOD_WATCHDOG_POLL", "30"), "--environ", environ]
    if record.get("cluster_id"):
        argv += ["--cluster", record["cluster_id"]]
    q = shlex.quote
    start = (f"command -v python3 >/dev/null || {{ echo 'no python3 on the pod' >&2; exit 3; }}; "
             f"mkdir -p {q(where)} && cat > {q(where + '/watchdog.py')} && echo {deadline:.0f} > {q(where + '/deadline')}"
             f" && rm -f {q(where + '/status')} && (setsid nohup {shlex.join(argv)} > {q(where + '/log')} 2>&1 "
             f"< /dev/null &)")
    script = Path(__file__).with_name("watchdog.py").read_text()
    done = ssh.run(record, pod, start, input=script)
    if done.returncode != 0:
        raise RunPodError(f"Could not start the --max-hours watchdog on node {pod['node']}: "
                          f"{(done.stderr.strip() or 'exit ' + str(done.returncode)).splitlines()[-1]}.")
    until = time.monotonic() + wait
    while True:
        said = watchdog_status(record, pod)
        if said.startswith("armed"):
            return
        if said.startswith("error") or time.monotonic() > until:
            raise RunPodError(f"The --max-hours watchdog on node {pod['node']} did not arm ({said or 'no word from it'}): "
                              f"without it nothing ends the pods if this machine goes away.")
        time.sleep(min(poll_interval(), 1))


def watchdog_status(record: dict, pod: dict) -> str:
    """The watchdog's last word (armed, refused, ended, error), `not running` if its process is gone."""
    where = shlex.quote(watchdog_dir(record, pod))
    command = (f"s=$(cat {where}/status 2>/dev/null) || exit 0; echo \"$s\"; case $s in armed*) "
               f"kill -0 \"${{s##* }}\" 2>/dev/null || echo 'not running';; esac")
    try:
        done = ssh.run(record, pod, command, timeout=30)
    except subprocess.TimeoutExpired:
        return "no answer over SSH"
    lines = done.stdout.strip().splitlines()
    return "not running (its process is gone)" if lines[-1:] == ["not running"] else (lines[0] if lines else "")


# ---- down ----
def still_listed(api: RunPodAPI, items: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """The clusters and pods RunPod still lists: they may still bill."""
    return [(kind, i) for kind, i in items if (api.cluster(i) if kind == "cluster" else api.pod(i)) is not None]


def terminate_all(api: RunPodAPI, items: list[tuple[str, str]]) -> tuple[list[tuple[str, str]], dict]:
    """Delete each, again each round for those still listed (one refused call must not leave anything
    billing). Returns what RunPod still lists after about 12 rounds (nothing, normally) and its reasons."""
    left, reasons = still_listed(api, items), {}
    for _ in range(12):
        if not left:
            break
        for kind, i in left:
            try:
                (api.delete_cluster if kind == "cluster" else api.delete_pod)(i)
            except NotFound:
                pass
            except RunPodError as exc:  # refused this time: the next round tries again, the reason is kept
                reasons[i] = exc.detail or (f"HTTP {exc.status}" if exc.status else str(exc))
        time.sleep(poll_interval())
        left = still_listed(api, left)
    return left, {i: r for i, r in reasons.items() if any(i == j for _, j in left)}


def poll_interval() -> float:
    return float(os.environ.get("PLSCALE_RUNPOD_POLL", "5"))


def ours(api: RunPodAPI, state: dict) -> list[tuple[str, str]]:
    """Everything this tool created: in the state file, or named by it in the account."""
    return [r for c in state["clusters"].values() for r in record_items(c)] + \
        [(kind, i) for kind, i, _ in strays(api, state)]


def record_items(record: dict) -> list[tuple[str, str]]:
    return resources(record) + [("cluster", i) for i in record.get("stray_clusters") or []]


def strays(api: RunPodAPI, state: dict) -> list[tuple[str, str, str]]:
    """Pods and clusters named by this tool in the account that the state file does not know."""
    known = {i for c in state["clusters"].values() for _, i in record_items(c)}
    known |= {p["id"] for c in state["clusters"].values() for p in c["pods"]}
    found = [("cluster", c["id"], c.get("name") or "") for c in api.clusters()
             if OUR_CLUSTER.match(c.get("name") or "") and c["id"] not in known]
    return found + [("pod", p["id"], p.get("name") or "") for p in api.pods() if not p.get("cluster")
                    and OUR_POD.match(p.get("name") or "") and p["id"] not in known]


def overdue(state: dict) -> list[str]:
    """A line for each record past its --max-hours: its watchdog should have ended it; `down` makes sure."""
    now = datetime.now(timezone.utc)
    return [f"Cluster {name!r} passed its --max-hours at {c['terminate_after']}: its watchdog should have ended it; "
            f"`plscale runpod down --name {name}` makes sure nothing of it still bills."
            for name, c in state["clusters"].items()
            if c.get("terminate_after") and datetime.fromisoformat(c["terminate_after"]) <= now]
