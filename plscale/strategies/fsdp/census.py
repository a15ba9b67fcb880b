"""What one rank of an FSDP2 model holds, by the memory model's terms (plscale.predict.memory).

    parameters   every group's sharded parameters (its rows, padded to k = ceil(rows / N)), and
                 the gathered ones where a group holds them now (after forward without reshard)
    gradients    the sharded gradients (.grad of each DTensor parameter: this rank's rows)
    moments      Adam's exp_avg and exp_avg_sq, DTensors sharded like their parameters

Storages are counted once each (a view shares its buffer). FSDP2 keeps the sharded and gathered
tensors on its FSDPParam objects (torch.distributed.fsdp._fully_shard._fsdp_param, torch 2.13).
"""

import torch
from torch.distributed.tensor import DTensor


def _bytes(t, seen: set) -> int:
    if t is None:
        return 0
    local = t._local_tensor if isinstance(t, DTensor) else t
    storage = local.untyped_storage()
    if not storage.data_ptr() or storage.data_ptr() in seen:
        return 0
    seen.add(storage.data_ptr())
    return storage.nbytes()


def fsdp_params(model: torch.nn.Module) -> list:
    """The FSDPParam of every parameter, group by group (the layers', then the root's)."""
    found = []
    for module in model.modules():
        state = module._get_fsdp_state() if hasattr(module, "_get_fsdp_state") else None
        if state is not None and state._fsdp_param_group is not None:
            found += state._fsdp_param_group.fsdp_params
    return found


def states(model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None) -> dict:
    """{term: bytes} on this rank now (moments 0 without an optimizer)."""
    seen, held = set(), {"parameters": 0, "gradients": 0, "master": 0, "moments": 0}
    for p in fsdp_params(model):
        held["parameters"] += _bytes(p._sharded_param_data, seen)
        held["parameters"] += _bytes(getattr(p, "_unsharded_param", None), seen)   # freed storage: 0
        held["gradients"] += _bytes(p.sharded_param.grad, seen)
    for state in (optimizer.state.values() if optimizer else ()):
        held["moments"] += sum(_bytes(state.get(k), seen) for k in ("exp_avg", "exp_avg_sq"))
    return held
