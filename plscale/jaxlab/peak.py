"""The matmul peak of the JAX lab's devices: plscale.rank.peak's sweep, run by XLA (a jitted jnp.dot).

    peak = matmul_peak(devices)   # Peak(flops=..., engine="jax", ...): one device's best square GEMM
    mfu = model_flops_per_s / (peak.flops * shares)

On GPUs each device is its own chip: the peak is one device's, and a layout's MFU compares the
FLOP/s each device does with it. Without GPUs the lab's devices are simulated in one process
(XLA's --xla_force_host_platform_device_count) and share its cores: the peak is one device's
GEMM running alone on all of them, which is the most the whole process does, and MFU compares
the process's FLOP/s with it. Cached with torch's peaks ($XDG_CACHE_HOME/plscale/matmul_peak.json),
keyed by the device, JAX's version and the process's cores.
"""

import os
import time

import jax
import jax.numpy as jnp

from plscale.rank.peak import CPU_SIZES, GPU_SIZES, SECONDS_A_SHAPE, Peak, cached


def matmul_peak(devices: list) -> Peak:
    device = devices[0]
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    key = f"{device.device_kind} | float32 | {cores} cores | jax {jax.__version__}"
    return cached(key, lambda: _measure(device, cores))


def shares(devices: list) -> int:
    """What the peak is compared with: each device's FLOP/s on GPUs (n shares), the process's on CPU (1)."""
    return len(devices) if devices[0].platform != "cpu" else 1


def _measure(device, cores: int) -> Peak:
    gpu = device.platform != "cpu"
    seconds, rates = SECONDS_A_SHAPE["cuda" if gpu else "cpu"], {}
    for n in GPU_SIZES if gpu else CPU_SIZES:
        a = jax.device_put(jax.random.normal(jax.random.key(0), (n, n), jnp.float32), device)
        product = jax.jit(jnp.dot)
        product(a, a).block_until_ready()   # compiled and warm
        best, start = float("inf"), time.perf_counter()
        while time.perf_counter() - start < seconds:
            t0 = time.perf_counter()
            product(a, a).block_until_ready()
            best = min(best, time.perf_counter() - t0)
        rates[n] = 2 * n**3 / best
    n = max(rates, key=rates.get)
    return Peak(rates[n], n, "float32", device.device_kind, 0 if gpu else cores, engine="jax")
