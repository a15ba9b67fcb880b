"""The gradient reductions a data-parallel engine really issues, counted as it runs: DDP's
through a comm hook (it runs once per bucket), DeepSpeed's from its comms logger. Each counter
returns (calls so far, seconds so far); a lab takes differences around a micro-batch or a step.

    reductions = ddp_reductions(net)      # DDP: registers the counting hook, before training
    reductions = deepspeed_reductions     # DeepSpeed, also under accelerate (ds.comms_logger on)
    calls0, seconds0 = reductions()
"""

import time

from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

from plscale.rank import comms


class _Count:
    calls, seconds = 0, 0.0


def _counting_allreduce(state: _Count, bucket):
    state.calls += 1
    start = time.perf_counter()
    future = allreduce_hook(None, bucket)  # divide by N, all_reduce (async: backward goes on)

    def done(fut):
        state.seconds += time.perf_counter() - start  # issue to completion
        return fut.value()
    return future.then(done)


def ddp_reductions(net):
    """Count the all-reduces DDP issues for `net` (a DistributedDataParallel): one per bucket."""
    count = _Count()
    net.register_comm_hook(count, _counting_allreduce)
    return lambda: (count.calls, count.seconds)


def deepspeed_reductions() -> tuple[int, float]:
    """Gradient reductions DeepSpeed's comms logger saw so far (all_reduce, reduce_scatter, ...): calls of
    1 KiB or more (not the scalars, e.g. the gradient norm for clipping), and seconds of all of them."""
    calls = sum(n for op, sizes in comms.calls_by_size().items() if "reduce" in op
                for size, n in sizes.items() if size >= 1024)
    return calls, sum(t.seconds for op, t in comms.snapshot().items() if "reduce" in op)
