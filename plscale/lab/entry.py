"""What every lab's entry script does around its backend, PyTorch ranks or one JAX process:
read its command line, get the run's inputs, record them, keep its checks, write its summary.

Under `plscale lab run` the host has resolved the settings, the lab's checks and the DeepSpeed
config into the run directory (--run-dir). Without it (by hand, or under a plain launcher) the
script resolves them itself with the same code and records them in the run directory it makes.
A runtime (plscale.rank.runtime, plscale.jaxlab.runtime) starts a lab so:

    args = entry.arguments().parse_args(argv)
    with entry.one_line_errors():                 # a UserError: its one line, exit 2
        lab = entry.lab_of(entry_file)
        record, ds_config = entry.inputs(lab, args, entry_file, topology)
    ...                                           # the backend, the run directory, the logs
    entry.record_resolved(run_dir, args, record, ds_config)
    return Context(...)                           # an entry.Context: check, log, finish

Imports neither torch nor jax: each runtime brings its own.
"""

import argparse
import os
import sys
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from plscale.errors import UserError
from plscale.files import write_json
from plscale.lab.labs import Lab, load_lab
from plscale.lab.resolve import Topology, resolve_run
from plscale.lab.rundir import read_inputs

if TYPE_CHECKING:
    from plscale.rank.metrics import Metrics


def arguments() -> argparse.ArgumentParser:
    """The command line every entry script takes; a runtime may add its launcher's flags."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--run-dir", default=None, help="written by `plscale lab run`: settings and config are read there")
    # Without --run-dir (by hand, or under a plain launcher) the script resolves the run itself from these:
    parser.add_argument("--variant", default=None)
    parser.add_argument("--ds-config", default=None)
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--set", dest="sets", action="append", default=[])
    parser.add_argument("--profile", type=int, default=None)
    return parser


@contextmanager
def one_line_errors():
    """A UserError inside: its one line on stderr and its exit code (2), no traceback."""
    try:
        yield
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        os._exit(exc.exit_code)


def lab_of(entry_file: str) -> Lab:
    """The lab whose folder holds this entry script."""
    return load_lab(Path(entry_file).resolve().parent)


def inputs(lab: Lab, args, entry_file: str, topology: Callable[[], Topology]) -> tuple[dict, dict]:
    """(settings.json's record, DeepSpeed config): as the host wrote them into --run-dir, or
    resolved here exactly as `plscale lab run` would, on `topology()` (asked only then)."""
    if args.run_dir:
        if args.variant or args.ds_config or args.steps is not None or args.sets or args.profile is not None:
            raise UserError("--run-dir carries the settings: drop --variant, --ds-config, --steps, --set and --profile.")
        return read_inputs(Path(args.run_dir))
    variant = lab.variant_for(args.variant, Path(entry_file))
    run = resolve_run(lab, variant, topology(), args.sets, args.steps, args.ds_config, args.profile)
    return run.record(), run.ds_config


def record_resolved(run_dir: Path, args, record: dict, ds_config: dict) -> None:
    """Without --run-dir: write what this run resolved, as the host would have."""
    if not args.run_dir:
        write_json(run_dir / "ds_config.json", ds_config)
        write_json(run_dir / "settings.json", record)


@dataclass
class Context:
    """What a lab script holds from start to finish, whatever its backend. A runtime's Context
    adds its devices, `is_main`, `world_size` and `backend`, and may release them in `_shutdown`."""
    lab: str
    variant: str
    settings: dict
    ds_config: dict
    run_dir: Path
    metrics: "Metrics"
    checks: list = field(default_factory=list, kw_only=True)

    def log(self, *args) -> None:
        if self.is_main:
            print(*args, flush=True)

    def check(self, name: str, ok: bool, detail: str) -> None:
        """A property the lab asserts; a failed check makes the run exit 1."""
        self.checks.append({"name": name, "ok": bool(ok), "detail": detail})
        self.log(f"  [{'ok' if ok else 'FAIL'}] {name}: {detail}")

    def finish(self, figures: list, **extra) -> None:
        """summary.json, then exit: 0 when every check passed, else 1. The last line of a lab."""
        passed = all(c["ok"] for c in self.checks)
        self.metrics.summary(self.lab, self.variant, figures, checks=self.checks, passed=passed,
                             world_size=self.world_size, backend=self.backend, **extra)
        self._shutdown()
        # Leave without the interpreter's teardown: with every file written and the process
        # group destroyed, C++ destructors in the comm libraries have been seen to abort at
        # exit ("terminate called without an active exception", SIGABRT) on one rank in
        # dozens of runs, turning a finished run into a failed one.
        self.metrics.close()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0 if passed else 1)

    def _shutdown(self) -> None:
        """Release the backend before the exit; nothing to release by default."""
