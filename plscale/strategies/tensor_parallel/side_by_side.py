"""The production paths trained beside the hand-written layers: same weights, same batches.

Each path starts from the dense model's initial weights (`initial`, a state dict), trains
`steps` optimizer steps on `batch(step)` with AdamW as the run's DeepSpeed config sets it,
and returns its losses and median step time (the first step, a warm-up, left out):

    hand-written  plscale's tensor-parallel Llama (layers.py), with torch's AdamW like the others
    dtensor    PyTorch DTensor: parallelize_module with Colwise/Rowwise (and SequenceParallel)
    autotp     DeepSpeed AutoTP: the dense model handed to deepspeed.initialize with
               tensor_parallel.autotp_size; DeepSpeed finds the projections and splits them
    megatron   plscale's tensor-parallel Llama with megatron-core's ColumnParallelLinear and
               RowParallelLinear in place of the hand-written ones (optional extra)

    if why_not("dtensor", sp) is None:
        losses, step_s = run("dtensor", config, initial, mesh, ds, sp, batch, 4, ctx.device)
"""

import statistics
import time

from plscale.rank.models.llama import Llama
from plscale.rank.optim import optimizer
from plscale.strategies.tensor_parallel import autotp_path, dtensor_path, megatron_path
from plscale.strategies.tensor_parallel.llama import TensorParallelLlama


def _torch_step(model, opt):
    def step(batches) -> float:
        total = 0.0
        for x, y in batches:
            loss = model(x, y) / len(batches)
            loss.backward()
            total += loss.item()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return total
    return step


def _engine_step(engine):
    def step(batches) -> float:
        total = 0.0
        for x, y in batches:
            loss = engine(x, y)
            engine.backward(loss)
            total += loss.item() / len(batches)
            engine.step()  # DeepSpeed counts micro-batches: it steps the optimizer after the last
        return total
    return step


def why_not(name: str, sp: bool) -> str | None:
    """Why path `name` cannot run here (with sequence parallelism `sp`), or None when it can."""
    if name == "autotp" and sp:
        return "DeepSpeed AutoTP splits layers, not sequences"
    if name == "megatron":
        return megatron_path.unavailable() or ("megatron-core sequence parallelism needs CUDA" if sp else None)
    return None


def build(name: str, config, initial: dict, mesh, ds: dict, sp: bool, device):
    """A step function for path `name` (one that can run: see why_not), from the weights `initial`."""
    dense = Llama(config)
    dense.load_state_dict(initial)
    group, tp = mesh.group("tp"), mesh.size("tp")
    if name == "hand-written":
        model = TensorParallelLlama(config, group, sequence_parallel=sp).to(device)
        model.load_dense(dense)
        return _torch_step(model, optimizer(model.parameters(), ds))
    if name == "dtensor":
        model = dtensor_path.parallelize(dense.to(device), group, sequence_parallel=sp)
        return _torch_step(model, optimizer(model.parameters(), ds))
    if name == "autotp":
        return _engine_step(autotp_path.initialize(dense.to(device), ds, tp, mesh))
    if name == "megatron":
        model = TensorParallelLlama(config, group, linears=megatron_path.linear_classes(group)).to(device)
        model.load_dense(dense.to(device))
        return _torch_step(model, optimizer(model.parameters(), ds))
    raise ValueError(f"unknown path {name!r}")


def run(name: str, config, initial: dict, mesh, ds: dict, sp: bool, batch, steps: int, device):
    """(losses, median step seconds) of `steps` steps of path `name`; first ask why_not."""
    step = build(name, config, initial, mesh, ds, sp, device)
    losses, times = [], []
    for k in range(steps):
        t0 = time.perf_counter()
        losses.append(step(batch(k)))
        times.append(time.perf_counter() - t0)
    return losses, statistics.median(times[1:])
