"""Start and finish a JAX lab: one process holding every device (not one process per rank).

    ctx = runtime.start(__file__)   # args, settings, devices, seed, logs, run dir
    ...                             # the lesson, over ctx.devices
    ctx.finish(figures)             # summary.json, exit: the last line of a lab

Under `plscale lab run` the host has resolved the settings, the lab's checks and the
DeepSpeed config into the run directory (--run-dir), and its environment gives the process
its devices. Run by hand (`python labs/10_jax_gspmd/gspmd.py --set train.steps=5`) it
resolves them itself with the same code, on the lab's default count of simulated CPU
devices unless XLA_FLAGS names one, and makes a run directory. Without JAX, or with one
too old, it says so in the launcher's one line and exits 2.
"""

import os
import platform
import random
import socket
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from plscale.errors import UserError
from plscale.files import write_json
from plscale.lab import entry
from plscale.lab.jaxenv import DEVICE_COUNT, JAX_FLOOR, jax_problem, with_device_count
from plscale.lab.resolve import Topology
from plscale.lab.rundir import new_run_dir
from plscale.rank import logs
from plscale.rank.metrics import Metrics


@dataclass
class Context(entry.Context):
    """The run's inputs, run directory, metrics and checks (entry.Context), and the devices."""
    devices: list        # every device of this process: jax.devices()
    platform: str        # "cpu" or "gpu"
    is_main = True       # one process: it logs and writes everything

    @property
    def world_size(self) -> int:
        return len(self.devices)

    @property
    def backend(self) -> str:
        return f"xla-{self.platform}"


def describe(devices: list, platform_name: str) -> dict:
    """Versions and hardware of the run, for system.json."""
    import jax
    import jaxlib

    info = {"host": socket.gethostname(), "python": platform.python_version(), "jax": jax.__version__,
            "jaxlib": jaxlib.__version__, "platform": platform.platform(), "cpu_cores": os.cpu_count(),
            "backend": f"xla-{platform_name}", "world_size": len(devices),
            "devices": sorted({d.device_kind for d in devices}), "xla_flags": os.environ.get("XLA_FLAGS", "")}
    limit = (devices[0].memory_stats() or {}).get("bytes_limit")  # GPUs only; None on CPU
    if limit:
        info["gpu_memory_gib"] = round(limit / 2**30, 1)
    return info


def _hand_device_count(lab, args, entry_file: str) -> None:
    """Run by hand on CPU: the variant's (else the lab's) device count, unless XLA_FLAGS names
    one. XLA reads it when JAX first starts its CPU backend, so an `import jax` before is fine."""
    if args.run_dir or DEVICE_COUNT in os.environ.get("XLA_FLAGS", ""):
        return
    count = lab.variant_for(args.variant, Path(entry_file)).ranks or lab.default_ranks
    os.environ["XLA_FLAGS"] = with_device_count(os.environ.get("XLA_FLAGS", ""), count)


def _devices(lab_id: str) -> list:
    """jax.devices(); without a recent enough JAX, the launcher's one line."""
    if problem := jax_problem(lab_id):
        raise UserError(problem)
    try:
        import jax
    except ImportError as exc:  # installed (jax_problem found it) but broken
        raise UserError(f"JAX is installed but does not import ({exc}): reinstall it with "
                        f"pip install --force-reinstall 'jax>={JAX_FLOOR}' 'jaxlib>={JAX_FLOOR}'.") from None
    return jax.devices()


def start(entry_file: str, argv=None) -> Context:
    args = entry.arguments().parse_args(sys.argv[1:] if argv is None else argv)
    with entry.one_line_errors():
        lab = entry.lab_of(entry_file)
        _hand_device_count(lab, args, entry_file)
        devices = _devices(lab.id)
        platform_name = devices[0].platform  # "cpu" or "gpu"
        topology = Topology(len(devices), "cuda" if platform_name == "gpu" else "cpu")
        record, ds_config = entry.inputs(lab, args, entry_file, lambda: topology)
    variant, settings = record["variant"], record["settings"]

    run_dir = Path(args.run_dir) if args.run_dir else new_run_dir(lab.id, variant)
    logs.setup(run_dir, 0)
    seed = int(settings.get("seed", 0))  # numpy and random; JAX's keys are explicit (jax.random.key(seed))
    random.seed(seed)
    np.random.seed(seed)
    write_json(run_dir / "system.json", describe(devices, platform_name))
    entry.record_resolved(run_dir, args, record, ds_config)
    return Context(lab.id, variant, settings, ds_config, run_dir, Metrics(run_dir, 0), devices, platform_name)
