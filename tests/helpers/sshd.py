"""A real OpenSSH server on loopback, standing in for a pod's sshd in tests.

It logs in the current user with a key pair made for the test, and puts this
virtualenv's bin/ first on the PATH of its sessions (sshd_config's SetEnv), so `plscale`
resolves as it does on a bootstrapped pod.
"""

import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

SSHD = shutil.which("sshd") or next((p for p in ("/usr/sbin/sshd", "/usr/local/sbin/sshd") if Path(p).exists()), None)


def missing() -> str | None:
    """Why a real sshd cannot run here, or None."""
    if SSHD is None:
        return "no sshd here (Debian: apt-get install openssh-server; .ci/run installs it)"
    for tool in ("ssh", "ssh-keygen"):
        if shutil.which(tool) is None:
            return f"no {tool} here (Debian: apt-get install openssh-client)"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LocalSSHD:
    host = "127.0.0.1"

    def __init__(self, folder: Path):
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)
        self.key = folder / "id_ed25519"
        for path in (folder / "host_key", self.key):
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)
        (folder / "authorized_keys").write_text(self.key.with_suffix(".pub").read_text())
        os.chmod(folder / "authorized_keys", 0o600)
        self.port = _free_port()
        path = os.pathsep.join([str(Path(sys.executable).parent), "/usr/local/bin", "/usr/bin", "/bin"])
        config = folder / "sshd_config"
        config.write_text("\n".join([
            f"Port {self.port}", f"ListenAddress {self.host}", f'HostKey "{folder / "host_key"}"',
            f'AuthorizedKeysFile "{folder / "authorized_keys"}"', f'PidFile "{folder / "sshd.pid"}"',
            "PasswordAuthentication no", "KbdInteractiveAuthentication no", "PermitRootLogin prohibit-password",
            "StrictModes no", "UsePAM no", f"SetEnv PATH={path}", ""]))
        Path("/run/sshd").mkdir(exist_ok=True) if os.geteuid() == 0 else None  # privilege separation dir
        self.proc = subprocess.Popen([SSHD, "-D", "-e", "-f", str(config)], stderr=open(folder / "sshd.log", "w"))
        deadline = time.time() + 10
        while time.time() < deadline:
            try:
                socket.create_connection((self.host, self.port), timeout=0.5).close()
                return
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"sshd did not start: {(folder / 'sshd.log').read_text()}")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
