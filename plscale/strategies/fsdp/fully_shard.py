"""FSDP2 on plscale's Llama, as torchtitan applies it: every decoder layer its own group, then the root.

`fully_shard(module, mesh=...)` turns each of the module's parameters into a DTensor sharded on
dim 0 over the mesh: rank r keeps rows [r k, (r + 1) k) of every weight (k = ceil(rows / N)). A
group's parameters are gathered by one all-gather just before its forward, and its gradients
leave by one reduce-scatter as soon as its backward is done:

    forward    all-gather layer 0 | compute | (free) | all-gather layer 1 | compute | ...
    backward   ... all-gather layer 1 | compute | reduce-scatter layer 1's gradients | ...

    reshard_after_forward True    free after forward, gather again in backward: ZeRO-3's schedule
                                  (2 all-gathers a group and micro-batch, 4Ψ/N held between them)
    reshard_after_forward False   keep the gathered parameters until the backward is done: ZeRO-2's
                                  memory during the step (+ the whole 4Ψ), half the all-gathers

The root group (the embedding, its tied head, the final norm) is gathered first and, with the
layers', split the same way. On a 2D mesh (replicate, shard) FSDP2 is HSDP: shard inside a
group of ranks, replicate across groups, the gradients reduce-scattered inside and then
all-reduced across.

There is no separate fp32 master copy: the sharded parameters are the optimizer's (in fp32), and
FSDP2's mixed precision casts them to bf16 as it gathers them, reducing the gradients in fp32
(DeepSpeed's bf16 keeps bf16 parameters and an fp32 master partition beside them).

    model = on_meta(config, mesh, reshard=True)   # no memory yet: shapes only, sharded
    load_full(model, dense.state_dict())          # rank 0's whole weights, each rank keeps its shard
"""

from collections.abc import Callable

import torch
from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

from plscale.predict.presets import ModelConfig
from plscale.rank.models.llama import Llama

MIXED = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)


def shard(model: Llama, mesh: DeviceMesh, reshard: bool, mixed: bool = False, compile: bool = False) -> Llama:
    """Each decoder layer one FSDP2 group, then the root (what is left); in place. `compile`: each
    layer torch.compile'd first, as torchtitan does it (one graph a layer; FSDP2's gathers and
    reduce-scatters stay outside the graphs, in its hooks)."""
    policy = MIXED if mixed else MixedPrecisionPolicy()
    for layer in model.layers:
        if compile:
            layer.compile()
        fully_shard(layer, mesh=mesh, reshard_after_forward=reshard, mp_policy=policy)
    fully_shard(model, mesh=mesh, reshard_after_forward=reshard, mp_policy=policy)
    return model


def on_meta(config: ModelConfig | Callable, mesh: DeviceMesh, reshard: bool, mixed: bool = False, device="cpu",
            compile: bool = False) -> Llama:
    """The model built on the meta device (shapes, no storage), sharded, then given memory for its
    shards only: no rank ever holds the whole model (torchtitan's way to start a 405B). `config`: a
    Llama's shape, or a function that builds any model with `.layers` there (make(meta=True),
    plscale.rank.models.chosen: a Hugging Face model too)."""
    if callable(config):
        model = config(meta=True)
    else:
        with torch.device("meta"):
            model = Llama(config)
    shard(model, mesh, reshard, mixed, compile)
    return model.to_empty(device=device)   # uninitialised memory for each rank's shards


def load_full(model: Llama, state: dict, buffers: dict | None = None) -> None:
    """Fill the shards from one full state dict on rank 0: it broadcasts each tensor, every rank
    keeps its rows (torch.distributed.checkpoint's loader, as when starting from a pretrained model).
    `buffers`: the non-persistent buffers a state dict leaves out (a Hugging Face Llama's RoPE
    inv_freq), which to_empty left uninitialised; every rank computes them itself."""
    set_model_state_dict(model, state, options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True))
    for name, value in (buffers or {}).items():
        model.get_buffer(name).copy_(value)
