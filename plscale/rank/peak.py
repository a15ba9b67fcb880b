"""The matmul peak a rank reaches: the best large GEMM of its device, measured once and cached.

A datasheet's dense peak is a ceiling no real kernel reaches; MFU against it says how far the
whole run is from the silicon. The measured peak says how far the run is from the best this
device, this torch and this many threads do on a plain matrix product, the way Stas Bekman's
MAMF finder (ml-engineering, "Maximum Achievable Matmul FLOPS") measures it: time a sweep of
square shapes, keep the fastest. On a CPU it is the only peak there is: the cores a rank gets
(torch.get_num_threads()), in the run's precision.

    peak = matmul_peak(device, torch.float32)   # Peak(flops=4.1e10, shape=768, ...)

Cached per device name, precision, thread count, ranks on the machine (how many share its
cores) and torch version in $XDG_CACHE_HOME/plscale/matmul_peak.json (~/.cache by default;
PLSCALE_PEAK_CACHE names another file, an empty value measures every time). The
sweep takes about a second a precision on a CPU with native kernels for it (longer for bf16 or
fp16 on one without) and a few seconds on a GPU, once per machine. On a GPU the sweep's matrices
are freed and the allocator's peak reset after it, so the lab's memory figures do not see them.
"""

import json
import os
import platform
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from plscale.files import write_json

CPU_SIZES = (256, 512, 768, 1024)          # n x n @ n x n: 2 n^3 FLOPs
GPU_SIZES = (2048, 4096, 6144, 8192)   # 8192^2 fp32: 256 MiB a matrix
SECONDS_A_SHAPE = {"cpu": 0.25, "cuda": 0.5}


@dataclass(frozen=True)
class Peak:
    flops: float     # FLOP/s of the best shape
    shape: int       # its n
    dtype: str       # "float32", "bfloat16", ...
    device: str      # the device's name
    threads: int     # CPU threads of the rank (torch.get_num_threads()); GPUs: 0
    engine: str = "torch"   # whose matmul: torch's, or jax's (jnp.dot, jitted)

    def describe(self) -> str:
        where = f"{self.threads} thread{'s' * (self.threads != 1)}" if self.threads else self.device
        how = "measured matmul" if self.engine == "torch" else f"measured {self.engine} matmul"
        return f"{self.flops / 1e9:,.1f} GFLOP/s {self.dtype} ({how}, {where}, n={self.shape})"


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _cache_file() -> Path | None:
    named = os.environ.get("PLSCALE_PEAK_CACHE")
    if named is not None:
        return Path(named) if named else None
    try:
        base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    except RuntimeError:  # no home directory to be found: measure every time
        return None
    return base / "plscale" / "matmul_peak.json"


def _local_ranks() -> str:
    """The ranks on this machine, as torchrun (LOCAL_WORLD_SIZE) or the deepspeed launcher (LOCAL_SIZE) say."""
    return os.environ.get("LOCAL_WORLD_SIZE") or os.environ.get("LOCAL_SIZE") or "1"


def _timed_flops(n: int, dtype: torch.dtype, device: torch.device, seconds: float) -> float:
    """FLOP/s of n x n @ n x n, the best of repeated calls within `seconds` (after one warm-up)."""
    draws = torch.Generator(device=device).manual_seed(0)   # its own stream: the run's seeded one untouched
    a, b = (torch.randn(n, n, device=device, generator=draws).to(dtype) for _ in range(2))
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    calls = 4 if device.type == "cuda" else 1   # a GPU's kernels queue: time a few between syncs
    a @ b
    sync()
    best, start = float("inf"), time.perf_counter()
    while time.perf_counter() - start < seconds:
        t0 = time.perf_counter()
        for _ in range(calls):
            a @ b
        sync()
        best = min(best, (time.perf_counter() - t0) / calls)
    return 2 * n**3 / best


def measure(device: torch.device, dtype: torch.dtype) -> Peak:
    sizes = GPU_SIZES if device.type == "cuda" else CPU_SIZES
    seconds = SECONDS_A_SHAPE["cuda" if device.type == "cuda" else "cpu"]
    rates = {}
    for n in sizes:
        try:
            rates[n] = _timed_flops(n, dtype, device, seconds)
        except torch.OutOfMemoryError:  # a GPU already nearly full: the sizes that fit
            break
    if device.type == "cuda":  # the sweep's matrices out of the allocator and out of its peak
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    if not rates:
        raise RuntimeError(f"no {dtype} matmul of {sizes[0]} x {sizes[0]} fits on {device_name(device)}")
    n = max(rates, key=rates.get)
    return Peak(rates[n], n, str(dtype).removeprefix("torch."), device_name(device),
                0 if device.type == "cuda" else torch.get_num_threads())


def matmul_peak(device: torch.device, dtype: torch.dtype) -> Peak:
    """The cached peak of this device, precision, threads, ranks and torch; measured when absent."""
    threads = 0 if device.type == "cuda" else torch.get_num_threads()
    key = (f"{device_name(device)} | {str(dtype).removeprefix('torch.')} | {threads} threads | "
           f"{_local_ranks()} ranks | torch {torch.__version__}")
    return cached(key, lambda: measure(device, dtype))


def cached(key: str, measure_now) -> Peak:
    """The peak saved under `key`, else `measure_now()`'s, saved (JAX's lab measures its own: jaxlab/peak.py)."""
    file = _cache_file()
    try:
        saved = json.loads(file.read_text()) if file else {}
        saved = saved if isinstance(saved, dict) else {}
    except (OSError, ValueError):
        saved = {}
    try:
        return Peak(**saved[key])
    except (KeyError, TypeError):  # not measured yet, or written by another version of this file
        pass
    peak = measure_now()
    if file:
        try:
            write_json(file, {**saved, key: asdict(peak)})  # whole or not at all; ranks race harmlessly
        except OSError:
            pass  # a read-only home: measured again next time
    return peak
