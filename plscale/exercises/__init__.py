"""Autograded exercises: a student writes the core of a strategy, hidden checks say whether it is right.

    plscale exercise start ring-allreduce     copies the skeleton to exercises/ring-allreduce.py
    plscale exercise check ring-allreduce     runs the checks on CPU ranks over gloo

Each exercise is a folder here: `skeleton.py` (the task in its docstring, the core left as
TODO raising NotImplementedError), `solution.py` (the project's reference solution, never
copied out) and `checks.py` (the properties, run inside every rank by `worker.py`). Host
side: importing this package never imports torch.
"""

from dataclasses import dataclass
from pathlib import Path

from plscale.errors import UserError, did_you_mean

HERE = Path(__file__).parent


@dataclass(frozen=True)
class Exercise:
    name: str                  # what `plscale exercise` takes
    topic: str                 # one line for `plscale exercise list`
    lab: str                   # the lab it goes with (its folder under labs/)
    worlds: tuple[int, ...]    # the rank counts the checks run on, in turn

    @property
    def package(self) -> str:
        return self.name.replace("-", "_")

    @property
    def folder(self) -> Path:
        return HERE / self.package

    @property
    def skeleton(self) -> Path:
        return self.folder / "skeleton.py"

    @property
    def solution(self) -> Path:
        return self.folder / "solution.py"

    @property
    def ranks(self) -> str:
        return ", ".join(map(str, self.worlds))


EXERCISES = {e.name: e for e in (
    Exercise("ring-allreduce", "ring all-reduce over send/recv: reduce-scatter, then all-gather",
             "03_collectives", (2, 3, 4)),
    Exercise("bucketed-ddp", "DDP by hand: gradients all-reduced in buckets, each started as the backward makes it",
             "02_imdb_ddp", (2, 4)),
    Exercise("zero-memory", "bytes per rank of parameters, gradients and optimizer states at ZeRO stages 0-3",
             "04_zero", (1,)),
    Exercise("zero1", "ZeRO-1 around any torch optimizer: each rank steps its shard, then all-gather",
             "04_zero", (2, 4)),
    Exercise("fsdp", "FSDP by hand: each layer's shard all-gathered before its forward, its gradient reduce-scattered",
             "04_zero", (2, 4)),
    Exercise("pipeline-schedule", "GPipe and 1F1B: the order of forwards and backwards of a stage, run over p2p",
             "05_pipeline", (2, 4)),
    Exercise("tp-column", "Megatron's f and g as autograd functions, and a column-parallel linear",
             "07_tensor_parallel", (2, 4)),
)}


def find(name: str) -> Exercise:
    """The exercise called `name`, or one line naming the closest ones."""
    if name not in EXERCISES:
        raise UserError(f"No exercise called {name!r}.{did_you_mean(name, EXERCISES)} "
                        f"`plscale exercise list` shows them all.")
    return EXERCISES[name]
