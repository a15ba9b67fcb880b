"""Start and finish a lab inside each rank.

    ctx = runtime.start(__file__)   # args, settings, distributed init, seed, logs, run dir
    ...                             # the lesson
    ctx.finish(figures)             # summary.json, shutdown, exit: the last line of a lab

Under `plscale lab run` the host has resolved the settings, the lab's checks and the
DeepSpeed config once and written them into the run directory (--run-dir): the ranks
read them there. Under the plain `deepspeed` launcher or `torchrun` (no --run-dir) each
rank resolves them itself with the same code, and rank 0 makes a run directory.
"""

import argparse
import os
import sys
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.distributed as dist

from plscale.errors import UserError
from plscale.files import write_json
from plscale.rank import distributed, logs
from plscale.rank.metrics import Metrics
from plscale.rank.system import describe
from plscale.run.labs import load_lab
from plscale.run.resolve import Topology, resolve_run
from plscale.run.rundir import new_run_dir, read_inputs


@dataclass
class Context:
    lab: str
    variant: str
    settings: dict
    ds_config: dict
    run_dir: Path
    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    backend: str
    metrics: Metrics
    checks: list = field(default_factory=list)

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def log(self, *args) -> None:
        if self.is_main:
            print(*args, flush=True)

    def check(self, name: str, ok: bool, detail: str) -> None:
        """A property the lab asserts; a failed check makes the run exit 1."""
        self.checks.append({"name": name, "ok": bool(ok), "detail": detail})
        self.log(f"  [{'ok' if ok else 'FAIL'}] {name}: {detail}")

    def finish(self, figures: list, **extra) -> None:
        passed = all(c["ok"] for c in self.checks)
        self.metrics.summary(self.lab, self.variant, figures, checks=self.checks, passed=passed,
                             world_size=self.world_size, backend=self.backend, **extra)
        distributed.shutdown()
        # Leave without the interpreter's teardown: with every file written and the process
        # group destroyed, C++ destructors in the comm libraries have been seen to abort at
        # exit ("terminate called without an active exception", SIGABRT) on one rank in
        # dozens of runs, turning a finished run into a failed one.
        self.metrics.close()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0 if passed else 1)


def _args(argv):
    parser = argparse.ArgumentParser()
    parser.add_argument("--run-dir", default=None, help="written by `plscale lab run`: settings and config are read there")
    # Under a plain launcher (no --run-dir) the rank resolves the run itself from these:
    parser.add_argument("--variant", default=None)
    parser.add_argument("--ds-config", default=None)
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--set", dest="sets", action="append", default=[])
    parser.add_argument("--local_rank", "--local-rank", type=int, default=None)  # from the deepspeed launcher
    return parser.parse_args(argv)


def _inputs(lab, args, entry_file: str) -> tuple[str, dict, dict]:
    """(variant, settings, DeepSpeed config): as the host wrote them into the run directory,
    or, under a plain launcher, resolved here exactly as `plscale lab run` would."""
    if args.run_dir:
        if args.variant or args.ds_config or args.steps is not None or args.sets:
            raise UserError("--run-dir carries the settings: drop --variant, --ds-config, --steps and --set.")
        record, ds_config = read_inputs(Path(args.run_dir))
        return record["variant"], record["settings"], ds_config
    topology = Topology(int(os.environ.get("WORLD_SIZE", 1)), distributed.device_type())
    run = resolve_run(lab, lab.variant_for(args.variant, Path(entry_file)), topology, args.sets, args.steps, args.ds_config)
    return run.variant.name, run.settings, run.ds_config


def start(entry_file: str, argv=None) -> Context:
    # Deprecation notices from inside DeepSpeed's calls and from walking live objects (the
    # memory census): noise to a student, nothing the lab can act on.
    warnings.filterwarnings("ignore", message=r".*torch\.distributed\.(all_gather_into_tensor|reduce_op)`? is deprecated")
    args = _args(sys.argv[1:] if argv is None else argv)
    if args.local_rank is not None:
        os.environ.setdefault("LOCAL_RANK", str(args.local_rank))
    lab = load_lab(Path(entry_file).resolve().parent)
    try:
        variant, settings, ds_config = _inputs(lab, args, entry_file)
    except UserError as exc:  # every rank says the same one line; no traceback, no collective
        print(f"error: {exc}", file=sys.stderr, flush=True)
        os._exit(exc.exit_code)

    d = distributed.init()
    run_dir = Path(args.run_dir) if args.run_dir else _shared_run_dir(lab.id, variant, d.rank)
    logs.setup(run_dir, d.rank)
    distributed.seed_everything(int(settings.get("seed", 0)))
    if d.rank == 0:
        write_json(run_dir / "system.json", describe(d.backend, d.world_size))
        if not args.run_dir:  # a plain launcher: record what this run resolved
            write_json(run_dir / "ds_config.json", ds_config)
            write_json(run_dir / "settings.json", {"lab": lab.id, "variant": variant, "settings": settings,
                                                   "ds_config": args.ds_config or "generated from settings.ds"})
    return Context(lab.id, variant, settings, ds_config, run_dir, d.rank, d.world_size, d.local_rank,
                   d.device, d.backend, Metrics(run_dir, d.rank))


def _shared_run_dir(lab_id: str, variant: str, rank: int) -> Path:
    """Rank 0 picks the run directory and tells the others."""
    holder = [str(new_run_dir(lab_id, variant)) if rank == 0 else None]
    dist.broadcast_object_list(holder, src=0)
    return Path(holder[0])
