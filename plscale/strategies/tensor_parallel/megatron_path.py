"""megatron-core's ColumnParallelLinear and RowParallelLinear behind the hand-written layers' API.

Megatron's layers are the original of layers.py: the same weight shards, the same f and g.
Their interface differs in three ways, which the adapters below hide, so that
`TensorParallelLlama(config, group, linears=linear_classes(group))` runs on Megatron's code:

    constructor   (input_size, output_size, *, config=ModelParallelConfig, init_method,
                  bias, gather_output / input_is_parallel, tp_group) -> ours
                  (in_features, out_features, group, sequence_parallel=False)
    forward       returns (output, bias) -> the output alone
    layout        [seq, batch, hidden]: under sequence parallelism Megatron gathers and
                  scatters dim 0; ours are [batch, seq, hidden], transposed around the call

Column's f: Megatron does not wrap the input in an autograd function; its matmul's backward
all-reduces the input gradient itself (`allreduce_dgrad`, overlapped with the weight
gradient on GPUs). Row's g: `reduce_from_tensor_model_parallel_region`, an all-reduce.
The layers take the mesh's process group (`tp_group`), so Megatron's global parallel_state
is never initialised. Its sequence parallelism allocates CUDA buffers: CPU runs refuse it
(the GPU path, with its transposes and Megatron's all-gather buffer, has not yet run on a GPU).

Install (keeps torch as it is): pip install --no-deps megatron-core==0.16.1
"""

import importlib
import warnings

import torch
import torch.distributed as dist

from plscale.strategies.tensor_parallel.layers import column_shard, parts_of, row_shard

INSTALL = "pip install --no-deps megatron-core==0.16.1 (or pip install plscale[megatron])"


def unavailable() -> str | None:
    """None when megatron-core imports; else one line saying how to install it."""
    try:
        with warnings.catch_warnings():  # "Transformer Engine and Apex are not installed ..."
            warnings.simplefilter("ignore")
            importlib.import_module("megatron.core.tensor_parallel")
    except ImportError:
        return f"megatron-core is not installed: {INSTALL}"
    return None


def _config(t: int, sequence_parallel: bool):
    from megatron.core import ModelParallelConfig, parallel_state
    from plscale.rank.distributed import device_type

    if sequence_parallel:
        if device_type() != "cuda":
            raise ValueError("megatron-core's sequence parallel needs CUDA")
        if parallel_state._GLOBAL_MEMORY_BUFFER is None:  # its all-gather buffer; initialize_model_parallel
            parallel_state._set_global_memory_buffer()    # would make it, with groups of its own
    # Weights allocated on the CPU (the caller moves the model to its device) and filled by
    # load_shard, so Megatron initialises nothing and draws no random numbers. Gradient
    # accumulation fusion is an APEX CUDA kernel.
    return ModelParallelConfig(tensor_model_parallel_size=t, sequence_parallel=sequence_parallel,
                               use_cpu_initialization=True, perform_initialization=False,
                               gradient_accumulation_fusion=False, params_dtype=torch.float32)


def _no_init(weight):
    pass


def _seq_first(layer, x):
    """Megatron's forward on [b, s, h]: under sequence parallelism its collectives cut dim 0,
    so the call sees [s, b, h]; without, the layout does not matter to a linear."""
    if not layer.sequence_parallel:
        return layer.megatron_forward(x)[0]
    return layer.megatron_forward(x.transpose(0, 1).contiguous())[0].transpose(0, 1)


def linear_classes(group) -> tuple[type, type]:
    """(Column, Row): megatron-core's layers with the constructor and methods of
    layers.ColumnParallelLinear and layers.RowParallelLinear. Their parameter is `weight`,
    as in the hand-written layers, so both models have the same parameter names. Each layer
    takes its group when built, as the hand-written ones do; `group` names the one it will be."""
    reason = unavailable()
    if reason:
        raise RuntimeError(reason)
    from megatron.core import tensor_parallel as mtp
    # A tuning hint for overlapping its all-reduce with compute on GPUs, printed on each rank's
    # first backward; nothing a student can act on here.
    warnings.filterwarnings("ignore", message=".*CUDA_DEVICE_MAX_CONNECTIONS")

    class Column(mtp.ColumnParallelLinear):
        """Y_i = X A_i: weight rows [sum(out)/t, in]; input whole on every rank (or a
        sequence slice under sequence parallelism); several stacked outputs come back split."""

        megatron_forward = mtp.ColumnParallelLinear.forward

        def __init__(self, in_features: int, out_features, group, sequence_parallel: bool = False):
            t = dist.get_world_size(group)
            self.parts = parts_of(out_features)
            for n in self.parts:
                if n % t:
                    raise ValueError(f"output width {n} does not split over {t} tensor-parallel ranks")
            super().__init__(in_features, sum(self.parts), config=_config(t, sequence_parallel),
                             init_method=_no_init, bias=False, gather_output=False, tp_group=group)
            self.t, self.rank = t, dist.get_rank(group)
            self.weight.tensor_model_parallel = True  # megatron-core sets it only when it initialises

        @torch.no_grad()
        def load_shard(self, *full: torch.Tensor) -> None:
            """This rank's rows of each dense weight (one per part), stacked."""
            self.weight.copy_(column_shard(full, self.t, self.rank))

        def forward(self, x):
            y = _seq_first(self, x)
            return y.split([n // self.t for n in self.parts], dim=-1) if len(self.parts) > 1 else y

    class Row(mtp.RowParallelLinear):
        """Y = sum_i X_i B_i: weight columns [out, in/t]; input this rank's slice of the
        features; output all-reduced (reduce-scattered over the sequence under SP)."""

        megatron_forward = mtp.RowParallelLinear.forward

        def __init__(self, in_features: int, out_features: int, group, sequence_parallel: bool = False):
            t = dist.get_world_size(group)
            if in_features % t:
                raise ValueError(f"input width {in_features} does not split over {t} tensor-parallel ranks")
            super().__init__(in_features, out_features, config=_config(t, sequence_parallel), init_method=_no_init,
                             bias=False, input_is_parallel=True, skip_bias_add=False, tp_group=group)
            self.t, self.rank = t, dist.get_rank(group)
            self.weight.tensor_model_parallel = True

        @torch.no_grad()
        def load_shard(self, full: torch.Tensor) -> None:
            """This rank's columns of the dense weight."""
            self.weight.copy_(row_shard(full, self.t, self.rank))

        def forward(self, x):
            return _seq_first(self, x)

    return Column, Row
