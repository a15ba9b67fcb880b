"""What a JAX lab needs of its environment, said the same way by the host's launch plan and by
the lab's one process run by hand: JAX at or above the floor, its CUDA plugin for GPUs, and the
XLA flag that gives the CPU platform N simulated devices. Imports nothing of JAX: it only looks.
"""

import re
from importlib.metadata import PackageNotFoundError, version
from importlib.util import find_spec

DEVICE_COUNT = "--xla_force_host_platform_device_count"     # XLA_FLAGS: devices of the CPU platform
CUDA_PLUGINS = ("jax_cuda12_plugin", "jax_cuda13_plugin")  # what JAX needs to see GPUs
JAX_FLOOR = "0.8.2"  # the oldest JAX the JAX labs run on: pyproject's [jax] extra says the same


def jax_problem(lab_id: str) -> str | None:
    """One line when JAX is missing or older than the JAX labs need, else None; imports nothing."""
    if find_spec("jax") is None:
        return missing_jax(lab_id)
    try:
        found = version("jax")
    except PackageNotFoundError:  # importable without an installed distribution (a source tree): trust it
        return None
    if _release(found) < _release(JAX_FLOOR):
        return (f"Lab {lab_id} needs JAX {JAX_FLOOR} or newer, and this environment has {found}: "
                f"pip install -U 'jax>={JAX_FLOOR}' (on GPUs 'jax[cuda12]>={JAX_FLOOR}'), then run it again.")
    return None


def has_cuda_plugin() -> bool:
    """Whether JAX can see GPUs here: one of its CUDA plugins is installed."""
    return any(find_spec(plugin) for plugin in CUDA_PLUGINS)


def jax_install() -> str:
    """How to get JAX, said the same way everywhere."""
    return f"pip install -e '.[jax]' in the plscale checkout (or pip install 'jax>={JAX_FLOOR}'; CPU wheels)"


def missing_jax(lab_id: str) -> str:
    return f"Lab {lab_id} needs JAX, an optional extra: {jax_install()}, then run it again."


def _release(text: str) -> tuple:
    """(major, minor, patch) of a version string: "0.9.0.1" -> (0, 9, 0), "0.10.3.dev1" -> (0, 10, 3)."""
    return tuple(int(n) for n in re.findall(r"\d+", text.split("+")[0])[:3])


def with_device_count(flags: str, n: int) -> str:
    """XLA_FLAGS that give the CPU platform n devices: a user's other flags kept, their count replaced."""
    kept = [flag for flag in flags.split() if not flag.startswith(DEVICE_COUNT)]
    return " ".join([*kept, f"{DEVICE_COUNT}={n}"])
