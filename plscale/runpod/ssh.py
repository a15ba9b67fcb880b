"""The ssh and rsync command lines plscale runs against a pod, over direct TCP.

One place builds them, so `up`'s readiness check, `ssh`, `sync`, `run`, `logs` and
`fetch` all connect the same way: the cluster's key only, the pods' host keys in
plscale's own known_hosts (a pod's address and port are reused by later pods, so `up`
forgets old entries for them), batch mode wherever no one types.
"""

import os
import shlex
import shutil
import subprocess
from pathlib import Path

from plscale.errors import UserError
from plscale.runpod.local import known_hosts


def user() -> str:
    return os.environ.get("PLSCALE_RUNPOD_SSH_USER", "root")


def require(tool: str) -> str:
    path = shutil.which(tool)
    if path is None:
        hint = {"rsync": "apt install rsync, brew install rsync, or on Windows use WSL"}.get(
            tool, "apt install openssh-client (macOS and Windows 10+ have it)")
        raise UserError(f"{tool} is not installed on this machine, and plscale needs it to reach the pods: {hint}.")
    return path


def check_key(key) -> None:
    """ssh runs in batch mode (nobody is there to type a passphrase): a key with one must be in the agent."""
    if subprocess.run(["ssh-keygen", "-y", "-P", "", "-f", str(key)], capture_output=True).returncode == 0:
        return
    public = " ".join(Path(f"{key}.pub").read_text().split()[:2])
    agent = subprocess.run(["ssh-add", "-L"], capture_output=True, text=True) if shutil.which("ssh-add") else None
    if agent is None or public not in agent.stdout:
        raise UserError(f"SSH key {key} has a passphrase and is not in your ssh-agent: run `ssh-add {key}` "
                        f"first (plscale connects without asking for passphrases).")


def options(cluster: dict, pod: dict, batch: bool = True) -> list[str]:
    known_hosts().parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    opts = ["-p", str(pod["port"]), "-i", cluster["ssh_key"], "-o", "IdentitiesOnly=yes",
            "-o", "StrictHostKeyChecking=accept-new", "-o", f"UserKnownHostsFile={known_hosts()}",
            "-o", "ConnectTimeout=10", "-o", "ServerAliveInterval=30", "-o", "LogLevel=ERROR"]
    return opts + (["-o", "BatchMode=yes"] if batch else [])


def target(pod: dict) -> str:
    return f"{user()}@{pod['host']}"


def argv(cluster: dict, pod: dict, command: str | None = None, tty: bool = False, batch: bool = True) -> list[str]:
    """`ssh ... user@host [command]`: the command runs in the pod's login shell."""
    return [require("ssh"), *options(cluster, pod, batch), *(["-t"] if tty else []), target(pod),
            *([command] if command else [])]


def run(cluster: dict, pod: dict, command: str, timeout: float | None = 60,
        input: str | None = None) -> subprocess.CompletedProcess:
    """Run `command` on the pod; `input`, if given, is its stdin (else it reads nothing)."""
    stdin = {"input": input} if input is not None else {"stdin": subprocess.DEVNULL}
    return subprocess.run(argv(cluster, pod, command), capture_output=True, text=True, timeout=timeout, **stdin)


def answers(cluster: dict, pod: dict) -> bool:
    """Whether sshd on the pod accepts our key and runs a command (the port opens before sshd is up)."""
    try:
        return run(cluster, pod, "true", timeout=30).returncode == 0
    except subprocess.TimeoutExpired:
        return False


def forget_host(pod: dict) -> None:
    """Drop a reused address's old host key, so a new pod at the same ip:port is not taken for an attack."""
    if known_hosts().is_file():
        subprocess.run(["ssh-keygen", "-R", f"[{pod['host']}]:{pod['port']}", "-f", str(known_hosts())],
                       capture_output=True)


def rsync_argv(cluster: dict, pod: dict, source: str, dest: str, extra: list[str] = ()) -> list[str]:
    """rsync over the same ssh options; a `:` prefix in source or dest means 'on the pod'."""
    def where(path: str) -> str:
        return f"{target(pod)}:{path[1:]}" if path.startswith(":") else path

    remote_shell = shlex.join(["ssh", *options(cluster, pod)])
    return [require("rsync"), "-az", "-e", remote_shell, *extra, where(source), where(dest)]
