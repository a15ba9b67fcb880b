"""Start and finish a lab inside each rank.

    ctx = runtime.start(__file__)   # args, settings, distributed init, seed, logs, run dir
    ...                             # the lesson
    ctx.finish(figures)             # summary.json, shutdown, exit: the last line of a lab

Under `plscale lab run` the host has resolved the settings, the lab's checks and the
DeepSpeed config once and written them into the run directory (--run-dir): the ranks
read them there. Under the plain `deepspeed` launcher or `torchrun` (no --run-dir) each
rank resolves them itself with the same code, and rank 0 makes a run directory.
"""

import os
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist

from plscale.files import write_json
from plscale.lab import entry
from plscale.lab.resolve import Topology
from plscale.lab.rundir import new_run_dir
from plscale.rank import distributed, flight, logs
from plscale.rank.metrics import Metrics
from plscale.rank.profile import StepProfiler
from plscale.rank.system import describe


@dataclass
class Context(entry.Context):
    """The run's inputs, run directory, metrics and checks (entry.Context), and this rank."""
    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    backend: str

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def finish(self, figures: list, **extra) -> None:
        if self.metrics.profiler is not None:  # --profile: every rank's trace merged, its figures added
            figures = figures + self.metrics.profiler.finish(self.world_size)
        super().finish(figures, **extra)

    def _shutdown(self) -> None:
        distributed.shutdown()


def start(entry_file: str, argv=None) -> Context:
    # Deprecation notices from inside DeepSpeed's calls and from walking live objects (the
    # memory census): noise to a student, nothing the lab can act on.
    warnings.filterwarnings("ignore", message=r".*torch\.distributed\.(all_gather_into_tensor|reduce_op)`? is deprecated")
    parser = entry.arguments()
    parser.add_argument("--local_rank", "--local-rank", type=int, default=None)  # from the deepspeed launcher
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    if args.local_rank is not None:
        os.environ.setdefault("LOCAL_RANK", str(args.local_rank))
    with entry.one_line_errors():  # every rank says the same one line; no traceback, no collective
        lab = entry.lab_of(entry_file)
        record, ds_config = entry.inputs(lab, args, entry_file, _topology)
    variant, settings = record["variant"], record["settings"]

    # On GPUs NCCL's watchdog dumps the Flight Recorder itself on a timeout, where no Python handler
    # of this rank would run (not yet tried on a GPU here)
    if args.run_dir and distributed.device_type() == "cuda":
        folder = Path(args.run_dir) / "flight"
        folder.mkdir(exist_ok=True)
        os.environ.setdefault("TORCH_NCCL_DUMP_ON_TIMEOUT", "1")
        os.environ.setdefault("TORCH_FR_DUMP_TEMP_FILE", str(folder / "rank_"))
    knobs = settings.get("dist", {})  # a lab may set them: {timeout_s: 20, debug: DETAIL} (lab 12)
    d = distributed.init(knobs.get("timeout_s"), knobs.get("debug"))
    run_dir = Path(args.run_dir) if args.run_dir else _shared_run_dir(lab.id, variant, d.rank)
    logs.setup(run_dir, d.rank)
    flight.answer_requests(run_dir, d.rank)  # `plscale stacks` asks every rank for its Flight Recorder record
    distributed.seed_everything(int(settings.get("seed", 0)))
    if d.rank == 0:
        write_json(run_dir / "system.json", describe(d.backend, d.world_size))
        entry.record_resolved(run_dir, args, record, ds_config)
    metrics = Metrics(run_dir, d.rank)
    if record.get("profile") is not None:
        metrics.profiler = StepProfiler(record["profile"], run_dir, d.rank)
    return Context(lab.id, variant, settings, ds_config, run_dir, metrics, d.rank, d.world_size,
                   d.local_rank, d.device, d.backend)


def _topology() -> Topology:
    """Under a plain launcher: the launcher's world size, on this machine's device."""
    return Topology(int(os.environ.get("WORLD_SIZE", 1)), distributed.device_type())


def _shared_run_dir(lab_id: str, variant: str, rank: int) -> Path:
    """Rank 0 picks the run directory and tells the others."""
    holder = [str(new_run_dir(lab_id, variant)) if rank == 0 else None]
    dist.broadcast_object_list(holder, src=0)
    return Path(holder[0])
