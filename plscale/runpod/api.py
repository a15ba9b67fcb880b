"""A thin client for RunPod's GraphQL API, on the standard library's urllib.

Why not a dependency: the official `runpod` package pulls boto3, fastapi, paramiko and
aiohttp into a course kit that needs five API calls, and builds its GraphQL by string
formatting (docker arguments with quotes break it); runpodctl is a Go binary outside the
Python registries; SkyPilot drives RunPod for single pods only. GraphQL rather than the REST
API because only GraphQL gives prices and stock per GPU type, the account's balance, and a
server-side terminate time (`terminateAfter`), which is what makes `--max-hours` hold when
the laptop that ran `up` is gone.

Every call sends the key in an `Authorization: Bearer` header (never in the URL, where
proxies and logs keep it) and its variables as JSON (no quoting to get wrong). The endpoint
can be pointed elsewhere with PLSCALE_RUNPOD_API (the tests' fake on 127.0.0.1).
"""

import json
import os

from plscale.errors import UserError

ENDPOINT = "https://api.runpod.io/graphql"
POD_FIELDS = "id name desiredStatus costPerHr gpuCount"

GPU_TYPES = """query GpuTypes($count: Int!) { gpuTypes { id displayName memoryInGb secureCloud communityCloud
  securePrice communityPrice
  secure: lowestPrice(input: {gpuCount: $count, secureCloud: true}) { stockStatus }
  community: lowestPrice(input: {gpuCount: $count, secureCloud: false}) { stockStatus } } }"""
MYSELF = f"query Myself {{ myself {{ id clientBalance pods {{ {POD_FIELDS} }} }} }}"
POD = f"""query Pod($podId: String!) {{ pod(input: {{podId: $podId}}) {{ {POD_FIELDS}
  runtime {{ uptimeInSeconds ports {{ ip isIpPublic privatePort publicPort type }} }} }} }}"""
CREATE = """mutation CreatePod($input: PodFindAndDeployOnDemandInput!) {
  podFindAndDeployOnDemand(input: $input) { id name desiredStatus costPerHr } }"""
TERMINATE = "mutation TerminatePod($input: PodTerminateInput!) { podTerminate(input: $input) }"


class RunPodError(UserError):
    """RunPod refused or could not be reached; the message says what to do."""


class KeyRefused(RunPodError):
    pass


class NoCapacity(RunPodError):
    pass


class LowBalance(RunPodError):
    pass


class Unreachable(RunPodError):
    """No answer, or a server error: whether the operation happened is unknown."""


class RunPodAPI:
    def __init__(self, key: str, endpoint: str | None = None, timeout: float = 30, source: str | None = None):
        self._key = key
        self.source = source  # where the key came from, said when RunPod refuses it
        self.endpoint = endpoint or os.environ.get("PLSCALE_RUNPOD_API") or ENDPOINT
        self.timeout = timeout

    def gpu_types(self, count: int = 1) -> list[dict]:
        return self._call("GpuTypes", GPU_TYPES, {"count": count})["gpuTypes"]

    def myself(self) -> dict:
        return self._call("Myself", MYSELF)["myself"]

    def pod(self, pod_id: str) -> dict | None:
        """The pod, or None once it is terminated (or never was)."""
        return self._call("Pod", POD, {"podId": pod_id}, may_be_null=True)["pod"]

    def create(self, spec: dict) -> dict:
        # Finding a machine can take a while: a create that times out may still have made the pod,
        # which provision looks for by name.
        return self._call("CreatePod", CREATE, {"input": spec}, timeout=120)["podFindAndDeployOnDemand"]

    def terminate(self, pod_id: str) -> None:
        self._call("TerminatePod", TERMINATE, {"input": {"podId": pod_id}}, may_be_null=True)

    def _call(self, name: str, query: str, variables: dict | None = None, timeout: float | None = None,
              may_be_null: bool = False) -> dict:
        import urllib.error
        import urllib.request  # here, not at import: `plscale --help` stays fast

        body = json.dumps({"operationName": name, "query": query, "variables": variables or {}}).encode()
        request = urllib.request.Request(self.endpoint, data=body, method="POST", headers={
            "Content-Type": "application/json", "Authorization": f"Bearer {self._key}",
            "User-Agent": "plscale-runpod"})
        try:
            with urllib.request.urlopen(request, timeout=timeout or self.timeout) as response:
                answer = json.loads(response.read() or b"{}")
        except urllib.error.HTTPError as exc:
            if exc.code in (401, 403):
                which = f" {'****' + self._key[-4:] if len(self._key) > 8 else '****'} from {self.source}" \
                    if self.source else ""
                fix = ("set RUNPOD_API_KEY to a valid one, or unset it to use the saved key" if
                       self.source == "RUNPOD_API_KEY" else "set RUNPOD_API_KEY (or `plscale runpod login`)")
                raise KeyRefused(f"RunPod refused the API key{which} (HTTP {exc.code}): make a new key at "
                                 f"https://www.runpod.io/console/user/settings and {fix}.") from None
            errors = _errors(exc)
            if exc.code == 400 and errors:  # GraphQL refuses a malformed request with 400 and says why
                raise _refusal(name, errors) from None
            raise Unreachable(f"RunPod answered HTTP {exc.code} to {name}: try again in a minute; "
                              f"https://status.runpod.io says whether the service is down.") from None
        except (urllib.error.URLError, OSError, ValueError) as exc:
            reason = getattr(exc, "reason", exc)
            raise Unreachable(f"Cannot reach RunPod's API at {self.endpoint} ({reason}): check the network "
                              f"(or PLSCALE_RUNPOD_API if you set it).") from None
        if answer.get("errors"):
            raise _refusal(name, "; ".join(str(e.get("message", e)) for e in answer["errors"]))
        data = answer.get("data") or {}
        field = next(iter(data), None)
        if not may_be_null and (field is None or data[field] is None):
            if name == "Myself":  # what RunPod answers a key it does not know
                raise KeyRefused("RunPod does not know this API key: set a valid RUNPOD_API_KEY.")
            raise RunPodError(f"RunPod answered {name} with nothing: try again; if it persists, check the "
                              f"console (https://www.runpod.io/console/pods) for pods named plscale-*.")
        return data


def _errors(exc) -> str:
    try:
        return "; ".join(str(e.get("message", e)) for e in json.loads(exc.read()).get("errors") or [])
    except (ValueError, AttributeError, OSError):
        return ""


def _refusal(name: str, message: str) -> RunPodError:
    text = message.lower()
    if "unauthorized" in text or "api key" in text:
        return KeyRefused(f"RunPod refused the API key ({message}): set a valid RUNPOD_API_KEY.")
    if "no longer any instances available" in text or "no instances" in text:
        return NoCapacity("RunPod has no free GPUs of that type right now: try another --gpu-type or --cloud "
                          "(`plscale runpod gpus` shows stock), fewer --gpus, or again later.")
    if "balance" in text or "insufficient funds" in text:
        return LowBalance(f"RunPod refused: {message.rstrip('.')}. Add credit at "
                          f"https://www.runpod.io/console/user/billing.")
    return RunPodError(f"RunPod refused {name}: {message}")
