"""A fake RunPod GraphQL API on 127.0.0.1, for the `plscale runpod` tests.

It speaks the request and response shapes of the real service as the spec (issue 13) writes them:
one POST per operation, `{"operationName", "query", "variables"}`, `Authorization: Bearer KEY`,
dispatched on operationName (GpuTypes, Myself, Pod, CreatePod, TerminatePod); the GraphQL text is
not parsed. A refused operation answers HTTP 200 with `{"errors": [...], "data": {FIELD: null}}`;
a bad or missing key answers HTTP 401.

What it models of the real service:
- a GPU catalog with per-GPU prices per cloud (null where that cloud lacks the GPU) and stock;
- pods whose runtime is null for a while before their ports appear (`ports_after`), or forever
  (`never_ready`); the SSH port listed twice, a private address first and the public one after,
  as the real service does, so a client must pick `isIpPublic`;
- `terminateAfter` enforced by the "server": once it has passed the pod is gone (Pod -> null, not in
  Myself.pods, not billing), as is a terminated pod; `advance(seconds)` moves the service's clock, so
  a test need not sleep through a deadline;
- costPerHr = the price of that cloud x gpuCount; the account's balance;
- the real error texts for no capacity and a balance too low; a generic error on demand.

CreatePod's input is checked strictly (required keys, types, no unknown field, cloudType, ports,
PUBLIC_KEY, gpuTypeId, terminateAfter in the future): a client bug answers a GraphQL error.

Standard library only. Use:

    with FakeRunPod() as fake:
        fake.capacity = 1
        ... PLSCALE_RUNPOD_API=fake.url RUNPOD_API_KEY=fake.key plscale runpod up ...
        assert fake.alive() == []
"""

from __future__ import annotations

import json
import secrets
import string
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

DEFAULT_KEY = "rpa_TESTKEY_do_not_leak_1234567890"

NO_CAPACITY = ("There are no longer any instances available with the requested specifications. "
               "Please refresh and try again.")
LOW_BALANCE = "Your balance is too low to deploy this pod. Add funds to continue."
GENERIC_ERROR = "Something went wrong. Please try again later or contact support."
POD_NOT_FOUND = "pod not found to terminate"

# Every GPU type of the fake: id, displayName, memoryInGb, price and stock per cloud (None: that
# cloud lacks it), and the most GPUs one pod of it can have.
CATALOG = [
    {"id": "NVIDIA H100 80GB HBM3", "displayName": "H100 SXM", "memoryInGb": 80,
     "securePrice": 2.99, "communityPrice": 2.69, "secureStock": "High", "communityStock": "Low",
     "maxGpuCount": 8},
    {"id": "NVIDIA A40", "displayName": "A40", "memoryInGb": 48,
     "securePrice": 0.40, "communityPrice": 0.35, "secureStock": "Medium", "communityStock": "High",
     "maxGpuCount": 8},
    {"id": "NVIDIA GeForce RTX 4090", "displayName": "RTX 4090", "memoryInGb": 24,
     "securePrice": None, "communityPrice": 0.34, "secureStock": None, "communityStock": "High",
     "maxGpuCount": 8},
]

REQUIRED_INPUT = {
    "name": str, "imageName": str, "gpuTypeId": str, "gpuCount": int, "cloudType": str,
    "containerDiskInGb": int, "volumeInGb": int, "volumeMountPath": str, "ports": str,
    "startSsh": bool, "supportPublicIp": bool, "env": list, "terminateAfter": str,
}
# Fields of the real PodFindAndDeployOnDemandInput a client may also send; anything else is an
# unknown field, which the real GraphQL server refuses.
OPTIONAL_INPUT = {
    "globalNetwork", "dataCenterId", "countryCode", "minVcpuCount", "minMemoryInGb", "dockerArgs",
    "templateId", "networkVolumeId", "allowedCudaVersions", "minDownload", "minUpload", "stopAfter",
    "startJupyter", "volumeKey", "deployCost", "gpuTypeIdList", "minDisk",
    "containerRegistryAuthId", "cudaVersion",
}

FIELDS = {"GpuTypes": "gpuTypes", "Myself": "myself", "Pod": "pod",
          "CreatePod": "podFindAndDeployOnDemand", "TerminatePod": "podTerminate"}


class InputError(Exception):
    """CreatePod's input is not what the real service would accept."""


def _now() -> datetime:
    return datetime.now(timezone.utc)


def parse_utc(text: str) -> datetime:
    """An ISO 8601 time with an explicit UTC offset ('Z' or +00:00); a naive time is refused."""
    when = datetime.fromisoformat(text.replace("Z", "+00:00") if text.endswith("Z") else text)
    if when.tzinfo is None or when.utcoffset().total_seconds() != 0:
        raise ValueError(f"not UTC: {text!r}")
    return when


def _pod_id() -> str:
    alphabet = string.ascii_lowercase + string.digits
    return "".join(secrets.choice(alphabet) for _ in range(14))


@dataclass
class FakePod:
    id: str
    name: str
    gpu_type: str
    gpu_count: int
    cloud: str
    cost_per_hr: float
    image: str
    terminate_after: datetime | None
    ssh: tuple[str, int]
    ports_after: int
    created: float = field(default_factory=time.time)
    queries: int = 0
    terminated: bool = False
    never_ready: bool = False

    def gone(self, now: datetime) -> bool:
        return self.terminated or (self.terminate_after is not None and now >= self.terminate_after)

    def summary(self) -> dict:
        return {"id": self.id, "name": self.name, "desiredStatus": "RUNNING",
                "costPerHr": self.cost_per_hr, "gpuCount": self.gpu_count}


class FakeRunPod:
    """The fake service. Knobs are plain attributes a test sets (also while it runs)."""

    def __init__(self, key: str = DEFAULT_KEY):
        self.key = key
        self.catalog = [dict(g) for g in CATALOG]
        self.balance = 25.0
        self.capacity: int | None = None  # how many more pods CreatePod may make; None: no limit
        self.ports_after = 1  # Pod queries per pod answering runtime null before the ports
        self.never_ready = False  # runtime stays null forever
        self.ssh_endpoints: list[tuple[str, int]] = [("127.0.0.1", 40022)]
        self.low_balance_error = False  # CreatePod answers the balance error
        self.fail_create_at: int | None = None  # index of the CreatePod call answering an error
        self.fail_terminate = 0  # how many of the next TerminatePod calls answer a generic error
        self.terminate_missing_error = True  # TerminatePod of a pod that is gone: a GraphQL error
        self.private_port_first = True  # runtime.ports lists the pod's private 22 before the public
        self.server_error = False  # every request answers HTTP 500
        self.delay = 0.0  # seconds each request waits before it is answered
        self.lose_create_answer = False  # CreatePod makes the pod, then answers HTTP 502 (a gateway timeout)
        self.unknown_fields: set[str] = set()  # CreatePod input fields this "version" of the API refuses
        self.null_myself = False  # Myself answers null (RunPod's answer to a key it does not know)
        self.clock_offset = 0.0  # seconds the service's clock is ahead of the real one (advance())

        self.requests: list[dict] = []
        self.created: list[dict] = []  # the input of each CreatePod that made a pod
        self.terminated: list[str] = []  # ids of the pods TerminatePod ended
        self.pods: dict[str, FakePod] = {}
        self.create_calls = 0
        self._made = 0  # pods made by CreatePod, for ssh_endpoints
        self._lock = threading.RLock()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # ---- life cycle ----
    def start(self) -> FakeRunPod:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):  # quiet
                pass

            def do_POST(self):
                fake._handle(self)

            def do_GET(self):
                fake._reply(self, 405, {"errors": [{"message": "use POST"}]})

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.05,), daemon=True,
                                        name="fake-runpod")
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> FakeRunPod:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    @property
    def port(self) -> int:
        assert self._server is not None, "not started"
        return self._server.server_address[1]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/graphql"

    # ---- time ----
    def now(self) -> datetime:
        """The service's clock: the real UTC time plus what advance() added."""
        return _now() + timedelta(seconds=self.clock_offset)

    def advance(self, seconds: float) -> None:
        """Let `seconds` pass at the service: pods whose terminateAfter falls before then are gone."""
        with self._lock:
            self.clock_offset += seconds

    # ---- for assertions ----
    def alive(self) -> list[str]:
        """Ids of the pods still running (billing): not terminated, terminateAfter not passed."""
        now = self.now()
        with self._lock:
            return [p.id for p in self.pods.values() if not p.gone(now)]

    def alive_names(self) -> list[str]:
        now = self.now()
        with self._lock:
            return [p.name for p in self.pods.values() if not p.gone(now)]

    def ops(self) -> list[str]:
        """The operationName of every request, in order."""
        with self._lock:
            return [r["operationName"] for r in self.requests]

    def add_pod(self, name: str, gpu_type: str = "NVIDIA A40", gpu_count: int = 1,
                cloud: str = "SECURE", terminate_after: datetime | None = None,
                ssh: tuple[str, int] = ("127.0.0.1", 40099), ready: bool = True) -> str:
        """A pod the account has that no CreatePod of this test made (a lost state file's pod)."""
        gpu = self._gpu(gpu_type)
        price = gpu["securePrice" if cloud == "SECURE" else "communityPrice"] or 1.0
        pod = FakePod(id=_pod_id(), name=name, gpu_type=gpu_type, gpu_count=gpu_count, cloud=cloud,
                      cost_per_hr=round(price * gpu_count, 4), image="runpod/pytorch:seeded",
                      terminate_after=terminate_after, ssh=ssh, ports_after=0 if ready else 10**9)
        with self._lock:
            self.pods[pod.id] = pod
        return pod.id

    # ---- HTTP ----
    def _reply(self, handler: BaseHTTPRequestHandler, status: int, body, content_type="application/json"):
        data = (json.dumps(body) if not isinstance(body, str) else body).encode()
        handler.send_response(status)
        handler.send_header("Content-Type", content_type)
        handler.send_header("Content-Length", str(len(data)))
        handler.end_headers()
        handler.wfile.write(data)

    def _handle(self, handler: BaseHTTPRequestHandler) -> None:
        length = int(handler.headers.get("Content-Length") or 0)
        raw = handler.rfile.read(length).decode("utf-8", "replace")
        try:
            body = json.loads(raw)
        except ValueError:
            body = None
        record = {"operationName": body.get("operationName") if isinstance(body, dict) else None,
                  "variables": body.get("variables") if isinstance(body, dict) else None,
                  "headers": dict(handler.headers.items()), "body": raw, "path": handler.path}
        with self._lock:
            self.requests.append(record)
        if self.delay:
            time.sleep(self.delay)
        if self.server_error:
            return self._reply(handler, 500, "Internal Server Error", "text/plain")
        if handler.headers.get("Authorization") != f"Bearer {self.key}":
            return self._reply(handler, 401, {"errors": [{"message": "Unauthorized"}]})
        if handler.path.split("?")[0] != "/graphql":
            return self._reply(handler, 404, "Not Found", "text/plain")
        if not isinstance(body, dict) or not isinstance(body.get("query"), str):
            return self._reply(handler, 400, {"errors": [{"message": "Must provide query string."}]})
        op = body.get("operationName")
        variables = body.get("variables") or {}
        if op not in FIELDS:
            return self._reply(handler, 400, {"errors": [{"message": f"Unknown operation {op!r}"}]})
        if not isinstance(variables, dict):
            return self._reply(handler, 400, {"errors": [{"message": "variables must be an object"}]})
        try:
            with self._lock:
                result = getattr(self, "_op_" + op)(variables)
        except InputError as e:
            return self._reply(handler, 400, self._error(op, str(e), "GRAPHQL_VALIDATION_FAILED"))
        if isinstance(result, tuple):  # (error message, code)
            return self._reply(handler, 200, self._error(op, *result))
        if op == "CreatePod" and self.lose_create_answer:
            return self._reply(handler, 502, "Bad Gateway", "text/plain")
        if op == "Myself" and self.null_myself:
            result = None
        return self._reply(handler, 200, {"data": {FIELDS[op]: result}})

    @staticmethod
    def _error(op: str, message: str, code: str = "INTERNAL_SERVER_ERROR") -> dict:
        return {"errors": [{"message": message, "path": [FIELDS[op]], "extensions": {"code": code}}],
                "data": {FIELDS[op]: None}}

    # ---- operations (called with the lock held) ----
    def _gpu(self, gpu_type: str) -> dict:
        for gpu in self.catalog:
            if gpu["id"] == gpu_type:
                return gpu
        raise InputError(f"There is no GPU type {gpu_type!r}.")

    def _op_GpuTypes(self, variables: dict):
        count = variables.get("count", 1)
        if not isinstance(count, int) or isinstance(count, bool) or count < 1:
            raise InputError(f"Variable \"$count\" got invalid value {count!r}; Int expected.")
        out = []
        for g in self.catalog:
            fits = count <= g["maxGpuCount"]
            out.append({
                "id": g["id"], "displayName": g["displayName"], "memoryInGb": g["memoryInGb"],
                "secureCloud": g["securePrice"] is not None,
                "communityCloud": g["communityPrice"] is not None,
                "securePrice": g["securePrice"], "communityPrice": g["communityPrice"],
                "secure": {"stockStatus": g["secureStock"] if fits else None},
                "community": {"stockStatus": g["communityStock"] if fits else None},
            })
        return out

    def _op_Myself(self, variables: dict):
        now = self.now()
        pods = [p.summary() for p in self.pods.values() if not p.gone(now)]
        return {"id": "user_1", "clientBalance": self.balance, "pods": pods}

    def _op_Pod(self, variables: dict):
        pod_id = variables.get("podId")
        if not isinstance(pod_id, str):
            raise InputError("Variable \"$podId\" of required type \"String!\" was not provided.")
        pod = self.pods.get(pod_id)
        if pod is None or pod.gone(self.now()):
            return None
        pod.queries += 1
        out = pod.summary()
        if self.never_ready or pod.never_ready or pod.queries <= pod.ports_after:
            out["runtime"] = None
            return out
        host, port = pod.ssh
        public = {"ip": host, "isIpPublic": True, "privatePort": 22, "publicPort": port, "type": "tcp"}
        private = {"ip": f"10.65.0.{2 + list(self.pods).index(pod.id) % 250}",
                   "isIpPublic": False, "privatePort": 22, "publicPort": 22, "type": "tcp"}
        ports = [private, public] if self.private_port_first else [public, private]
        out["runtime"] = {"uptimeInSeconds": int(time.time() - pod.created), "ports": ports}
        return out

    def _check_input(self, inp) -> None:
        if not isinstance(inp, dict):
            raise InputError("Variable \"$input\" of required type "
                             "\"PodFindAndDeployOnDemandInput!\" was not provided.")
        for key, kind in REQUIRED_INPUT.items():
            if key not in inp or inp[key] is None:
                raise InputError(f"CreatePod input lacks {key!r}")
            value = inp[key]
            if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
                raise InputError(f"CreatePod input {key!r} must be {kind.__name__}, got {value!r}")
        unknown = set(inp) - set(REQUIRED_INPUT) - OPTIONAL_INPUT
        if unknown:
            raise InputError(f"Field {min(unknown)!r} is not defined by type "
                             "\"PodFindAndDeployOnDemandInput\".")
        if inp["cloudType"] not in ("SECURE", "COMMUNITY"):
            raise InputError(f"cloudType must be SECURE or COMMUNITY, got {inp['cloudType']!r}")
        gpu = self._gpu(inp["gpuTypeId"])
        if not 1 <= inp["gpuCount"] <= gpu["maxGpuCount"]:
            raise InputError(f"gpuCount must be 1..{gpu['maxGpuCount']}, got {inp['gpuCount']}")
        if inp["containerDiskInGb"] < 1 or inp["volumeInGb"] < 0:
            raise InputError("containerDiskInGb must be >= 1 and volumeInGb >= 0")
        if not inp["name"] or not inp["imageName"]:
            raise InputError("name and imageName must not be empty")
        if not inp["volumeMountPath"].startswith("/"):
            raise InputError(f"volumeMountPath must be absolute, got {inp['volumeMountPath']!r}")
        if "22/tcp" not in [p.strip() for p in inp["ports"].split(",")]:
            raise InputError(f"ports must include 22/tcp, got {inp['ports']!r}")
        if inp["startSsh"] is not True or inp["supportPublicIp"] is not True:
            raise InputError("startSsh and supportPublicIp must be true for SSH over a public IP")
        env = inp["env"]
        if not all(isinstance(e, dict) and set(e) == {"key", "value"} and isinstance(e["key"], str)
                   and isinstance(e["value"], str) for e in env):
            raise InputError(f"env must be a list of {{key, value}} strings, got {env!r}")
        keys = [e["value"] for e in env if e["key"] == "PUBLIC_KEY"]
        if len(keys) != 1 or not keys[0].startswith("ssh-"):
            raise InputError("env must hold one PUBLIC_KEY starting with 'ssh-'")
        if "globalNetwork" in inp and not isinstance(inp["globalNetwork"], bool):
            raise InputError(f"globalNetwork must be a boolean, got {inp['globalNetwork']!r}")
        try:
            deadline = parse_utc(inp["terminateAfter"])
        except ValueError:
            raise InputError(f"terminateAfter is not an ISO 8601 UTC time: {inp['terminateAfter']!r}")
        if deadline <= self.now():
            raise InputError(f"terminateAfter is in the past: {inp['terminateAfter']!r}")

    def _op_CreatePod(self, variables: dict):
        index = self.create_calls
        self.create_calls += 1
        inp = variables.get("input")
        self._check_input(inp)
        for name in self.unknown_fields & set(inp):
            raise InputError(f'Variable "$input" got invalid value; Field "{name}" is not defined by type '
                             f'"PodFindAndDeployOnDemandInput".')
        if self.fail_create_at is not None and index == self.fail_create_at:
            return (GENERIC_ERROR, "INTERNAL_SERVER_ERROR")
        gpu = self._gpu(inp["gpuTypeId"])
        secure = inp["cloudType"] == "SECURE"
        price = gpu["securePrice" if secure else "communityPrice"]
        stock = gpu["secureStock" if secure else "communityStock"]
        if price is None or stock is None or (self.capacity is not None and self.capacity <= 0):
            return (NO_CAPACITY, "INTERNAL_SERVER_ERROR")
        cost = round(price * inp["gpuCount"], 4)
        if self.low_balance_error or self.balance < cost:
            return (LOW_BALANCE, "INTERNAL_SERVER_ERROR")
        endpoints = self.ssh_endpoints or [("127.0.0.1", 40022)]
        ssh = tuple(endpoints[self._made % len(endpoints)])
        self._made += 1
        if self.capacity is not None:
            self.capacity -= 1
        pod = FakePod(id=_pod_id(), name=inp["name"], gpu_type=gpu["id"], gpu_count=inp["gpuCount"],
                      cloud=inp["cloudType"], cost_per_hr=cost, image=inp["imageName"],
                      terminate_after=parse_utc(inp["terminateAfter"]), ssh=ssh,
                      ports_after=self.ports_after)
        self.pods[pod.id] = pod
        self.created.append(json.loads(json.dumps(inp)))
        return {"id": pod.id, "name": pod.name, "desiredStatus": "RUNNING", "costPerHr": cost,
                "imageName": pod.image, "machineId": "m_" + pod.id[:8]}

    def _op_TerminatePod(self, variables: dict):
        inp = variables.get("input")
        if not isinstance(inp, dict) or not isinstance(inp.get("podId"), str):
            raise InputError("Variable \"$input\" of required type \"PodTerminateInput!\" "
                             "was not provided.")
        if self.fail_terminate > 0:
            self.fail_terminate -= 1
            return (GENERIC_ERROR, "INTERNAL_SERVER_ERROR")
        pod = self.pods.get(inp["podId"])
        if pod is None or pod.gone(self.now()):
            if self.terminate_missing_error:
                return (POD_NOT_FOUND, "INTERNAL_SERVER_ERROR")
            return None
        pod.terminated = True
        self.terminated.append(pod.id)
        return None
