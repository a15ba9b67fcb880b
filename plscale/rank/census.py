"""A census of live tensors: how many bytes each kind of training state holds on this rank.

On CPUs the allocator cannot tell ZeRO stages apart (resident memory is mostly libraries),
so we count tensors instead: walk every live tensor, count each storage once, and label it
by what owns it. DeepSpeed's ZeRO optimizer keeps its state in named buffers; `zero_states`
gathers them by role:

    parameters   the model's weights (under ZeRO-3 each rank's partition, `param.ds_tensor`)
    buffers      ZeRO's reduce buckets (reduce_bucket_size) and offload staging buffers
    gradients    param.grad, and the optimizer's gradient partitions and accumulators
    master       the optimizer's fp32 copy of the weights it updates
    moments      Adam's exp_avg and exp_avg_sq (optimizer.state)
    other        every other live tensor: data, RoPE tables, ...

The role names are the memory model's terms (`plscale.predict.memory.MODEL_STATES` and
`LABELS`), so a census and a prediction line up key by key; buffers and other are
measured only.

Tensors held only by C++ (the autograd graph's saved activations) are invisible here;
`saved_activations` counts those with a saved-tensors hook instead.
"""

import gc
import weakref
from collections import defaultdict

import torch

STAGING = ("temp_grad_buffer_for_cpu_offload", "temp_grad_buffer_for_gpu_offload")  # ZeRO-1/2 offload


def _tensors(obj, depth: int = 3):
    """Tensors inside obj: a tensor, or nested lists, tuples and dicts of them."""
    if torch.is_tensor(obj):
        yield obj
    elif depth > 0 and isinstance(obj, (list, tuple)):
        for item in obj:
            yield from _tensors(item, depth - 1)
    elif depth > 0 and isinstance(obj, dict):
        for item in obj.values():
            yield from _tensors(item, depth - 1)


def _storage(t: torch.Tensor):
    """(key, bytes) of the memory behind t; views of one buffer share a key. Storages that
    hold no memory (freed, or ZeRO-3's emptied parameters) count 0."""
    storage = t.untyped_storage()
    return (str(t.device), storage.data_ptr()), storage.nbytes() if storage.data_ptr() else 0


def zero_states(engine) -> dict[str, list]:
    """Tensors by role in a DeepSpeed engine at any ZeRO stage (0-3, offload or not)."""
    params = list(engine.module.parameters())
    zero = engine.optimizer                          # DeepSpeed's ZeRO wrapper, or the torch optimizer
    inner = getattr(zero, "optimizer", zero)         # the torch (or DeepSpeed CPU) Adam that steps
    # ZeRO keeps its fp32 master partitions in these (ZeRO-3 hands them to Adam only inside step()).
    masters = [p for group in inner.param_groups for p in group["params"]]
    masters += [t for name in ("single_partition_of_fp32_groups", "fp32_partitioned_groups_flat")
                for t in _tensors(getattr(zero, name, None))]
    grads = [p.grad for p in params + masters if p.grad is not None]
    if zero is not inner:  # ZeRO's own gradient buffers: every attribute with 'grad' in its name
        grads += [t for name, value in vars(zero).items() if "grad" in name.lower() for t in _tensors(value)]
    # Gradients wait in reduce buckets (and, with offload, in staging buffers the size of
    # the largest parameter); stale .grad views of a bucket count as the bucket's.
    buffers = [t for bucket in getattr(zero, "ipg_buckets", {}).values() for t in _tensors(getattr(bucket, "buffer", None))]
    buffers += [t for name in STAGING for t in _tensors(getattr(zero, name, None))]
    return {"parameters": params + [p.ds_tensor for p in params if hasattr(p, "ds_tensor")],
            "buffers": buffers,
            "gradients": grads,
            "master": masters,
            "moments": [t for state in inner.state.values() for t in _tensors(state)]}


def census(groups: dict[str, list]) -> dict[str, int]:
    """Bytes per role, each storage counted once (first role wins), plus 'other' for the rest."""
    gc.collect()
    owner, size = {}, {}
    for role, tensors in groups.items():
        for t in tensors:
            key, nbytes = _storage(t)
            if nbytes and key not in owner:
                owner[key], size[key] = role, nbytes
    for obj in gc.get_objects():
        if torch.is_tensor(obj) and obj.device.type != "meta":
            key, nbytes = _storage(obj)
            if nbytes and key not in owner:
                owner[key], size[key] = "other", nbytes
    out = defaultdict(int, {role: 0 for role in (*groups, "other")})
    for key, role in owner.items():
        out[role] += size[key]
    return dict(out)


class saved_activations(torch.autograd.graph.saved_tensors_hooks):
    """Count the bytes autograd saves for the backward pass (parameters excluded), each
    storage once:  `with saved_activations() as acts: loss = model(x, y)`;  acts.bytes."""

    def __init__(self):
        self.seen, self.bytes = set(), 0

        def pack(t):
            weight = isinstance(t, torch.nn.Parameter) or isinstance(t._base, torch.nn.Parameter)
            if not weight and t.device.type != "meta":
                key, nbytes = _storage(t)
                if key not in self.seen:
                    self.seen.add(key)
                    self.bytes += nbytes
            return t

        super().__init__(pack, lambda t: t)

    def __enter__(self):
        super().__enter__()
        return self


class _Saved:
    """What autograd keeps for one saved tensor while `activations_in_flight` watches."""
    __slots__ = ("tensor", "__weakref__")

    def __init__(self, tensor):
        self.tensor = tensor


class activations_in_flight(torch.autograd.graph.saved_tensors_hooks):
    """Bytes saved for backward that are alive now, and their peak, across many forwards and
    backwards (a pipeline's micro-batches in flight). A saved tensor counts from the forward
    that saves it until autograd lets it go, after the backward that used it; each storage
    once. `with activations_in_flight() as acts: ...schedule...`;  acts.peak, acts.now."""

    def __init__(self):
        self.live, self.now, self.peak = {}, 0, 0  # storage key -> [bytes, holders]

        def pack(t):
            weight = isinstance(t, torch.nn.Parameter) or isinstance(t._base, torch.nn.Parameter)
            if weight or t.device.type == "meta":
                return t
            key, nbytes = _storage(t)
            entry = self.live.setdefault(key, [nbytes, 0])
            if entry[1] == 0:
                self.now += nbytes
                self.peak = max(self.peak, self.now)
            entry[1] += 1
            holder = _Saved(t)
            weakref.finalize(holder, self._release, key)
            return holder

        super().__init__(pack, lambda h: h.tensor if isinstance(h, _Saved) else h)

    def _release(self, key) -> None:
        entry = self.live[key]
        entry[1] -= 1
        if entry[1] == 0:
            self.now -= entry[0]
            del self.live[key]

    def __enter__(self):
        super().__enter__()
        return self
