"""Work on the pods over SSH: copy the project there, run labs, read logs, bring runs back.

A run on a pod is a job (runpod/job.sh): detached from the ssh session that started it,
so a dropped connection does not kill it, with its output in a log that `run` streams
and `logs` reads later. On K pods, every node starts runpod/launch_multinode.sh with
its rank and node 0's address, the same script an Instant Cluster's nodes run.
"""

import hashlib
import shlex
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

from plscale.errors import UserError
from plscale.runpod import ssh

ROOT = Path(__file__).resolve().parents[2]
# Never copied to a pod: results, environments and caches (rsync keeps them on the pod, too), and secrets:
# .env files and private keys, which a student may keep in the checkout (a pod is not theirs alone).
EXCLUDE = ["runs/", ".venv/", "venv/", ".git/", "__pycache__/", "*.egg-info/", ".pytest_cache/", ".plscale/",
           "node_modules/", "*.pyc", ".env", ".env.*", "*.pem", "*.key", "id_rsa*", "id_ed25519*", "id_ecdsa*",
           "runpod_api_key"]


def project() -> Path:
    if not (ROOT / "pyproject.toml").is_file() or not (ROOT / "runpod" / "job.sh").is_file():
        raise UserError(f"`sync` copies a plscale checkout, and {ROOT} is not one (plscale was installed from a "
                        f"wheel): clone the repository and install it with `pip install -e .`.")
    return ROOT


def in_dir(cluster: dict, command: str) -> str:
    return f"cd {shlex.quote(cluster['remote_dir'])} && {command}"


def sync(cluster: dict, say) -> None:
    """rsync the project to every pod, then bootstrap where pyproject.toml changed since the last time."""
    root = project()
    digest = hashlib.sha256((root / "pyproject.toml").read_bytes()).hexdigest()
    remote = cluster["remote_dir"].rstrip("/")
    for pod in cluster["pods"]:
        if ssh.run(cluster, pod, "command -v rsync").returncode != 0:  # the other end of rsync
            say(f"node {pod['node']}: installing rsync on the pod")
            _check(ssh.run(cluster, pod, "apt-get update -qq && apt-get install -y -qq rsync", timeout=600),
                   f"installing rsync on node {pod['node']} (`plscale runpod ssh -- apt-get install -y rsync`)")
        say(f"node {pod['node']}: copying {root} to {pod['host']}:{remote}")
        argv = ssh.rsync_argv(cluster, pod, f"{root}/", f":{remote}/",
                              ["--delete", *[f"--exclude={e}" for e in EXCLUDE],
                               f"--rsync-path=mkdir -p {shlex.quote(remote)} && rsync"])
        _check(subprocess.run(argv, stdin=subprocess.DEVNULL), f"rsync to node {pod['node']}")
        fresh = f'[ "$(cat .plscale/bootstrapped 2>/dev/null)" = {digest} ]'
        if ssh.run(cluster, pod, in_dir(cluster, fresh)).returncode != 0:
            say(f"node {pod['node']}: installing plscale and DeepSpeed (runpod/bootstrap.sh, a few minutes)")
            done = subprocess.run(ssh.argv(cluster, pod, in_dir(cluster, "bash runpod/bootstrap.sh")),
                                  stdin=subprocess.DEVNULL)
            _check(done, f"runpod/bootstrap.sh on node {pod['node']}")


def run(cluster: dict, lab: str, args: list[str], env: dict, detach: bool, master_port: int, say) -> int:
    """Start `plscale lab run LAB ARGS` on every pod, with `env` set (NCCL_* for instance); stream
    node 0 until every node is done."""
    nodes = cluster["pods"]
    job = f"run-{datetime.now():%Y%m%d-%H%M%S}-{lab}"
    names = {p["node"]: (job if len(nodes) == 1 else f"{job}-node{p['node']}") for p in nodes}
    if len(nodes) == 1:
        gpus = [] if any(a == "--gpus" or a.startswith("--gpus=") for a in args) else ["--gpus", str(cluster["gpus"])]
        commands = {0: ["env", *[f"{k}={v}" for k, v in env.items()], "plscale", "lab", "run", lab, *gpus, *args]}
    else:  # launch_multinode.sh passes --gpus NUM_TRAINERS (a --gpus in args comes later and wins)
        address = _output(cluster, nodes[0], in_dir(cluster, "bash runpod/node_addr.sh"), "runpod/node_addr.sh")
        say(f"{len(nodes)} nodes, node 0 at {address}:{master_port}")
        env = {**env, "PRIMARY_ADDR": address, "PRIMARY_PORT": master_port, "NUM_NODES": len(nodes),
               "NUM_TRAINERS": cluster["gpus"]}
        commands = {p["node"]: ["env", *[f"{k}={v}" for k, v in {**env, "NODE_RANK": p["node"]}.items()],
                                "bash", "runpod/launch_multinode.sh", lab, *args] for p in nodes}
    for pod in nodes:
        start = shlex.join(["bash", "runpod/job.sh", "start", names[pod["node"]], "--", *commands[pod["node"]]])
        _output(cluster, pod, in_dir(cluster, start), f"starting the run on node {pod['node']}")
    say(f"started {job} on {len(nodes)} pod(s): `plscale runpod logs -f` follows it, "
        f"`plscale runpod fetch` brings its run directory back")
    if detach:
        return 0
    return _follow(cluster, nodes, names)


def _follow(cluster: dict, nodes: list[dict], names: dict) -> int:
    """Stream node 0's log while watching the others. A node that fails stops them all, as does
    Ctrl-C; a lost connection leaves the run going (it is detached from ssh)."""
    job = f"bash runpod/job.sh follow {shlex.quote(names[0])}"
    stream = subprocess.Popen(ssh.argv(cluster, nodes[0], in_dir(cluster, job)), stdin=subprocess.DEVNULL)
    try:
        failed = None
        while failed is None and stream.poll() is None:
            failed = _failed(cluster, nodes[1:], names)
            time.sleep(2)
        if failed is None and stream.returncode == 255:  # ssh's own failure, not the run's
            print("The connection to node 0 was lost; the run goes on there: `plscale runpod logs -f` follows it.",
                  file=sys.stderr)
            return 255
        if failed is None and stream.returncode != 0 and len(nodes) > 1:
            failed = (nodes[0], f"exited {stream.returncode}")
        while failed is None and any(_status(cluster, p, names[p["node"]]) == "running" for p in nodes[1:]):
            time.sleep(1)  # node 0 done: the others finish with it
            failed = _failed(cluster, nodes[1:], names)
        if failed is None:
            return stream.returncode
        pod, state = failed
        _stop(cluster, nodes, names)
        if pod is not nodes[0]:
            tail = _output(cluster, pod, in_dir(cluster, f"bash runpod/job.sh tail {shlex.quote(names[pod['node']])} "
                                                         f"20"), "reading its log")
            print(f"--- node {pod['node']} failed ({state}); its last lines:\n{tail}", file=sys.stderr)
        print("Stopped the run on every node.", file=sys.stderr)
        return int(state.split()[1]) or 1
    except KeyboardInterrupt:
        _stop(cluster, nodes, names)
        print("Stopped the run on every pod.", file=sys.stderr)
        return 130
    finally:
        if stream.poll() is None:
            stream.kill()


def _failed(cluster: dict, nodes: list[dict], names: dict) -> tuple[dict, str] | None:
    for pod in nodes:
        state = _status(cluster, pod, names[pod["node"]])
        if state.startswith("exited") and state != "exited 0":
            return pod, state
    return None


def _status(cluster: dict, pod: dict, name: str) -> str:
    return _output(cluster, pod, in_dir(cluster, f"bash runpod/job.sh status {shlex.quote(name)}"),
                   "reading a job's status")


def _stop(cluster: dict, nodes: list[dict], names: dict) -> None:
    for pod in nodes:
        try:
            ssh.run(cluster, pod, in_dir(cluster, f"bash runpod/job.sh stop {shlex.quote(names[pod['node']])}"))
        except subprocess.TimeoutExpired:
            print(f"Node {pod['node']} did not answer: its run may go on (`plscale runpod ssh --node {pod['node']}`).",
                  file=sys.stderr)


def logs(cluster: dict, node: int, follow: bool, lines: int) -> int:
    pod = pod_at(cluster, node)
    latest = ssh.run(cluster, pod, in_dir(cluster, "bash runpod/job.sh latest 2>/dev/null"))
    if latest.returncode != 0 or not latest.stdout.strip():
        raise UserError(f"No run on node {node} yet: start one with `plscale runpod run LAB`.")
    name = latest.stdout.strip()
    verb = f"follow {shlex.quote(name)}" if follow else f"tail {shlex.quote(name)} {lines}"
    return subprocess.call(ssh.argv(cluster, pod, in_dir(cluster, f"bash runpod/job.sh {verb}")),
                           stdin=subprocess.DEVNULL)


def fetch(cluster: dict, runs: list[str], node: int, dest: Path, say) -> list[Path]:
    """Copy run directories back from a pod. Node 0 holds global rank 0's files (summary, metrics,
    plots: what `plscale report` reads); another node's go to runs/node-K/, as their names may
    be node 0's."""
    pod = pod_at(cluster, node)
    there = ssh.run(cluster, pod, in_dir(cluster, "ls runs 2>/dev/null")).stdout.split()
    if not there:
        raise UserError(f"No runs on node {node} yet: start one with `plscale runpod run LAB`.")
    missing = [r for r in runs if r.strip("/") not in there]
    if missing:
        raise UserError(f"No run {', '.join(missing)} on node {node}: its runs are {', '.join(there[-5:])}"
                        f"{' (the last 5)' if len(there) > 5 else ''}.")
    dest = dest if node == 0 else dest / f"node-{node}"
    dest.mkdir(parents=True, exist_ok=True)
    before = {p.name for p in dest.iterdir()}
    runs_there = f":{cluster['remote_dir'].rstrip('/')}/runs/"
    for source in [runs_there + r.strip("/") for r in runs] or [runs_there]:
        say(f"node {node}: {source[1:]} -> {dest}")
        _check(subprocess.run(ssh.rsync_argv(cluster, pod, source, f"{dest}/"), stdin=subprocess.DEVNULL),
               f"rsync from node {node} (is there such a run? `plscale runpod ssh -- ls runs`)")
    return sorted(dest / n for n in {p.name for p in dest.iterdir()} - before)


def shell(cluster: dict, node: int, command: list[str]) -> int:
    """A login shell in the project folder, or `command` run there: words joined by spaces, as ssh does."""
    go = f"cd {shlex.quote(cluster['remote_dir'])} 2>/dev/null || cd; "
    remote = go + (" ".join(command) if command else 'exec "$SHELL" -l')
    tty = not command and sys.stdin.isatty()
    return subprocess.call(ssh.argv(cluster, pod_at(cluster, node), remote, tty=tty, batch=bool(command)))


def pod_at(cluster: dict, node: int) -> dict:
    for pod in cluster["pods"]:
        if pod["node"] == node:
            return pod
    raise UserError(f"--node {node}: cluster {cluster['name']!r} has nodes 0 to {len(cluster['pods']) - 1}.")


def _output(cluster: dict, pod: dict, command: str, what: str) -> str:
    try:
        done = ssh.run(cluster, pod, command)
    except subprocess.TimeoutExpired:
        raise UserError(f"Node {pod['node']} ({pod['host']}:{pod['port']}) did not answer within a minute while "
                        f"{what}: `plscale runpod status` says whether it is up.") from None
    if done.returncode != 0:
        last = (done.stderr.strip() or done.stdout.strip()).splitlines()[-1:] or ["no output"]
        raise UserError(f"Node {pod['node']} ({pod['host']}:{pod['port']}): {what} failed: {last[0]} "
                        f"(`plscale runpod sync` first if the project is not there yet).")
    return done.stdout.strip()


def _check(done: subprocess.CompletedProcess, what: str) -> None:
    if done.returncode != 0:
        raise UserError(f"{what} failed (exit {done.returncode}): is the pod up? `plscale runpod status` says.")
