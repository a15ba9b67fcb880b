"""The watchdog `plscale runpod up` starts on every pod: at the deadline it ends its own pod.

It is how --max-hours holds when the laptop that ran `up` is closed, lost or offline: REST v2
has no server-side terminate time, so the pods keep their own. It runs on the pod, standard
library only (copied there over SSH, so it must not import plscale), and talks to RunPod's
API with the pod-scoped key RunPod puts in every pod's environment (RUNPOD_API_KEY, read
from the container's environment, /proc/1/environ, as an SSH session may not have it).

At start it reads its own pod through the API (the key works, the pod is this one) and only
then writes `armed` to its status file, which `up` waits for. Every --poll seconds it checks
that its pod still exists (it exits once the pod is ended from outside) and reads the deadline file (epoch seconds; `plscale runpod` may move it), and once the deadline has
passed it ends the pod: DELETE /v2/clusters/ID for a cluster's member (one delete ends every
node), else DELETE /v2/pods/ID, and where the key may not terminate, the documented
`stop` action (the GPU stops billing; the volume's storage does not). It retries until one
is accepted, writing each refusal to the status file.

    python3 watchdog.py --pod ID [--cluster ID] --api URL --dir DIR [--poll S] [--environ PATH]
"""

import argparse
import json
import os
import sys
import time
import urllib.error
import urllib.request


def pod_key(environ: str) -> str:
    """RUNPOD_API_KEY of the container: this process's, else PID 1's (NUL- or newline-separated)."""
    if os.environ.get("RUNPOD_API_KEY"):
        return os.environ["RUNPOD_API_KEY"]
    try:
        raw = open(environ, "rb").read().decode("utf-8", "replace")
    except OSError as exc:
        raise SystemExit(f"error: cannot read the pod's environment at {environ} ({exc.strerror})")
    for line in raw.replace("\0", "\n").splitlines():
        name, _, value = line.partition("=")
        if name.strip().removeprefix("export ") == "RUNPOD_API_KEY" and value.strip():
            return value.strip().strip("'\"")
    raise SystemExit(f"error: no RUNPOD_API_KEY in the pod's environment ({environ})")


def call(api: str, key: str, method: str, path: str, body: dict | None = None) -> tuple[int, str]:
    data = json.dumps(body).encode() if body is not None else None
    headers = {"Authorization": f"Bearer {key}", "Accept": "application/json", "User-Agent": "plscale-watchdog"}
    if data is not None:
        headers["Content-Type"] = "application/json"
    request = urllib.request.Request(api.rstrip("/") + path, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, ""
    except urllib.error.HTTPError as exc:
        try:
            detail = json.loads(exc.read() or b"{}").get("detail", "")
        except (ValueError, AttributeError):
            detail = ""
        return exc.code, detail
    except (urllib.error.URLError, OSError) as exc:
        return 0, str(getattr(exc, "reason", exc))


def deadline(path: str) -> float:
    try:
        return float(open(path).read().strip())
    except (OSError, ValueError):
        return float("inf")  # unreadable for a moment (being rewritten): the next poll reads it


def say(status_file: str, text: str) -> None:
    tmp = status_file + ".tmp"
    with open(tmp, "w") as f:
        f.write(text + "\n")
    os.replace(tmp, status_file)


def end(args, key: str) -> str | None:
    """Try to end the pod; None once RunPod accepted (or it is gone), else what RunPod said."""
    tries = [("DELETE", f"/v2/clusters/{args.cluster}", None)] if args.cluster else \
        [("DELETE", f"/v2/pods/{args.pod}", None), ("POST", f"/v2/pods/{args.pod}/action", {"action": "stop"})]
    refused = []
    for method, path, body in tries:
        status, detail = call(args.api, key, method, path, body)
        if status in (200, 204, 404):
            return None
        refused.append(f"{method} {path}: {status or 'no answer'} {detail}".strip())
        if status not in (403, 409):
            break  # not a refusal of this way: the next poll tries again
    return "; ".join(refused)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="End this pod (or its cluster) at the deadline.")
    parser.add_argument("--pod", required=True)
    parser.add_argument("--cluster", default="")
    parser.add_argument("--api", required=True)
    parser.add_argument("--dir", required=True, help="holds deadline (epoch seconds) and status")
    parser.add_argument("--poll", type=float, default=30)
    parser.add_argument("--environ", default="/proc/1/environ")
    args = parser.parse_args(argv)
    status_file, deadline_file = os.path.join(args.dir, "status"), os.path.join(args.dir, "deadline")
    with open(os.path.join(args.dir, "pid"), "w") as f:
        f.write(f"{os.getpid()}\n")
    try:
        key = pod_key(args.environ)
    except SystemExit as exc:
        say(status_file, str(exc))
        return 1
    status, detail = call(args.api, key, "GET", f"/v2/pods/{args.pod}")
    if status != 200:
        say(status_file, f"error: the pod's key cannot read pod {args.pod} (HTTP {status or 'no answer'} {detail})")
        return 1
    say(status_file, f"armed {deadline(deadline_file):.0f} pid {os.getpid()}")
    while True:
        time.sleep(args.poll)
        if call(args.api, key, "GET", f"/v2/pods/{args.pod}")[0] == 404:  # ended by `down` or the console
            say(status_file, f"gone at {time.time():.0f}: the pod was ended from outside")
            return 0
        if time.time() >= deadline(deadline_file):
            refused = end(args, key)
            if refused is None:
                say(status_file, f"ended at {time.time():.0f}")
                return 0
            say(status_file, f"refused at {time.time():.0f}: {refused}")


if __name__ == "__main__":
    sys.exit(main())
