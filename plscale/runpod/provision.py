"""Pods up and down, so that nothing is ever left billing by accident.

`up` prices the request before anything exists, creates the pods one by one (each
written to the state file at once), sets RunPod's own terminate time on every one
(`terminateAfter` = now + --max-hours, so a lost laptop cannot leave them running), and
waits until SSH really answers. If anything fails once a pod exists, every pod it created
is terminated and checked gone before the error is shown. `down` terminates and then asks
RunPod whether any of the pods is still there.
"""

import difflib
import os
import re
import time
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path

from plscale.errors import UserError
from plscale.runpod import local, ssh
from plscale.runpod.api import KeyRefused, LowBalance, NoCapacity, RunPodAPI, RunPodError, Unreachable

PREFIX = "plscale-"
NAME = re.compile(r"^[a-z0-9][a-z0-9-]{0,30}$")
OUR_POD = re.compile(rf"^{PREFIX}[a-z0-9][a-z0-9-]*-\d+$")  # plscale-CLUSTER-NODE: pods `up` names


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


@dataclass
class Quote:
    gpu: dict
    per_gpu_hour: float
    per_hour: float      # all pods together
    for_max_hours: float
    balance: float


def check(req: Request, state: dict) -> Path:
    """Bad input, found before RunPod is asked anything. Returns the private key's path."""
    if req.gpus < 1 or req.nodes < 1:
        raise UserError(f"--gpus {req.gpus} --nodes {req.nodes}: use 1 or more of each.")
    req.cloud = req.cloud.lower()
    if req.cloud not in ("secure", "community"):
        raise UserError(f"--cloud {req.cloud}: use secure or community.")
    if not 0.01 <= req.max_hours <= 72:
        raise UserError(f"--max-hours {req.max_hours:g}: use a number of hours from 0.01 to 72; the pods "
                        f"are terminated by RunPod then, so pick what the labs need plus a margin.")
    if not req.timeout > 0:
        raise UserError(f"--timeout {req.timeout:g}: give the seconds to wait for SSH, above 0 (default 900).")
    if not req.image.strip():
        raise UserError("--image is empty: give a container image, e.g. the default " + Request.image + ".")
    if req.volume < 0 or req.disk < 10:
        raise UserError(f"--volume {req.volume} --disk {req.disk}: the volume is 0 GB or more, the disk 10 GB or more.")
    if not NAME.match(req.name):
        raise UserError(f"--name {req.name!r}: use lowercase letters, digits and '-', up to 31 characters.")
    if req.name in state["clusters"]:
        raise UserError(f"Cluster {req.name!r} is already up: `plscale runpod down --name {req.name}` first, "
                        f"or pick another --name.")
    if req.nodes > 1 and req.cloud != "secure":
        raise UserError(f"--nodes {req.nodes} --cloud {req.cloud}: several pods talk over RunPod's private network, "
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
    types = api.gpu_types(req.gpus)
    by_name = {(t.get("id") or "").lower(): t for t in types} | {(t.get("displayName") or "").lower(): t for t in types}
    gpu = by_name.get(req.gpu_type.lower())
    if gpu is None:
        close = difflib.get_close_matches(req.gpu_type.lower(), list(by_name), n=1, cutoff=0.75) or \
            [n for n in by_name if req.gpu_type.lower() in n][:1]
        hint = f" Did you mean {by_name[close[0]]['id']!r}?" if close else ""
        raise UserError(f"--gpu-type {req.gpu_type!r} is not a RunPod GPU type.{hint} `plscale runpod gpus` lists them.")
    price = gpu.get(f"{req.cloud}Price")
    other = "community" if req.cloud == "secure" else "secure"
    if not gpu.get(f"{req.cloud}Cloud") or not price:
        raise UserError(f"{gpu['id']} is not offered in RunPod's {req.cloud} cloud: try --cloud {other}.")
    if not (gpu.get(req.cloud) or {}).get("stockStatus"):
        raise NoCapacity(f"RunPod has no {gpu['id']} pods with {req.gpus} GPU(s) in stock in the {req.cloud} cloud "
                         f"now: try --cloud {other}, fewer --gpus, another --gpu-type (`plscale runpod gpus` shows "
                         f"stock), or again later.")
    per_hour = price * req.gpus * req.nodes
    balance = float(api.myself().get("clientBalance") or 0)
    return Quote(gpu, price, per_hour, per_hour * req.max_hours, balance)


def check_balance(q: Quote) -> None:
    if q.balance < q.per_hour:
        raise LowBalance(f"Your RunPod balance (${q.balance:.2f}) is below one hour of this request "
                         f"(${q.per_hour:.2f}/h): add credit at https://www.runpod.io/console/user/billing, "
                         f"or ask for fewer or cheaper GPUs.")


def pod_spec(req: Request, q: Quote, node: int, public_key: str, deadline: datetime) -> dict:
    spec = {"name": f"{PREFIX}{req.name}-{node}", "imageName": req.image, "gpuTypeId": q.gpu["id"],
            "gpuCount": req.gpus, "cloudType": req.cloud.upper(), "containerDiskInGb": req.disk,
            "volumeInGb": req.volume, "volumeMountPath": "/workspace", "ports": "22/tcp", "startSsh": True,
            "supportPublicIp": True, "env": [{"key": "PUBLIC_KEY", "value": public_key}],
            "terminateAfter": deadline.strftime("%Y-%m-%dT%H:%M:%SZ")}
    if req.nodes > 1:
        spec["globalNetwork"] = True  # the pods' private network, for NCCL between nodes
    return spec


def create(api: RunPodAPI, req: Request, q: Quote, key: Path, status) -> dict:
    """Create the pods and wait until SSH answers on each. On any failure (Ctrl-C included) every
    pod created so far is terminated and checked gone, then the error goes on."""
    deadline = datetime.now(timezone.utc) + timedelta(hours=req.max_hours)
    cluster = {"name": req.name, "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
               "gpu_type": q.gpu["id"], "gpus": req.gpus, "nodes": req.nodes, "cloud": req.cloud,
               "image": req.image, "max_hours": req.max_hours,
               "terminate_after": deadline.isoformat(timespec="seconds"), "remote_dir": req.remote_dir,
               "ssh_key": str(key), "pods": []}
    public_key = key.with_name(key.name + ".pub").read_text().strip()
    try:
        for node in range(req.nodes):
            status(f"creating pod {node + 1} of {req.nodes} ({req.gpus} x {q.gpu['id']})")
            made = api.create(pod_spec(req, q, node, public_key, deadline))
            cluster["pods"].append({"id": made["id"], "node": node, "cost_per_hr": made.get("costPerHr"),
                                    "host": None, "port": None})
            local.put_cluster(cluster)
        wait_for_ssh(api, cluster, req.timeout, status)
    except BaseException as exc:
        try:
            created, left = undo(api, cluster, status)
        except KeyboardInterrupt:
            raise Interrupted(f"Interrupted while terminating: pod(s) {', '.join(p['id'] for p in cluster['pods'])} "
                              f"may still be running: `plscale runpod down --name {cluster['name']}` ends them.") from None
        if isinstance(exc, (UserError, KeyboardInterrupt)) and created:
            interrupted = isinstance(exc, KeyboardInterrupt)
            error = (Interrupted if interrupted else RunPodError)(
                f"{'Interrupted' if interrupted else str(exc).rstrip('.')}. Terminated the {len(created)} pod(s) "
                f"it had created ({', '.join(created)}); {_gone(left)}")
            raise error from None
        raise
    local.put_cluster(cluster)
    return cluster


def undo(api: RunPodAPI, cluster: dict, status) -> tuple[list[str], list[str]]:
    """Terminate a half-made cluster: the pods on record, and any RunPod lists under the cluster's pod
    names (a create whose answer was lost may have made one). Returns (created, still listed); the
    cluster leaves the state file only once RunPod lists none of its pods."""
    created = [p["id"] for p in cluster["pods"]]
    try:
        named = re.compile(rf"^{PREFIX}{re.escape(cluster['name'])}-\d+$")
        created += [p["id"] for p in api.myself().get("pods") or [] if named.match(p.get("name") or "")
                    and p["id"] not in created]
    except RunPodError:
        pass  # unreachable: the recorded pods at least are tried below
    left = created
    if created:
        status(f"terminating the {len(created)} pod(s) just created")
        try:
            left = terminate_all(api, created)
        except RunPodError:
            pass  # RunPod unreachable: every pod stays in the state file for `down`
    recorded = {p["id"] for p in cluster["pods"]}
    cluster["pods"] += [{"id": i, "node": None, "host": None, "port": None} for i in left if i not in recorded]
    local.keep_pods(cluster, left)
    return created, left


class Interrupted(RunPodError):
    exit_code = 130


def _gone(left: list[str]) -> str:
    if left:
        return (f"RunPod still lists {', '.join(left)}: terminate it in the console "
                f"(https://www.runpod.io/console/pods) or run `plscale runpod down --all`.")
    return "RunPod lists none of them now: nothing left billing."


def wait_for_ssh(api: RunPodAPI, cluster: dict, timeout: float, status) -> None:
    """Ports first (RunPod reports them late), then sshd (it starts later still)."""
    start, poll = time.monotonic(), poll_interval()
    for pod in cluster["pods"]:
        while pod["host"] is None:
            found = api.pod(pod["id"])
            if found is None:
                raise RunPodError(f"Pod {pod['id']} disappeared while starting (terminated in the console, or its "
                                  f"--max-hours passed): run `plscale runpod up` again.")
            endpoint = ssh_endpoint(found)
            if endpoint:
                pod["host"], pod["port"] = endpoint
                ssh.forget_host(pod)
                break
            _tick(start, timeout, status, f"pod {pod['id']} is starting ({found.get('desiredStatus')}, "
                                           f"no ports yet)",
                  f"pod {pod['id']} is stuck pending (RunPod gave it no SSH port); try again with a larger "
                  f"--timeout, or another --gpu-type or --cloud")
            time.sleep(poll)
        while not ssh.answers(cluster, pod):
            _tick(start, timeout, status, f"waiting for sshd on {pod['host']}:{pod['port']}",
                  f"pod {pod['id']} is up, but SSH never answered at {pod['host']}:{pod['port']} with key "
                  f"{cluster['ssh_key']}; check that --image starts sshd from PUBLIC_KEY (RunPod's images "
                  f"do) and that no firewall blocks the port")
            time.sleep(poll)
    status("every pod answers over SSH")


def _tick(start: float, timeout: float, status, what: str, failure: str) -> None:
    waited = time.monotonic() - start
    if waited > timeout:
        raise RunPodError(f"Pods not ready after --timeout {timeout:g} s: {failure}")
    status(f"{what} ({waited:.0f} s)")


def ssh_endpoint(pod: dict) -> tuple[str, int] | None:
    ports = (pod.get("runtime") or {}).get("ports") or []
    for p in ports:
        if p.get("privatePort") == 22 and p.get("isIpPublic") and p.get("type") == "tcp":
            return p["ip"], int(p["publicPort"])
    return None


def still_listed(api: RunPodAPI, pod_ids: list[str]) -> list[str]:
    """The pods RunPod still lists (in the account, or by id): they may still bill."""
    listed = {p["id"] for p in api.myself().get("pods") or []}
    return [i for i in pod_ids if i in listed or _exists(api, i)]


def _exists(api: RunPodAPI, pod_id: str) -> bool:
    try:
        return api.pod(pod_id) is not None
    except (Unreachable, KeyRefused):
        raise
    except RunPodError:  # "not found" as an error rather than null: gone
        return False


def terminate_all(api: RunPodAPI, pod_ids: list[str]) -> list[str]:
    """Terminate the pods, again each round for those still listed (one refused call must not leave a
    pod billing); return those RunPod still lists after about 12 rounds (none, normally)."""
    left = still_listed(api, pod_ids)
    for _ in range(12):
        if not left:
            break
        for pod_id in left:
            try:
                api.terminate(pod_id)
            except RunPodError:
                pass  # refused this time, or gone meanwhile: the next check tells
        time.sleep(poll_interval())
        left = still_listed(api, left)
    return left


def poll_interval() -> float:
    return float(os.environ.get("PLSCALE_RUNPOD_POLL", "5"))


def ours(api: RunPodAPI, state: dict) -> list[str]:
    """Every pod this tool created: in the state file, or named by it in the account."""
    ids = [p["id"] for c in state["clusters"].values() for p in c["pods"]]
    return ids + [p["id"] for p in strays(api, state)]


def strays(api: RunPodAPI, state: dict) -> list[dict]:
    """Pods named by this tool in the account that the state file does not know (a lost or older one)."""
    known = {p["id"] for c in state["clusters"].values() for p in c["pods"]}
    return [p for p in api.myself().get("pods") or [] if OUR_POD.match(p.get("name") or "") and p["id"] not in known]
