"""DeepSpeed AutoTP: tensor parallelism from one line of config, on the lab's dense Llama.

`"tensor_parallel": {"autotp_size": t}` makes `deepspeed.initialize` rewrite the model before
it builds the optimizer. It finds each Linear by name, cuts its weight in place and swaps in
a layer that does Megatron's f or g:

    q, k, v, gate, up -> LinearLayer       weight rows [out/t, in];  identity forward,
                                           input gradient all-reduced in backward (f)
    o, down           -> LinearAllreduce   weight columns [out, in/t]; output all-reduced (g)
    embedding, norms, lm_head              left whole on every rank (replicated)

The names come from `partition_config` below (what AutoTP's built-in "llama" preset says).
Without it AutoTP guesses from the model's printout, which must read like a Hugging Face
model ("...LlamaModel"); plscale's Llama does not, and the guess fails.

Groups: DeepSpeed builds its own, once per process (deepspeed.utils.groups), as a
(data_parallel, tensor_parallel) DeviceMesh over the whole world: tensor-parallel groups of
consecutive ranks, the order plscale's Mesh uses (tp innermost). `initialize` checks that
every rank's DeepSpeed groups hold the same ranks as the mesh's, and `tp_ranks(engine)`
gives them for the lab to print. On the first forward DeepSpeed also checks that the ranks
of a tensor-parallel group were given the same batch.

    engine = initialize(Llama(config), ds_config, tp=2, mesh=mesh)
    loss = engine(tokens, targets); engine.backward(loss); engine.step()
    tp_ranks(engine) == mesh.ranks("tp")
"""

import copy

import torch.distributed as dist

from plscale.rank.mesh import Mesh
from plscale.rank.models.llama import Llama

# Which weights AutoTP cuts, and how; the rest stay whole (AutoTPPresets.llama).
LLAMA_SPECS = [
    {"patterns": [r".*\.self_attn\.[qkv]_proj\.weight$", r".*\.mlp\.(gate|up)_proj\.weight$"],
     "partition_type": "column"},
    {"patterns": [r".*\.self_attn\.o_proj\.weight$", r".*\.mlp\.down_proj\.weight$"],
     "partition_type": "row"},
]


def autotp_config(ds_config: dict, tp: int) -> dict:
    """A copy of the run's DeepSpeed config with AutoTP on.

    DeepSpeed checks train_batch_size against micro batch x accumulation x *every* rank when it
    reads the config, before it knows the tensor-parallel groups, so a train_batch_size that
    counts data-parallel ranks only (world / t) fails the check. The copy leaves it out and
    DeepSpeed derives it: engine.train_batch_size() then counts every rank, t times the samples
    the model really sees per step.
    """
    config = copy.deepcopy(ds_config)
    config.pop("train_batch_size", None)
    config["tensor_parallel"] = {**config.get("tensor_parallel", {}), "autotp_size": tp,
                                 "partition_config": {"use_default_specs": False, "layer_specs": LLAMA_SPECS}}
    return config


def initialize(model: Llama, ds_config: dict, tp: int, mesh: Mesh):
    """A DeepSpeed engine training `model` (the same dense weights on every rank) with AutoTP
    over `tp` ranks. Raises ValueError when DeepSpeed's groups are not the mesh's."""
    import deepspeed

    if tp != mesh.size("tp"):
        raise ValueError(f"AutoTP over {tp} ranks, but the mesh's tensor-parallel groups have {mesh.size('tp')}")
    c = model.config
    for n, what in ((c.heads, "heads"), (c.kv_heads, "key/value heads"), (c.ffn, "ffn width")):
        if n % tp:
            raise ValueError(f"{what} {n} do not split over {tp} tensor-parallel ranks")
    engine, *_ = deepspeed.initialize(model=model, config=autotp_config(ds_config, tp),
                                      model_parameters=model.parameters())
    for name, theirs in (("tp", tp_ranks(engine)), ("dp", dp_ranks(engine))):
        if theirs != mesh.ranks(name):
            raise ValueError(f"rank {mesh.rank}: DeepSpeed's {name} group is {theirs}, the mesh's {mesh.ranks(name)}")
    return engine


def tp_ranks(engine) -> list[int]:
    """The global ranks of the tensor-parallel group the engine's sharded layers all-reduce over."""
    from deepspeed.module_inject.layers import TensorParallel_Layer

    found = {tuple(dist.get_process_group_ranks(m.mp_group))
             for m in engine.module.modules() if isinstance(m, TensorParallel_Layer)}
    if len(found) != 1:
        raise ValueError(f"expected one tensor-parallel group in the engine's layers, found {sorted(found)}")
    return list(found.pop())


def dp_ranks(engine) -> list[int]:
    """The global ranks the engine averages gradients over (one replica of each shard each)."""
    return dist.get_process_group_ranks(engine.data_parallel_group)


def sharded(engine) -> dict[str, str]:
    """Module name -> the layer AutoTP put there (LinearLayer: column, LinearAllreduce: row)."""
    from deepspeed.module_inject.layers import TensorParallel_Layer

    return {name: type(m).__name__ for name, m in engine.module.named_modules()
            if isinstance(m, TensorParallel_Layer)}
