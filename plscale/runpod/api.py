"""A thin client for RunPod's REST API v2, on the standard library's urllib.

REST v2 is RunPod's supported API (GraphQL retires in early 2027, REST v1 went in November
2026). The request and response shapes are those of RunPod's published OpenAPI document,
and the tests' fake validates every request and answer against it.

Why not a dependency: the official `runpod` package pulls boto3, fastapi, paramiko and
aiohttp into a course kit that needs a dozen calls; runpodctl is a Go binary outside the
Python registries.

Every call sends the key in an `Authorization: Bearer` header (never in the URL, where
proxies and logs keep it). Rate limits (429, with Retry-After), server errors and lost
connections are retried with backoff for a bounded time, except where retrying could do a
thing twice (creating a pod or a cluster: a create whose answer was lost is looked for by
name instead). The base URL can be pointed elsewhere with PLSCALE_RUNPOD_API (the tests'
fake on 127.0.0.1).
"""

import json
import os
import time
import urllib.parse

from plscale.errors import UserError

BASE = "https://api.runpod.io"
CONSOLE = "https://www.runpod.io/console/user/settings"


class RunPodError(UserError):
    """RunPod refused or could not be reached; the message says what to do."""

    def __init__(self, message: str, status: int | None = None, detail: str = ""):
        super().__init__(message)
        self.status, self.detail = status, detail


class KeyRefused(RunPodError):
    """401: RunPod does not accept the key at all."""


class Forbidden(RunPodError):
    """403: a valid key without access to this resource or action."""


class NotFound(RunPodError):
    pass


class Conflict(RunPodError):
    """409: not possible in the resource's present state."""


class NoCapacity(RunPodError):
    pass


class Unreachable(RunPodError):
    """No answer, or a server error after the retries: whether the operation happened is unknown."""


def retry_seconds() -> float:
    """How long one call keeps retrying a rate limit, a server error or a lost connection."""
    return float(os.environ.get("PLSCALE_RUNPOD_RETRY_S", "60"))


class RunPodAPI:
    def __init__(self, key: str, base: str | None = None, timeout: float = 30, source: str | None = None):
        self._key = key
        self.source = source  # where the key came from, said when RunPod refuses it
        self.base = (base or os.environ.get("PLSCALE_RUNPOD_API") or BASE).rstrip("/")
        self.timeout = timeout

    # ---- the catalog ----
    def gpus(self, count: int = 1, product: str = "POD", cloud: str = "SECURE") -> list[dict]:
        """GPU types with prices per cloud and, for this count, product and cloud, their availability."""
        query = {"include": "AVAILABILITY", "product": product, "count": count, "cloud": cloud}
        return self._call("GET", "/v2/catalog/gpus", query=query, what="listing GPU types")["gpus"]

    # ---- pods ----
    def pods(self) -> list[dict]:
        """Every pod of the account, members of clusters included."""
        return self._call("GET", "/v2/pods", query={"includeClusterPods": "true"}, what="listing pods")["pods"]

    def pod(self, pod_id: str) -> dict | None:
        """The pod, or None once it is terminated (or never was)."""
        try:
            pod = self._call("GET", f"/v2/pods/{_id(pod_id)}", what=f"reading pod {pod_id}")
        except NotFound:
            return None
        return None if pod.get("status") == "TERMINATED" else pod

    def create_pod(self, body: dict) -> dict:
        # Placing a pod can take a while; a create that times out may still have made it.
        return self._call("POST", "/v2/pods", body=body, timeout=120, what="creating a pod", idempotent=False)

    def delete_pod(self, pod_id: str) -> None:
        self._call("DELETE", f"/v2/pods/{_id(pod_id)}", what=f"terminating pod {pod_id}")

    # ---- Instant Clusters ----
    def clusters(self) -> list[dict]:
        return self._call("GET", "/v2/clusters", what="listing clusters")["clusters"]

    def cluster(self, cluster_id: str) -> dict | None:
        """The cluster, or None once it is deleted."""
        try:
            return self._call("GET", f"/v2/clusters/{_id(cluster_id)}", what=f"reading cluster {cluster_id}")
        except NotFound:
            return None

    def cluster_pods(self, cluster_id: str) -> list[dict]:
        return self._call("GET", f"/v2/clusters/{_id(cluster_id)}/pods",
                          what=f"listing the pods of cluster {cluster_id}")["pods"]

    def create_cluster(self, body: dict) -> dict:
        return self._call("POST", "/v2/clusters", body=body, timeout=120, what="creating a cluster", idempotent=False)

    def delete_cluster(self, cluster_id: str) -> None:
        self._call("DELETE", f"/v2/clusters/{_id(cluster_id)}", what=f"deleting cluster {cluster_id}")

    # ---- the account's SSH keys ----
    def ssh_keys(self) -> list[str]:
        return self._call("GET", "/v2/account/ssh-keys", what="reading the account's SSH keys")["keys"]

    def set_ssh_keys(self, keys: list[str]) -> list[str]:
        """Replace the account's whole key set (RunPod's PUT is a replacement, not a merge)."""
        return self._call("PUT", "/v2/account/ssh-keys", body={"keys": keys},
                          what="registering an SSH key")["keys"]

    # ---- one call ----
    def _call(self, method: str, path: str, query: dict | None = None, body: dict | None = None,
              timeout: float | None = None, what: str = "", idempotent: bool = True):
        """One request, retried while RunPod is rate limiting or failing, at most retry_seconds()."""
        url = self.base + path + ("?" + urllib.parse.urlencode(query) if query else "")
        give_up, wait = time.monotonic() + retry_seconds(), 1.0
        while True:
            status, headers, answer = self._send(method, url, body, timeout or self.timeout, what)
            retry = status == 429 or (idempotent and (status is None or status >= 500))
            pause = _retry_after(headers, wait) if status == 429 else wait  # RunPod says how long, on a 429
            if not retry or time.monotonic() + pause > give_up:
                return self._answer(status, headers, answer, what, url)
            time.sleep(pause)
            wait = min(wait * 2, 16)

    def _send(self, method: str, url: str, body, timeout: float, what: str):
        """(status, headers, parsed body); status None when nothing came back."""
        import urllib.error
        import urllib.request  # here, not at import: `plscale --help` stays fast

        data = json.dumps(body).encode() if body is not None else None
        headers = {"Authorization": f"Bearer {self._key}", "Accept": "application/json",
                   "User-Agent": "plscale-runpod"}
        if data is not None:
            headers["Content-Type"] = "application/json"
        request = urllib.request.Request(url, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                return response.status, response.headers, _parse(response.read())
        except urllib.error.HTTPError as exc:
            return exc.code, exc.headers, _parse(exc.read())
        except (urllib.error.URLError, OSError) as exc:
            return None, {}, str(getattr(exc, "reason", exc))

    def _answer(self, status, headers, answer, what: str, url: str):
        if status is not None and 200 <= status < 300:
            if status != 204 and not isinstance(answer, dict):
                raise Unreachable(f"RunPod answered {what} with something that is not JSON: try again; "
                                  f"https://status.runpod.io says whether the service is down.", status)
            return answer if status != 204 else None
        if status is None:
            raise Unreachable(f"Cannot reach RunPod's API at {self.base} while {what} ({answer}): check the "
                              f"network (or PLSCALE_RUNPOD_API if you set it). Whether it happened is unknown: "
                              f"`plscale runpod status` says what RunPod lists.")
        detail = _detail(answer)
        said = f": {detail}" if detail else ""
        if status == 401:
            which = f" {'****' + self._key[-4:] if len(self._key) > 8 else '****'} from {self.source}" \
                if self.source else ""
            fix = ("set RUNPOD_API_KEY to a valid one, or unset it to use the saved key" if
                   self.source == "RUNPOD_API_KEY" else "set RUNPOD_API_KEY (or `plscale runpod login`)")
            raise KeyRefused(f"RunPod refused the API key{which} (HTTP 401{said}): make a new key at {CONSOLE} "
                             f"and {fix}.", status, detail)
        if status == 403:
            raise Forbidden(f"RunPod accepted the API key but it has no access to {what or 'this'} (HTTP 403{said}): "
                            f"give the key the permission All (or Read/Write) at {CONSOLE}, or make one that has it.",
                            status, detail)
        if status == 404:
            raise NotFound(f"RunPod found nothing while {what} (HTTP 404{said}).", status, detail)
        if status == 409:
            raise Conflict(f"RunPod refused {what} in the present state (HTTP 409{said}).", status, detail)
        if status == 400 and "creating" in what:
            raise NoCapacity(f"RunPod could not place it while {what} (HTTP 400{said}): try another --gpu-type, "
                             f"--cloud or fewer --gpus (`plscale runpod gpus` shows stock), or again later.",
                             status, detail)
        if status in (400, 422):
            errors = "; ".join(answer.get("errors") or []) if isinstance(answer, dict) else ""
            raise RunPodError(f"RunPod refused {what} (HTTP {status}{said}{'; ' + errors if errors else ''}): "
                              f"this is a plscale bug if the request came from plscale; please report it.",
                              status, detail)
        if status == 429:
            raise Unreachable(f"RunPod is rate limiting this key while {what} (HTTP 429{said}) and still was after "
                              f"{retry_seconds():g} s of retries: wait a minute and run the command again.", status, detail)
        raise Unreachable(f"RunPod answered HTTP {status} while {what}{said}: try again in a minute; "
                          f"https://status.runpod.io says whether the service is down.", status, detail)


def _id(resource_id: str) -> str:
    return urllib.parse.quote(resource_id, safe="")


def _parse(raw: bytes):
    try:
        return json.loads(raw) if raw else None
    except ValueError:
        return raw.decode("utf-8", "replace")[:200]


def _detail(answer) -> str:
    """RunPod's problem+json `detail` (or the text it answered instead)."""
    if isinstance(answer, dict):
        return str(answer.get("detail") or answer.get("title") or "").strip().rstrip(".")
    return (answer or "").strip().splitlines()[0][:120] if isinstance(answer, str) and answer.strip() else ""


def _retry_after(headers, otherwise: float) -> float:
    try:
        return max(0.0, float(headers.get("Retry-After")))
    except (TypeError, ValueError):
        return otherwise
