"""A fake RunPod REST API (v2) on 127.0.0.1, for the `plscale runpod` tests.

It speaks RunPod's published OpenAPI 3.1 document, as vendored in
tests/fixtures/runpod/openapi-v2-subset.json (tests/helpers/vendor_runpod_openapi.py; the
operations the client uses: the GPU catalog, pods, pod actions, clusters, the account's SSH keys),
and checks both sides of every exchange against it with jsonschema's Draft202012Validator:

- a request to a path or method the document lacks answers 404 / 405; an undeclared or invalid
  query parameter (form style: `a,b` arrays, `true`/`false`, integers) or a body that breaks the
  operation's requestBody schema answers 422 problem+json {"title", "status", "detail", "errors"};
  a documented cross-field rule the schema cannot say answers 400 (exactly one of gpu or cpu, one
  kind of mount, include=AVAILABILITY needs product, ...). Each of these lands in
  `fake.violations` (a 400 for no capacity does not: that is not the client's fault);
- every response the fake sends is validated against the schema declared for its status (else
  "default"; 204: no body), content type and declared headers too; a mismatch is the fake's own bug
  and lands in `fake.response_violations`. `fake.check()` raises if either list is non-empty.

What it models of the real service (the operations' descriptions in the document):
- a GPU catalog with per-cloud prices and ceilings; availability (NONE/LOW/MEDIUM/HIGH) per
  (GPU, cloud, product) only with include=AVAILABILITY&product=..., NONE where the cloud lacks the
  GPU or `count` is over its maxCount;
- pods that answer PROVISIONING on create and advance on each GET of them (GET /v2/pods/{id}, or
  GET /v2/clusters/{id}/pods for members): STARTING (ssh.proxy set) and, after `ports_after` GETs,
  RUNNING with ssh.direct and runtime.ports from `ssh_endpoints` (only where "22/tcp" is in ports);
  `cost` = price x count, 0 once EXITED or TERMINATED; DELETE or the terminate action ends a pod
  (404 afterwards, gone from listPods); stop/start/restart as documented, 409 for an action not in
  the pod's `actions`;
- clusters of podCount member pods (rank 0 the primary; SLURM/RAY roles), whose members the pod
  endpoints refuse to delete or act on (409) and listPods hides unless includeClusterPods=true;
- the account's SSH keys (GET/PUT) and startSsh putting them into the pod's env as PUBLIC_KEY;
- keys: the account key, and one pod-scoped key per pod (`pod_key(id)`, like RUNPOD_API_KEY inside
  a pod) that may only read, delete and act on its own pod (and delete its own cluster); 401 for a
  missing or unknown key, 403 for a refused one; with `environ_dir` set, each pod's container
  environment (its env, RUNPOD_POD_ID, RUNPOD_API_KEY = its pod key) is written there;
- no capacity (400, `capacity`, availability NONE), and trouble on demand: 500s, a lost create
  answer (502 from the "gateway", the pod made all the same), 429 with Retry-After, a delay.

Knobs are plain attributes a test sets (also while it runs); see FakeRunPod.__init__. Standard
library plus jsonschema. Use:

    with FakeRunPod() as fake:
        fake.capacity = 1
        ... PLSCALE_RUNPOD_API=fake.url RUNPOD_API_KEY=fake.key plscale runpod up ...
        assert fake.alive() == []
        fake.check()  # the client sent nothing the schema refuses; the fake answered to schema
"""

from __future__ import annotations

import copy
import json
import re
import secrets
import string
import threading
import time
import traceback
from dataclasses import dataclass, field
from datetime import datetime, timezone
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit

from jsonschema import Draft202012Validator
from jsonschema.exceptions import best_match

SCHEMA_PATH = Path(__file__).resolve().parents[1] / "fixtures" / "runpod" / "openapi-v2-subset.json"
DEFAULT_KEY = "rpa_TESTKEY_do_not_leak_1234567890"

NO_CAPACITY = "Could not place the pod: no capacity for GPU type {gpu} in {cloud} cloud."
LOW_BALANCE = "Your balance is too low to deploy this pod. Add funds to continue."
GENERIC_ERROR = "Something went wrong. Please try again later or contact support."
IN_CLUSTER = ("Pod belongs to a cluster and cannot be {what} via the pod endpoints; "
              "delete the cluster via DELETE /v2/clusters/{cluster}.")

LEVELS = ["NONE", "LOW", "MEDIUM", "HIGH"]  # AvailabilityLevel, worst first
PRODUCTS = ["POD", "CLUSTER", "SERVERLESS"]
CLOUDS = ["SECURE", "COMMUNITY"]
CUDA = "12.8"  # the one CUDA version the fake's machines report
# The data center each cloud places pods in: (id, name, ISO country).
DATA_CENTERS = {"SECURE": ("US-KS-2", "US Kansas 2", "US"),
                "COMMUNITY": ("EU-RO-1", "Europe Romania 1", "RO")}
PROXY_HOST = "ssh.runpod.io"

# GpuType objects as listGpuTypes answers them (without availability). A cloud that lacks the GPU
# has secure/community false, price 0 and maxCount 0 there (the schema wants numbers).
CATALOG = [
    {"id": "NVIDIA H100 80GB HBM3", "name": "H100 SXM", "pool": "HOPPER_80", "manufacturer": "NVIDIA",
     "memory": 80, "secure": True, "community": True, "price": {"secure": 2.99, "community": 2.69},
     "maxCount": {"secure": 8, "community": 8}},
    {"id": "NVIDIA A40", "name": "A40", "pool": "AMPERE_48", "manufacturer": "NVIDIA",
     "memory": 48, "secure": True, "community": True, "price": {"secure": 0.40, "community": 0.35},
     "maxCount": {"secure": 8, "community": 8}},
    {"id": "NVIDIA GeForce RTX 4090", "name": "RTX 4090", "pool": "ADA_24", "manufacturer": "NVIDIA",
     "memory": 24, "secure": False, "community": True, "price": {"secure": 0, "community": 0.34},
     "maxCount": {"secure": 0, "community": 8}},
]
CPU_PRICE = 0.06  # USD per vCPU per hour, for CPU pods
CPU_MEMORY_PER_VCPU = 2  # GB

ACTIONS = {"PROVISIONING": ["stop", "terminate"], "STARTING": ["stop", "terminate"],
           "RUNNING": ["stop", "restart", "terminate"], "EXITED": ["start", "terminate"],
           "ERROR": ["start", "terminate"], "TERMINATED": []}
ROLES = {"SLURM": ("SLURM_CONTROLLER", "SLURM_COMPUTE"), "RAY": ("RAY_HEAD", "RAY_WORKER")}


def parse_utc(text: str) -> datetime:
    """An ISO 8601 time with an explicit UTC offset ('Z' or +00:00); a naive time is refused."""
    when = datetime.fromisoformat(text[:-1] + "+00:00" if text.endswith("Z") else text)
    if when.tzinfo is None or when.utcoffset().total_seconds() != 0:
        raise ValueError(f"not UTC: {text!r}")
    return when


def _stamp() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _new_id() -> str:
    alphabet = string.ascii_lowercase + string.digits
    return "".join(secrets.choice(alphabet) for _ in range(14))


# ---------------------------------------------------------------- the OpenAPI document


class OpenApi:
    """The vendored document: routes, parameters, and cached Draft 2020-12 validators."""

    def __init__(self, doc: dict):
        self.doc = doc
        self.components = doc.get("components", {})
        self._validators: dict[int, Draft202012Validator] = {}
        self.routes: list[tuple[re.Pattern, str, dict]] = []
        for template, item in doc["paths"].items():
            parts = []
            for segment in template.strip("/").split("/"):
                name = re.fullmatch(r"\{(\w+)\}", segment)
                parts.append(f"(?P<{name.group(1)}>[^/]+)" if name else re.escape(segment))
            self.routes.append((re.compile("^/" + "/".join(parts) + "$"), template, item))
        # literal segments win over templated ones
        self.routes.sort(key=lambda r: r[1].count("{"))

    def deref(self, node):
        """Follow `#/components/...` references until a plain object."""
        while isinstance(node, dict) and "$ref" in node:
            parts = node["$ref"].split("/")
            assert parts[:2] == ["#", "components"], node["$ref"]
            node = self.components[parts[2]][parts[3]]
        return node

    def route(self, path: str):
        """(template, path item, path parameters), or None when no path matches."""
        for pattern, template, item in self.routes:
            match = pattern.match(path)
            if match:
                return template, item, {k: unquote(v) for k, v in match.groupdict().items()}
        return None

    @staticmethod
    def methods(item: dict) -> list[str]:
        return [m for m in ("get", "put", "post", "delete", "patch") if m in item]

    def parameters(self, item: dict, op: dict) -> dict[tuple[str, str], dict]:
        """{(in, name): parameter} of the operation, path-level ones overridden by its own."""
        out = {}
        for param in item.get("parameters", []) + op.get("parameters", []):
            param = self.deref(param)
            out[(param["in"], param["name"])] = param
        return out

    def errors(self, schema: dict, value, prefix: str = "$") -> list[str]:
        """Why `value` does not validate against `schema` (empty: it does)."""
        validator = self._validators.get(id(schema))
        if validator is None:
            # refs are `#/components/...`: resolve them against a wrapper holding the components
            validator = Draft202012Validator({**schema, "components": self.components})
            self._validators[id(schema)] = validator
        out = []
        for err in sorted(validator.iter_errors(value), key=lambda e: list(e.absolute_path)):
            where = prefix + err.json_path[1:]
            text = f"{where}: {err.message}"
            if err.validator == "unevaluatedProperties" and isinstance(err.instance, dict):
                # A failing allOf branch drops its annotations, so 2020-12 also calls the fields
                # that branch declares "unevaluated": name only the ones no branch declares.
                extra = sorted(set(err.instance) - self._declared(err.schema))
                if not extra:
                    continue
                text = (f"{where}: Unevaluated properties are not allowed ("
                        f"{', '.join(map(repr, extra))} {'was' if len(extra) == 1 else 'were'} unexpected)")
            if err.context:
                sub = best_match(err.context)
                text += f" ({prefix + sub.json_path[1:]}: {sub.message})"
            out.append(text)
        return out

    def _declared(self, schema) -> set[str]:
        """The property names `schema` declares, through $ref and the applicators."""
        schema = self.deref(schema)
        if not isinstance(schema, dict):
            return set()
        names = set(schema.get("properties", {}))
        for key in ("allOf", "anyOf", "oneOf"):
            for sub in schema.get(key, []):
                names |= self._declared(sub)
        for key in ("then", "else"):
            if key in schema:
                names |= self._declared(schema[key])
        return names

    def schema(self, name: str) -> dict:
        return self.components["schemas"][name]


_SPEC: OpenApi | None = None


def spec() -> OpenApi:
    """The vendored document, loaded once per process."""
    global _SPEC
    if _SPEC is None:
        _SPEC = OpenApi(json.loads(SCHEMA_PATH.read_text(encoding="utf-8")))
    return _SPEC


def _scalar(kind, text: str):
    """A query value as the type its schema names; left a string when it is not one."""
    if kind == "boolean":
        return {"true": True, "false": False}.get(text, text)
    if kind == "integer" and re.fullmatch(r"-?\d+", text):
        return int(text)
    if kind == "number" and re.fullmatch(r"-?\d+(\.\d+)?([eE][-+]?\d+)?", text):
        return float(text)
    return text


# ---------------------------------------------------------------- the service's state


class ApiError(Exception):
    """An error answer: problem+json ErrorResponse. `violation`: the request broke a documented rule."""

    def __init__(self, status: int, detail: str, errors: list[str] | None = None,
                 violation: bool = False, headers: dict | None = None):
        super().__init__(detail)
        self.status, self.detail, self.errors = status, detail, errors
        self.violation, self.headers = violation, headers or {}


@dataclass
class FakePod:
    id: str
    name: str
    image: str
    cloud: str
    price: float  # per GPU (per vCPU for a CPU pod) per hour
    gpu: dict | None  # {"id", "count"}; None for a CPU pod
    cpu: dict | None  # {"id", "vcpuCount", "memory"}; None for a GPU pod
    env: dict
    ports: list
    mounts: dict
    ssh_endpoint: tuple  # (host, port) of ssh.direct once RUNNING
    key: str  # this pod's own API key
    args: str = ""
    disk: int = 50
    registry: str | None = None
    global_networking: bool = False
    start_ssh: bool = False
    public_key: str | None = None  # the PUBLIC_KEY its env got (None: none, so no SSH access)
    cluster_id: str | None = None
    rank: int | None = None
    role: str | None = None
    cluster_ip: str | None = None
    data_center: str = "US-KS-2"
    status: str = "PROVISIONING"
    gets: int = 0  # GETs that advanced it since it was made (or started)
    gets_after_end: int = 0  # GETs answered TERMINATED (terminated_visible)
    never_ready: bool = False
    created_at: str = field(default_factory=_stamp)
    started_at: str | None = None
    started: float | None = None  # time.monotonic() of RUNNING, for uptime
    proxy_user: str = ""

    @property
    def units(self) -> int:
        return self.gpu["count"] if self.gpu else self.cpu["vcpuCount"]

    @property
    def cost(self) -> float:
        if self.status in ("EXITED", "TERMINATED"):
            return 0.0
        return round(self.price * self.units, 4)

    @property
    def gone(self) -> bool:
        return self.status == "TERMINATED"

    @property
    def actions(self) -> list[str]:
        # cluster members are managed through the cluster: no pod-endpoint action applies
        return [] if self.cluster_id else list(ACTIONS[self.status])


@dataclass
class FakeCluster:
    id: str
    name: str
    type: str
    compute: dict  # ClusterCompute as sent
    pod_ids: list[str]  # in rank order
    data_center: str = "US-KS-2"
    vxlan_id: int = 42
    deleted: bool = False
    created_at: str = field(default_factory=_stamp)


# ---------------------------------------------------------------- the fake service


class FakeRunPod:
    """The fake service. Knobs are plain attributes a test sets (also while it runs)."""

    def __init__(self, key: str = DEFAULT_KEY):
        self.key = key  # the account's API key
        self.catalog: list[dict] = copy.deepcopy(CATALOG)  # GpuType objects, without availability
        # (gpu id, "SECURE"|"COMMUNITY", "POD"|"CLUSTER"|"SERVERLESS") -> AvailabilityLevel; a key
        # not here is NONE, as is a cloud lacking the GPU or a count over its maxCount
        self.availability: dict[tuple[str, str, str], str] = {
            (g["id"], cloud, product): "HIGH" if cloud == "SECURE" else "MEDIUM"
            for g in CATALOG for cloud in CLOUDS for product in PRODUCTS}
        self.capacity: int | None = None  # pods that may still be made (a cluster: podCount); None: any
        self.ports_after = 1  # GETs of a pod answering STARTING before it is RUNNING
        self.never_ready = False  # every pod stays STARTING forever
        self.never_ready_nodes: set[int] = set()  # cluster members of these ranks stay STARTING
        self.ssh_endpoints: list[tuple[str, int]] = [("127.0.0.1", 40022)]  # round robin, by creation
        self.ssh_keys: list[str] = []  # the account's registered SSH public keys
        self.terminated_visible = False  # a terminated pod answers GET with TERMINATED for a while...
        self.terminated_visible_gets = 3  # ...this many GETs, then 404
        self.pod_key_may_delete_cluster = True  # a member's pod key may DELETE its own cluster
        self.fail_create = 0  # the next N creates (pod or cluster) answer 500, making nothing
        self.lose_create_answer = False  # a create makes its pod/cluster, then answers 502 (text)
        self.fail_delete = 0  # the next N deletes (pod, cluster, terminate action) answer 500
        self.rate_limit = 0  # the next N authenticated requests answer 429
        self.retry_after = 1  # seconds, the 429's Retry-After (an integer, per the schema)
        self.server_error = False  # every request answers 500
        self.forbidden = False  # the account key answers 403 on everything
        self.low_balance = False  # creates answer 402 (insufficient balance)
        self.delay = 0.0  # seconds each request waits before it is answered
        # where each pod's container environment is written as environ_dir/<pod id> (NUL-separated
        # KEY=VALUE, like /proc/1/environ): its env, RUNPOD_POD_ID, RUNPOD_API_KEY (its pod key), ...
        self.environ_dir: Path | None = None

        # records
        self.requests: list[dict] = []  # {method, path, query, body, key, status, op, headers}
        self.violations: list[str] = []  # requests the schema (or a documented rule) refuses
        self.response_violations: list[str] = []  # answers of the fake that break the schema
        self.pods: dict[str, FakePod] = {}  # every pod ever made, terminated ones too
        self.clusters: dict[str, FakeCluster] = {}  # every cluster ever made, deleted ones too
        self.terminated: list[str] = []  # ids of pods ended, in order
        self.created: list[dict] = []  # {"kind": "pod"|"cluster", "id", "body"} of each create that made one
        self._pod_keys: dict[str, str] = {}  # pod key -> pod id
        self._made = 0  # pods made by creates, for ssh_endpoints' round robin
        self._lock = threading.RLock()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self.spec = spec()

    # ---- life cycle ----
    def start(self) -> FakeRunPod:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):  # quiet
                pass

            def do_GET(self):
                fake._handle(self)

            do_POST = do_PUT = do_DELETE = do_PATCH = do_OPTIONS = do_GET

        class Server(ThreadingHTTPServer):
            daemon_threads = True
            request_queue_size = 128  # the default 5 drops concurrent connects for a second

        self._server = Server(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.01,), daemon=True,
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
        """The API's base; the client appends /v2/..."""
        return f"http://127.0.0.1:{self.port}"

    # ---- for assertions ----
    def check(self) -> None:
        """Raise AssertionError if a request broke the schema or an answer of the fake did."""
        with self._lock:
            lines = ([f"request: {v}" for v in self.violations]
                     + [f"response (the fake's bug): {v}" for v in self.response_violations])
        if lines:
            raise AssertionError("RunPod schema violations:\n  " + "\n  ".join(lines))

    def alive(self) -> list[str]:
        """Ids of the pods that still exist (not TERMINATED): EXITED ones and cluster members too."""
        with self._lock:
            return [p.id for p in self.pods.values() if not p.gone]

    def alive_names(self) -> list[str]:
        with self._lock:
            return [p.name for p in self.pods.values() if not p.gone]

    def billing(self) -> list[str]:
        """Ids of the pods that cost money now (cost > 0)."""
        with self._lock:
            return [p.id for p in self.pods.values() if p.cost > 0]

    def clusters_alive(self) -> list[str]:
        with self._lock:
            return [c.id for c in self.clusters.values() if not c.deleted]

    def ops(self) -> list[str]:
        """The operationId of every request ("?" where none matched), in order."""
        with self._lock:
            return [r["op"] or "?" for r in self.requests]

    def pod_key(self, pod_id: str) -> str:
        """The pod's own API key (RunPod's RUNPOD_API_KEY inside the pod)."""
        with self._lock:
            return self.pods[pod_id].key

    def delete_pod(self, pod_id: str) -> None:
        """End a pod out of band, as from RunPod's console (no request; a cluster member too)."""
        with self._lock:
            if not self.pods[pod_id].gone:
                self._end(self.pods[pod_id])

    def delete_cluster(self, cluster_id: str) -> None:
        """Delete a cluster and its members out of band, as from RunPod's console."""
        with self._lock:
            cluster = self.clusters[cluster_id]
            for pod_id in cluster.pod_ids:
                self.delete_pod(pod_id)
            cluster.deleted = True

    def add_pod(self, name: str, gpu_type: str = "NVIDIA A40", gpu_count: int = 1,
                cloud: str = "SECURE", ssh: tuple[str, int] = ("127.0.0.1", 40099),
                ready: bool = True, env: dict | None = None, ports=("22/tcp",),
                image: str = "runpod/pytorch:seeded") -> str:
        """A pod the account has that no create of this test made (a lost state file's pod)."""
        with self._lock:
            gpu = self._gpu(gpu_type)
            if gpu is None:
                raise ValueError(f"no GPU type {gpu_type!r} in the catalog")
            pod = self._new_pod(name=name, image=image, cloud=cloud,
                                price=gpu["price"][cloud.lower()] or 1.0,
                                gpu={"id": gpu_type, "count": gpu_count}, cpu=None,
                                env=dict(env or {}), ports=list(ports), mounts={}, ssh=tuple(ssh))
            if ready:
                self._run(pod)
            return pod.id

    def add_cluster(self, name: str, pod_count: int = 2, gpu_type: str = "NVIDIA H100 80GB HBM3",
                    gpu_count: int = 8, type: str = "TRAINING", ready: bool = True,
                    ssh: list[tuple[str, int]] | None = None, ports=("22/tcp",),
                    image: str = "runpod/pytorch:seeded") -> str:
        """A cluster the account has that no create of this test made; its members' ssh.direct is
        ssh[rank] (default 127.0.0.1:40100+rank)."""
        with self._lock:
            body = {"name": name, "type": type, "image": image, "ports": list(ports),
                    "compute": {"gpuTypeId": gpu_type, "gpuCountPerPod": gpu_count, "podCount": pod_count}}
            endpoints = ssh or [("127.0.0.1", 40100 + rank) for rank in range(pod_count)]
            gpu = self._gpu(gpu_type)
            if gpu is None:
                raise ValueError(f"no GPU type {gpu_type!r} in the catalog")
            cluster = self._new_cluster(body, gpu, endpoints)
            if ready:
                for pod_id in cluster.pod_ids:
                    self._run(self.pods[pod_id])
            return cluster.id

    # ---- HTTP ----
    def _handle(self, handler: BaseHTTPRequestHandler) -> None:
        method = handler.command
        url = urlsplit(handler.path)
        length = int(handler.headers.get("Content-Length") or 0)
        raw = handler.rfile.read(length) if length else b""
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = None
        query = {k: v[0] if len(v) == 1 else v
                 for k, v in parse_qs(url.query, keep_blank_values=True).items()}
        auth = handler.headers.get("Authorization")
        record = {"method": method, "path": url.path, "query": query, "body": body,
                  "raw": raw.decode("utf-8", "replace"), "key": self._key_label(auth), "status": None,
                  "op": None, "headers": dict(handler.headers.items())}
        with self._lock:
            self.requests.append(record)
        if self.delay:
            time.sleep(self.delay)
        with self._lock:
            ctx: dict = {}
            try:
                status, out, headers = self._answer(method, url.path, url.query, raw, handler.headers, record,
                                                    ctx)
            except ApiError as e:
                status, out, headers = e.status, self._problem(e.status, e.detail, e.errors), e.headers
                if e.violation:
                    self.violations.append(f"{method} {handler.path}: {status} {e.detail}"
                                           + (f" {e.errors}" if e.errors else ""))
            except Exception:  # a bug of the fake: say so, loudly
                status, out, headers = 500, self._problem(500, "fake crashed"), {}
                self.response_violations.append(f"{method} {handler.path}: fake crashed:\n"
                                                + traceback.format_exc())
            record["status"] = status
            if isinstance(out, str):  # a gateway's answer, not the API's: nothing to validate
                data, content_type = out.encode(), "text/plain"
            else:
                content_type = "application/problem+json" if status >= 400 else "application/json"
                data = b"" if out is None else json.dumps(out).encode()
                self._check_response(method, handler.path, ctx.get("op"), status, content_type, out, headers)
        handler.send_response(status)
        for name, value in headers.items():
            handler.send_header(name, value)
        if status != 204:
            handler.send_header("Content-Type", content_type)
            handler.send_header("Content-Length", str(len(data)))
        handler.end_headers()
        if status != 204:
            handler.wfile.write(data)

    def _key_label(self, auth: str | None) -> str | None:
        """'account', 'pod:<id>', 'unknown' (a key the fake does not know), None (no bearer key)."""
        if not auth or not auth.startswith("Bearer "):
            return None
        token = auth[len("Bearer "):]
        if token == self.key:
            return "account"
        with self._lock:
            pod_id = self._pod_keys.get(token)
        return f"pod:{pod_id}" if pod_id else "unknown"

    @staticmethod
    def _problem(status: int, detail: str, errors: list[str] | None = None) -> dict:
        out = {"title": HTTPStatus(status).phrase, "status": status, "detail": detail}
        if errors is not None:
            out["errors"] = errors
        return out

    def _answer(self, method, path, query_text, raw, headers, record, ctx):
        """(status, body, headers) for one request; raises ApiError. ctx["op"]: the operation
        matched, for checking the answer. Lock held."""
        if self.server_error:
            raise ApiError(500, GENERIC_ERROR)
        found = self.spec.route(path)
        if found is None:
            raise ApiError(404, f"no such path: {path}", violation=True)
        template, item, path_params = found
        allowed = self.spec.methods(item)
        if method.lower() not in allowed:
            raise ApiError(405, f"The requested method is not allowed for this path ({method} {template}).",
                           violation=True, headers={"Allow": ", ".join(m.upper() for m in allowed)})
        op = ctx["op"] = item[method.lower()]
        record["op"] = op["operationId"]

        label = record["key"]
        if label is None:
            raise ApiError(401, "missing bearer token")
        if label == "unknown":
            raise ApiError(401, "invalid bearer token")
        if self.rate_limit > 0:
            self.rate_limit -= 1
            raise ApiError(429, "rate limit exceeded for the minute window", headers={
                "Retry-After": str(self.retry_after),
                "RateLimit": f'"minute";r=0;t={self.retry_after}',
                "RateLimit-Policy": '"minute";q=60;w=60, "hour";q=3000;w=3600, "day";q=50000;w=86400'})
        if label == "account" and self.forbidden:
            raise ApiError(403, "access denied")
        if label.startswith("pod:"):
            self._authorize_pod_key(label[4:], op["operationId"], path_params.get("id"))

        query = self._validate_query(item, op, query_text, path_params)
        body = self._validate_body(op, raw, headers)
        handler = getattr(self, "_op_" + op["operationId"])
        status, out = handler(path_params, query, body)
        return status, out, {}

    def _authorize_pod_key(self, pod_id: str, op_id: str, target: str | None) -> None:
        pod = self.pods[pod_id]
        if op_id in ("getPod", "deletePod", "podAction") and target == pod_id:
            return
        if (op_id == "deleteCluster" and self.pod_key_may_delete_cluster and pod.cluster_id
                and target == pod.cluster_id):
            return
        raise ApiError(403, "access denied")

    def _validate_query(self, item, op, query_text, path_params) -> dict:
        params = self.spec.parameters(item, op)
        errors = []
        for (where, name), param in params.items():
            if where == "path":
                errors += self.spec.errors(param["schema"], path_params.get(name), f"path.{name}")
        values: dict = {}
        for name, given in parse_qs(query_text, keep_blank_values=True).items():
            param = params.get(("query", name))
            if param is None:
                errors.append(f"query.{name}: unknown query parameter (this operation takes: "
                              f"{', '.join(n for w, n in params if w == 'query') or 'none'})")
                continue
            schema = self.spec.deref(param["schema"])
            kind = schema.get("type")
            explode = param.get("explode", param.get("style", "form") == "form")
            if kind == "array":
                item_kind = self.spec.deref(schema.get("items", {})).get("type")
                if not explode and len(given) > 1:
                    errors.append(f"query.{name}: given {len(given)} times; send one comma-separated value")
                    continue
                parts = given if explode else given[0].split(",")
                value = [_scalar(item_kind, p) for p in parts]
            else:
                if len(given) > 1:
                    errors.append(f"query.{name}: given {len(given)} times")
                    continue
                value = _scalar(kind, given[0])
            errors += self.spec.errors(param["schema"], value, f"query.{name}")
            values[name] = value
        for (where, name), param in params.items():
            if where == "query" and param.get("required") and name not in values:
                errors.append(f"query.{name}: required")
        if errors:
            raise ApiError(422, "Request validation failed.", errors, violation=True)
        return values

    def _validate_body(self, op, raw: bytes, headers):
        body_spec = self.spec.deref(op.get("requestBody")) if op.get("requestBody") else None
        if not raw:
            if body_spec and body_spec.get("required"):
                raise ApiError(422, "Request validation failed.", ["$: request body is required"],
                               violation=True)
            return None
        if body_spec is None:
            raise ApiError(422, "Request validation failed.", ["$: this operation takes no request body"],
                           violation=True)
        content_type = (headers.get("Content-Type") or "").split(";")[0].strip().lower()
        media = body_spec["content"].get(content_type)
        if media is None:
            raise ApiError(422, "Request validation failed.",
                           [f"Content-Type {content_type or '(none)'!r} is not "
                            f"{' or '.join(body_spec['content'])}"], violation=True)
        try:
            body = json.loads(raw)
        except ValueError as e:
            raise ApiError(422, "Request validation failed.", [f"$: not JSON: {e}"], violation=True)
        errors = self.spec.errors(media["schema"], body)
        if errors:
            raise ApiError(422, "Request validation failed.", errors, violation=True)
        return body

    def _check_response(self, method, path, op, status, content_type, body, headers) -> None:
        where = f"{method} {path} -> {status}"
        if op is None:  # no operation matched (404/405 on routing, 500 before it): an ErrorResponse
            problems = self.spec.errors(self.spec.schema("ErrorResponse"), body)
            self.response_violations += [f"{where}: {p}" for p in problems]
            return
        declared = op["responses"].get(str(status)) or op["responses"].get("default")
        if declared is None:
            self.response_violations.append(f"{where}: status not declared and no default")
            return
        declared = self.spec.deref(declared)
        content = declared.get("content")
        if not content:
            if body is not None:
                self.response_violations.append(f"{where}: declared without a body, sent one")
        elif content_type not in content:
            self.response_violations.append(f"{where}: content type {content_type} not declared "
                                            f"({', '.join(content)})")
        else:
            problems = self.spec.errors(content[content_type]["schema"], body)
            self.response_violations += [f"{where}: {p}" for p in problems]
        for name, header in declared.get("headers", {}).items():
            header = self.spec.deref(header)
            if name in headers and "schema" in header:
                kind = self.spec.deref(header["schema"]).get("type")
                problems = self.spec.errors(header["schema"], _scalar(kind, headers[name]), f"header.{name}")
                self.response_violations += [f"{where}: {p}" for p in problems]

    # ---- the service (called with the lock held) ----
    def _gpu(self, gpu_id: str) -> dict | None:
        for gpu in self.catalog:
            if gpu["id"] == gpu_id:
                return gpu
        return None

    def _level(self, gpu: dict, cloud: str, product: str, count: int) -> str:
        side = cloud.lower()
        if not gpu[side] or count > gpu["maxCount"][side]:
            return "NONE"
        return self.availability.get((gpu["id"], cloud, product), "NONE")

    def _next_endpoint(self) -> tuple[str, int]:
        endpoints = self.ssh_endpoints or [("127.0.0.1", 40022)]
        endpoint = tuple(endpoints[self._made % len(endpoints)])
        self._made += 1
        return endpoint

    def _new_pod(self, *, name, image, cloud, price, gpu, cpu, env, ports, mounts, ssh,
                 body: dict | None = None, cluster: tuple | None = None) -> FakePod:
        body = body or {}
        env = dict(env)
        if body.get("startSsh") and self.ssh_keys and "PUBLIC_KEY" not in env:
            env["PUBLIC_KEY"] = "\n".join(self.ssh_keys)
        if body.get("startJupyter") and "JUPYTER_PASSWORD" not in env:
            env["JUPYTER_PASSWORD"] = secrets.token_urlsafe(12)
        pod_id = _new_id()
        while pod_id in self.pods:
            pod_id = _new_id()
        key = f"rpa_POD{secrets.token_hex(16).upper()}"
        pod = FakePod(id=pod_id, name=name, image=image, cloud=cloud, price=price, gpu=gpu, cpu=cpu,
                      env=env, ports=list(ports), mounts=copy.deepcopy(mounts), ssh_endpoint=ssh, key=key,
                      args=body.get("args", ""), disk=body.get("disk", 50), registry=body.get("registry"),
                      global_networking=body.get("globalNetworking", False),
                      start_ssh=body.get("startSsh", False), public_key=env.get("PUBLIC_KEY"),
                      data_center=DATA_CENTERS[cloud][0], proxy_user=f"{pod_id}-{secrets.token_hex(4)}")
        if cluster:
            pod.cluster_id, pod.rank, pod.role = cluster
            pod.cluster_ip = f"10.65.0.{2 + pod.rank}"
        self.pods[pod.id] = pod
        self._pod_keys[key] = pod.id
        if self.environ_dir is not None:
            self._write_environ(pod, body)
        return pod

    def _write_environ(self, pod: FakePod, body: dict) -> None:
        environ = {**pod.env, "RUNPOD_POD_ID": pod.id, "RUNPOD_API_KEY": pod.key,
                   "RUNPOD_GPU_COUNT": str(pod.gpu["count"] if pod.gpu else 0),
                   "RUNPOD_DC_ID": pod.data_center}
        if pod.cluster_id:
            environ.update(NODE_RANK=str(pod.rank), NUM_NODES=str(body["compute"]["podCount"]),
                           PRIMARY_ADDR="10.65.0.2", NODE_ADDR=pod.cluster_ip)
        folder = Path(self.environ_dir)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / pod.id).write_bytes(b"".join(f"{k}={v}".encode() + b"\0" for k, v in environ.items()))

    def _run(self, pod: FakePod) -> None:
        pod.status, pod.started, pod.started_at = "RUNNING", time.monotonic(), _stamp()

    def _observe(self, pod: FakePod) -> None:
        """One GET of the pod: PROVISIONING -> STARTING -> RUNNING after ports_after GETs."""
        if pod.status not in ("PROVISIONING", "STARTING"):
            return
        pod.gets += 1
        stuck = (self.never_ready or pod.never_ready
                 or (pod.rank is not None and pod.rank in self.never_ready_nodes))
        if not stuck and pod.gets > self.ports_after:
            self._run(pod)
        else:
            pod.status = "STARTING"

    def _end(self, pod: FakePod) -> None:
        pod.status, pod.started = "TERMINATED", None
        self.terminated.append(pod.id)

    def _pod(self, pod_id: str, get: bool = False) -> FakePod:
        """The pod, or 404; a terminated one only to a GET, with terminated_visible."""
        pod = self.pods.get(pod_id)
        if pod is not None and pod.gone and get and self.terminated_visible \
                and pod.gets_after_end < self.terminated_visible_gets:
            pod.gets_after_end += 1
            return pod
        if pod is None or pod.gone:
            raise ApiError(404, "pod not found")
        return pod

    def _cluster(self, cluster_id: str) -> FakeCluster:
        cluster = self.clusters.get(cluster_id)
        if cluster is None or cluster.deleted:
            raise ApiError(404, "cluster not found")
        return cluster

    def _pod_json(self, pod: FakePod) -> dict:
        proxy = direct = runtime = None
        if pod.status not in ("PROVISIONING", "TERMINATED"):
            proxy = {"host": PROXY_HOST, "port": 22, "username": pod.proxy_user,
                     "command": f"ssh {pod.proxy_user}@{PROXY_HOST}"}
        if pod.status == "RUNNING":
            host, port = pod.ssh_endpoint
            ports = []
            if "22/tcp" in pod.ports:
                direct = {"host": host, "port": port, "username": "root",
                          "command": f"ssh root@{host} -p {port}"}
                ports.append({"private": 22, "public": port, "type": "tcp", "ip": host})
            runtime = {"uptime": int(time.monotonic() - pod.started), "ports": ports}
        out = {"id": pod.id, "name": pod.name, "image": pod.image, "args": pod.args, "disk": pod.disk,
               "ports": list(pod.ports), "env": dict(pod.env), "registry": pod.registry,
               "status": pod.status, "actions": pod.actions, "mounts": copy.deepcopy(pod.mounts)}
        if pod.gpu:
            out["gpu"] = dict(pod.gpu)
        else:
            out["cpu"] = dict(pod.cpu)
        out.update({"cloud": pod.cloud, "dataCenterId": pod.data_center,
                    "cudaVersion": CUDA if pod.gpu else None, "ssh": {"proxy": proxy, "direct": direct},
                    "template": None, "cost": pod.cost, "locked": False,
                    "globalNetworking": {"enabled": False}, "runtime": runtime,
                    "createdAt": pod.created_at, "startedAt": pod.started_at})
        if pod.global_networking:
            index = list(self.pods).index(pod.id)
            out["globalNetworking"] = {"enabled": True, "ip": f"10.65.1.{2 + index % 250}",
                                       "internalDns": f"{pod.id}.runpod.internal"}
        if pod.cluster_id:
            out["cluster"] = {"id": pod.cluster_id, "rank": pod.rank, "ip": pod.cluster_ip}
            if pod.role:
                out["cluster"]["role"] = pod.role
        return out

    def _cluster_json(self, cluster: FakeCluster) -> dict:
        members = [self.pods[i] for i in cluster.pod_ids if not self.pods[i].gone]
        by_status: dict[str, int] = {}
        for pod in members:
            by_status[pod.status] = by_status.get(pod.status, 0) + 1
        out = {"id": cluster.id, "name": cluster.name, "type": cluster.type,
               "compute": dict(cluster.compute), "dataCenterId": cluster.data_center,
               "pods": {"total": len(members), "byStatus": by_status},
               "network": {"cidr": "10.65.0.0/16", "vxlanId": cluster.vxlan_id, "vxlanPort": 4789},
               "createdAt": cluster.created_at}
        primary = self.pods[cluster.pod_ids[0]]
        if not primary.gone:
            out["primary"] = {"podId": primary.id, "status": primary.status}
            if primary.status == "RUNNING" and "22/tcp" in primary.ports:
                out["primary"]["sshEndpoint"] = "%s:%d" % primary.ssh_endpoint
        return out

    def _check_mounts(self, mounts: dict, cpu: bool = False) -> None:
        if "persistent" in mounts and "network" in mounts:
            raise ApiError(400, "mounts: at most one of persistent or network may be set", violation=True)
        if cpu and "persistent" in mounts:
            raise ApiError(400, "mounts.persistent is invalid for a CPU pod", violation=True)
        for mount in mounts.get("network", []):
            raise ApiError(404, f"network volume {mount['volumeId']!r} not found")

    def _placeable(self, cloud: str, body: dict, gpu_id: str) -> None:
        wanted = body.get("dataCenterIds") or []
        if wanted and DATA_CENTERS[cloud][0] not in wanted:
            raise ApiError(400, NO_CAPACITY.format(gpu=gpu_id, cloud=cloud)
                           + f" (none in data centers {', '.join(wanted)})")

    def _create_troubles(self, pods: int, gpu_id: str, cloud: str) -> None:
        if self.fail_create > 0:
            self.fail_create -= 1
            raise ApiError(500, GENERIC_ERROR)
        if self.capacity is not None and self.capacity < pods:
            raise ApiError(400, NO_CAPACITY.format(gpu=gpu_id, cloud=cloud))
        if self.low_balance:
            raise ApiError(402, LOW_BALANCE)

    # listGpuTypes
    def _op_listGpuTypes(self, path, query, body):
        include = "AVAILABILITY" in query.get("include", [])
        if not include:
            for name in ("product", "count", "cloud", "countryCodes", "cudaVersions", "minCudaVersion"):
                if name in query:
                    raise ApiError(400, f"{name} is valid only with include=AVAILABILITY", violation=True)
        elif "product" not in query:
            raise ApiError(400, "include=AVAILABILITY requires product (POD, CLUSTER or SERVERLESS)",
                           violation=True)
        if "cudaVersions" in query and "minCudaVersion" in query:
            raise ApiError(400, "cudaVersions and minCudaVersion are mutually exclusive", violation=True)
        count, cloud = query.get("count", 1), query.get("cloud", "SECURE")
        gpus = []
        for gpu in self.catalog:
            out = copy.deepcopy(gpu)
            if include:
                dc_id, dc_name, country = DATA_CENTERS[cloud]
                if "countryCodes" in query and country not in query["countryCodes"]:
                    continue
                level = max((self._level(gpu, cloud, p, count) for p in query["product"]), key=LEVELS.index)
                offered = True
                if "cudaVersions" in query:
                    offered = CUDA in query["cudaVersions"]
                if "minCudaVersion" in query:
                    floor = [int(x) for x in query["minCudaVersion"].split(".")]
                    offered = [int(x) for x in CUDA.split(".")][:len(floor)] >= floor
                if not offered:
                    level = "NONE"
                out["availability"] = level
                if level != "NONE":
                    out["dataCenters"] = [{"id": dc_id, "name": dc_name, "availability": level}]
                out["cudaVersions"] = [{"version": CUDA, "available": level != "NONE"}] if offered else []
            gpus.append(out)
        return 200, {"gpus": gpus}

    # pods
    def _op_listPods(self, path, query, body):
        members = query.get("includeClusterPods", False)
        pods = [self._pod_json(p) for p in self.pods.values()
                if not p.gone and (members or not p.cluster_id)]
        return 200, {"pods": pods}

    def _op_createPod(self, path, query, body):
        if ("gpu" in body) == ("cpu" in body):
            raise ApiError(400, "supply exactly one of gpu or cpu", violation=True)
        mounts = body.get("mounts", {})
        self._check_mounts(mounts, cpu="cpu" in body)
        cloud = body.get("cloud", "SECURE")
        if "gpu" in body:
            want = body["gpu"]
            if want.get("allowedCudaVersions") and "minCudaVersion" in want:
                raise ApiError(400, "gpu.allowedCudaVersions and gpu.minCudaVersion are mutually exclusive",
                               violation=True)
        else:
            vcpus = body["cpu"]["vcpuCount"]
            if vcpus & (vcpus - 1):
                raise ApiError(400, f"cpu.vcpuCount must be a power of two, got {vcpus}", violation=True)
        if "templateId" in body:
            raise ApiError(404, f"template {body['templateId']!r} not found")
        if "gpu" in body:
            gpu_id, count = body["gpu"]["id"], body["gpu"].get("count", 1)
            gpu = self._gpu(gpu_id)
            if gpu is None:
                raise ApiError(400, f"unknown GPU type {gpu_id!r}")
            ceiling = gpu["maxCount"][cloud.lower()]
            if gpu[cloud.lower()] and count > ceiling:
                raise ApiError(400, f"gpu.count {count} is over the {ceiling} a {gpu_id} pod may have "
                                    f"in {cloud} cloud")
            if self._level(gpu, cloud, "POD", count) == "NONE":
                raise ApiError(400, NO_CAPACITY.format(gpu=gpu_id, cloud=cloud))
            price = gpu["price"][cloud.lower()]
            gpu_conf, cpu_conf = {"id": gpu_id, "count": count}, None
            wants = body["gpu"]
            if wants.get("allowedCudaVersions") and CUDA not in wants["allowedCudaVersions"]:
                raise ApiError(400, NO_CAPACITY.format(gpu=gpu_id, cloud=cloud) + f" (no CUDA {CUDA} host)")
        else:
            gpu_id, price, gpu_conf = body["cpu"]["id"], CPU_PRICE, None
            cpu_conf = {"id": gpu_id, "vcpuCount": body["cpu"]["vcpuCount"],
                        "memory": body["cpu"]["vcpuCount"] * CPU_MEMORY_PER_VCPU}
        self._placeable(cloud, body, gpu_id)
        self._create_troubles(1, gpu_id, cloud)
        pod = self._new_pod(name=body["name"], image=body["image"], cloud=cloud, price=price, gpu=gpu_conf,
                            cpu=cpu_conf, env=body.get("env", {}), ports=body.get("ports", []), mounts=mounts,
                            ssh=self._next_endpoint(), body=body)
        if self.capacity is not None:
            self.capacity -= 1
        self.created.append({"kind": "pod", "id": pod.id, "body": copy.deepcopy(body)})
        if self.lose_create_answer:
            return 502, "Bad Gateway"
        return 201, self._pod_json(pod)

    def _op_getPod(self, path, query, body):
        pod = self._pod(path["id"], get=True)
        self._observe(pod)
        return 200, self._pod_json(pod)

    def _op_deletePod(self, path, query, body):
        if self.fail_delete > 0:
            self.fail_delete -= 1
            raise ApiError(500, GENERIC_ERROR)
        pod = self._pod(path["id"])
        if pod.cluster_id:
            raise ApiError(409, IN_CLUSTER.format(what="terminated", cluster=pod.cluster_id))
        self._end(pod)
        return 204, None

    def _op_podAction(self, path, query, body):
        action = body["action"]
        if action == "terminate" and self.fail_delete > 0:
            self.fail_delete -= 1
            raise ApiError(500, GENERIC_ERROR)
        pod = self._pod(path["id"])
        if pod.cluster_id:
            raise ApiError(409, IN_CLUSTER.format(what="modified", cluster=pod.cluster_id))
        if action not in pod.actions:
            raise ApiError(409, f"action {action!r} is not valid for a pod in status {pod.status} "
                                f"(valid: {', '.join(pod.actions)})")
        if action == "terminate":
            self._end(pod)
            return 204, None
        if action == "stop":
            pod.status, pod.started, pod.started_at = "EXITED", None, None
        elif action == "start":
            pod.status, pod.gets = "STARTING", 0
        elif action == "restart":
            self._run(pod)
        return 200, self._pod_json(pod)

    # clusters
    def _new_cluster(self, body: dict, gpu: dict, endpoints=None) -> FakeCluster:
        compute = body["compute"]
        cluster_id = _new_id()
        while cluster_id in self.clusters:
            cluster_id = _new_id()
        cluster = FakeCluster(id=cluster_id, name=body["name"], type=body["type"], compute=dict(compute),
                              pod_ids=[], vxlan_id=100 + len(self.clusters))
        self.clusters[cluster.id] = cluster
        roles = ROLES.get(body["type"])
        for rank in range(compute["podCount"]):
            role = (roles[0] if rank == 0 else roles[1]) if roles else None
            ssh = tuple(endpoints[rank % len(endpoints)]) if endpoints else self._next_endpoint()
            pod = self._new_pod(name=f"{body['name']}-{rank}", image=body["image"], cloud="SECURE",
                                price=gpu["price"]["secure"],
                                gpu={"id": gpu["id"], "count": compute["gpuCountPerPod"]}, cpu=None,
                                env=body.get("env", {}), ports=body.get("ports", []),
                                mounts=body.get("mounts", {}), ssh=ssh, body=body,
                                cluster=(cluster.id, rank, role))
            cluster.pod_ids.append(pod.id)
        return cluster

    def _op_listClusters(self, path, query, body):
        return 200, {"clusters": [self._cluster_json(c) for c in self.clusters.values() if not c.deleted]}

    def _op_createCluster(self, path, query, body):
        self._check_mounts(body.get("mounts", {}))
        if not body.get("image"):
            raise ApiError(400, "image is required", violation=True)
        compute = body["compute"]
        gpu_id, per_pod = compute["gpuTypeId"], compute["gpuCountPerPod"]
        gpu = self._gpu(gpu_id)
        if gpu is None:
            raise ApiError(400, f"unknown GPU type {gpu_id!r}")
        if per_pod > gpu["maxCount"]["secure"] and gpu["secure"]:
            raise ApiError(400, f"compute.gpuCountPerPod {per_pod} is over the {gpu['maxCount']['secure']} "
                                f"a {gpu_id} pod may have")
        if self._level(gpu, "SECURE", "CLUSTER", per_pod) == "NONE":
            raise ApiError(400, NO_CAPACITY.format(gpu=gpu_id, cloud="SECURE"))
        self._placeable("SECURE", body, gpu_id)
        self._create_troubles(compute["podCount"], gpu_id, "SECURE")
        cluster = self._new_cluster(body, gpu)
        if self.capacity is not None:
            self.capacity -= compute["podCount"]
        self.created.append({"kind": "cluster", "id": cluster.id, "body": copy.deepcopy(body)})
        if self.lose_create_answer:
            return 502, "Bad Gateway"
        return 201, self._cluster_json(cluster)

    def _op_getCluster(self, path, query, body):
        return 200, self._cluster_json(self._cluster(path["id"]))

    def _op_deleteCluster(self, path, query, body):
        if self.fail_delete > 0:
            self.fail_delete -= 1
            raise ApiError(500, GENERIC_ERROR)
        cluster = self._cluster(path["id"])
        for pod_id in cluster.pod_ids:
            if not self.pods[pod_id].gone:
                self._end(self.pods[pod_id])
        cluster.deleted = True
        return 204, None

    def _op_listClusterPods(self, path, query, body):
        cluster = self._cluster(path["id"])
        pods = []
        for pod_id in cluster.pod_ids:
            pod = self.pods[pod_id]
            if not pod.gone:
                self._observe(pod)
                pods.append(self._pod_json(pod))
        return 200, {"pods": pods}

    # account
    def _op_getSshKeys(self, path, query, body):
        return 200, {"keys": list(self.ssh_keys)}

    def _op_updateSshKeys(self, path, query, body):
        self.ssh_keys = list(body["keys"])
        return 200, {"keys": list(self.ssh_keys)}
