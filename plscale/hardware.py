"""What the host has, found without importing torch: GPUs (nvidia-smi), cores, memory, the hub."""

import functools
import os
import random
import shutil
import socket
import subprocess


def cuda_gpus() -> list[str]:
    """Names of the visible NVIDIA GPUs, from `nvidia-smi -L` (empty when there are none)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and visible.strip() in ("", "-1"):
        return []
    if not shutil.which("nvidia-smi"):
        return []
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    gpus = [line.split(":", 1)[1].split("(")[0].strip() for line in out.splitlines() if line.startswith("GPU ")]
    if visible:
        keep = [int(i) for i in visible.split(",") if i.strip().isdigit()]
        gpus = [gpus[i] for i in keep if i < len(gpus)]
    return gpus


def cpu_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def hub_reachable(timeout: float = 1.5) -> bool:
    """True when the Hugging Face hub answers a TCP connect; honours HF_HUB_OFFLINE=1."""
    if os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "", "false", "False"):
        return False
    return _hub_answers(timeout)


@functools.cache
def _hub_answers(timeout: float) -> bool:
    """Asked once per process: a sweep plans many runs; a rank loads data and a tokenizer."""
    try:
        with socket.create_connection(("huggingface.co", 443), timeout=timeout):
            return True
    except OSError:
        return False


def _ephemeral_low() -> int:
    """The lowest port the kernel hands out to outgoing connections (Linux: 32768 by default)."""
    try:
        return int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
    except (OSError, ValueError, IndexError):
        return 0


def free_port() -> int:
    """A free port for a rendezvous, below the kernel's ephemeral range where it can: there no
    outgoing connection (another run's gloo ranks, say) can take it between now and the launcher's
    bind. Otherwise whatever free port the kernel gives."""
    low = _ephemeral_low()
    if low > 12_000:
        for port in random.sample(range(10_000, low), 64):
            if not port_in_use(port):
                return port
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def port_in_use(port: int) -> bool:
    """Whether something on this machine already listens on `port` (the rendezvous could not bind it)."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as torch's store binds: a closing socket is no obstacle
        try:
            sock.bind(("", port))
        except OSError:
            return True
    return False


def memory_available(device: str) -> int | None:
    """Bytes free for buffers: the host's MemAvailable on CPU, the smallest GPU's total on CUDA
    (nvidia-smi); None when it cannot be told."""
    if device == "cuda":
        try:
            out = subprocess.run(["nvidia-smi", "--query-gpu=memory.total", "--format=csv,noheader,nounits"],
                                 capture_output=True, text=True, timeout=10).stdout
            return min(int(line) for line in out.split()) * 2**20
        except (OSError, ValueError, subprocess.SubprocessError):
            return None
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None
