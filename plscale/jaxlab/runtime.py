"""Start and finish a JAX lab: one process holding every device (not one process per rank).

    ctx = runtime.start(__file__)   # args, settings, devices, seed, logs, run dir
    ...                             # the lesson, over ctx.devices
    ctx.finish(figures)             # summary.json, exit: the last line of a lab

Under `plscale lab run` the host has resolved the settings, the lab's checks and the
DeepSpeed config into the run directory (--run-dir), and its environment gives the process
its devices. Run by hand (`python labs/10_jax_gspmd/gspmd.py --set train.steps=5`) it
resolves them itself with the same code, on the lab's default count of simulated CPU
devices unless XLA_FLAGS names one, and makes a run directory.
"""

import argparse
import os
import platform
import random
import socket
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from plscale.errors import UserError
from plscale.files import write_json
from plscale.rank import logs
from plscale.rank.metrics import Metrics
from plscale.run.labs import load_lab
from plscale.run.launch import DEVICE_COUNT, with_device_count
from plscale.run.resolve import Topology, resolve_run
from plscale.run.rundir import new_run_dir, read_inputs


@dataclass
class Context:
    lab: str
    variant: str
    settings: dict
    ds_config: dict
    run_dir: Path
    devices: list        # every device of this process: jax.devices()
    platform: str        # "cpu" or "gpu"
    metrics: Metrics
    checks: list = field(default_factory=list)
    is_main: bool = True  # one process: it logs and writes everything

    @property
    def world_size(self) -> int:
        return len(self.devices)

    @property
    def backend(self) -> str:
        return f"xla-{self.platform}"

    def log(self, *args) -> None:
        print(*args, flush=True)

    def check(self, name: str, ok: bool, detail: str) -> None:
        """A property the lab asserts; a failed check makes the run exit 1."""
        self.checks.append({"name": name, "ok": bool(ok), "detail": detail})
        self.log(f"  [{'ok' if ok else 'FAIL'}] {name}: {detail}")

    def finish(self, figures: list, **extra) -> None:
        passed = all(c["ok"] for c in self.checks)
        self.metrics.summary(self.lab, self.variant, figures, checks=self.checks, passed=passed,
                             world_size=self.world_size, backend=self.backend, **extra)
        self.metrics.close()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0 if passed else 1)  # like the torch runtime: no teardown of the runtime's threads


def _args(argv):
    parser = argparse.ArgumentParser()
    parser.add_argument("--run-dir", default=None, help="written by `plscale lab run`: settings and config are read there")
    # Run by hand (no --run-dir) the process resolves the run itself from these:
    parser.add_argument("--variant", default=None)
    parser.add_argument("--ds-config", default=None)
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--set", dest="sets", action="append", default=[])
    return parser.parse_args(argv)


def _inputs(lab, args, entry_file: str, topology) -> tuple[str, dict, dict]:
    """(variant, settings, DeepSpeed config): as the host wrote them, or resolved here as
    `plscale lab run` would."""
    if args.run_dir:
        if args.variant or args.ds_config or args.steps is not None or args.sets:
            raise UserError("--run-dir carries the settings: drop --variant, --ds-config, --steps and --set.")
        record, ds_config = read_inputs(Path(args.run_dir))
        return record["variant"], record["settings"], ds_config
    variant = lab.variant_for(args.variant, Path(entry_file))
    run = resolve_run(lab, variant, topology, args.sets, args.steps, args.ds_config)
    return run.variant.name, run.settings, run.ds_config


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


def start(entry_file: str, argv=None) -> Context:
    args = _args(sys.argv[1:] if argv is None else argv)
    try:
        lab = load_lab(Path(entry_file).resolve().parent)
        _hand_device_count(lab, args, entry_file)
        import jax

        devices = jax.devices()
        platform_name = devices[0].platform  # "cpu" or "gpu"
        topology = Topology(len(devices), "cuda" if platform_name == "gpu" else "cpu")
        variant, settings, ds_config = _inputs(lab, args, entry_file, topology)
    except UserError as exc:  # one line, no traceback
        print(f"error: {exc}", file=sys.stderr, flush=True)
        os._exit(exc.exit_code)

    run_dir = Path(args.run_dir) if args.run_dir else new_run_dir(lab.id, variant)
    logs.setup(run_dir, 0)
    seed = int(settings.get("seed", 0))  # numpy and random; JAX's keys are explicit (jax.random.key(seed))
    random.seed(seed)
    np.random.seed(seed)
    write_json(run_dir / "system.json", describe(devices, platform_name))
    if not args.run_dir:  # by hand: record what this run resolved
        write_json(run_dir / "ds_config.json", ds_config)
        write_json(run_dir / "settings.json", {"lab": lab.id, "variant": variant, "settings": settings,
                                               "ds_config": args.ds_config or "generated from settings.ds"})
    return Context(lab.id, variant, settings, ds_config, run_dir, devices, platform_name, Metrics(run_dir, 0))
