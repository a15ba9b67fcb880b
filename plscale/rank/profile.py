"""One step of any lab, recorded on every rank: `plscale lab run LAB --profile STEP`.

The recording starts when the lab logs step STEP-1 (ctx.metrics.step) and stops when it logs
step STEP, so it holds exactly step STEP's work on every rank whatever the lab's loop looks
like, and the other steps run unprofiled. Each rank writes profile/rank{R}.json, torch.profiler's
Chrome trace (CPU ops, the comm library's threads, and on GPUs the kernels), and
profile/collectives{R}.json, the step's collectives from the Flight Recorder (plscale.rank.flight),
which know their process group where the trace's events do not. When the lab
finishes, rank 0 merges them (plscale.rank.trace): profile/trace.json, one process per rank,
which Perfetto (https://ui.perfetto.dev) and chrome://tracing open; profile/timeline.png; and
the figures a student looks for, added to the summary: how much of the communication was
hidden behind compute, each rank's idle time, the slowest rank.
"""

import json
import time
from pathlib import Path

import torch
import torch.distributed as dist

from plscale.rank import flight


class StepProfiler:
    def __init__(self, step: int, run_dir: Path, rank: int):
        self.step, self.rank = step, rank
        self.folder = Path(run_dir) / "profile"
        self.folder.mkdir(parents=True, exist_ok=True)
        self.profiler = None
        self.done = False    # once only: a lab may log the same step numbers again later (lab 05's bubble sweep)

    def on_step(self, step) -> None:
        """Called with every step the lab logs (train steps only)."""
        if step == self.step - 1 and self.profiler is None and not self.done:
            activities = [torch.profiler.ProfilerActivity.CPU]
            if torch.cuda.is_available():
                activities.append(torch.profiler.ProfilerActivity.CUDA)
            # record_shapes: the collectives' tensor sizes, from which the reader labels their bytes
            self.profiler = torch.profiler.profile(activities=activities, record_shapes=True)
            self.profiler.__enter__()
            self.began_ns = time.time_ns()
        elif step == self.step and self.profiler is not None:
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            self.profiler.__exit__(None, None, None)
            self.profiler.export_chrome_trace(str(self.folder / f"rank{self.rank}.json"))
            issued = flight.issued_between(self.began_ns, time.time_ns())   # each collective's group
            if issued is not None:
                (self.folder / f"collectives{self.rank}.json").write_text(json.dumps(issued))
            self.profiler, self.done = None, True

    def finish(self, world_size: int) -> list[dict]:
        """Every rank: wait for the others' traces; rank 0 merges them and returns the figures."""
        if dist.is_initialized():
            dist.barrier()
        if self.rank != 0:
            return []
        from plscale.rank import trace

        return trace.merge_run(self.folder, world_size, self.step)
