"""The same 4D Llama pipelined by DeepSpeed: a `PipelineModule` of tp x cp layers.

DeepSpeed's pipeline grid has three axes, PipeModelDataParallelTopology: pipe (slowest),
data, model (fastest), so rank = mp_i + tp (data_i + D pipe_i). Megatron's order is
rank = tp_i + tp (cp_i + cp (dp_i + dp pp_i)): DeepSpeed's "data" axis, of size D = dp x cp,
is exactly the mesh's dp-cp group (what DeepSpeed calls sequence data parallel). So:

    model  = tp        the layers of plscale/strategies/hybrid/layer.py, on the mesh's tp group
    data   = dp x cp   DeepSpeed AVERAGES gradients over these D ranks
    pipe   = pp        DeepSpeed's 1F1B (TrainSchedule), its p2p, its tied-weight all-reduce

Because DeepSpeed averages over dp x cp instead of summing over cp, each cp rank's loss here
is the plain mean over its s/cp tokens (not the share / cp of HybridStage): the average of
the cp means is the micro-batch's mean, and of their gradients its gradient. The DeepSpeed
batch then counts D ranks: train_batch_size = micro x m x dp x cp.

The model as specs, one per piece (the pieces of plscale/rank/models/llama_pieces.py):

    TiedLayerSpec("embed", VocabParallelEmbedding)     piece 0         the vocab shard
    LayerSpec(PipeLayer) x L                           pieces 1 .. L   RoPE at global positions inside
    LayerSpec(RMSNorm)                                 piece L + 1
    TiedLayerSpec("embed", ..., forward_fn=head)       piece L + 2     f, then x @ E_t^T

    engine = DeepSpeedHybrid(config, mesh, ds_config, split="zigzag")
    engine.load_dense(dense)             # every piece this rank holds, from a dense Llama
    loss = engine(micro_batches)         # m (tokens, targets) pairs of this rank's columns
    engine.module                        # the rank's parameters (a PipelineModule)
"""

import warnings

import torch
import torch.distributed as dist
import torch.nn.functional as F

from plscale.predict.context_parallel import positions
from plscale.predict.presets import ModelConfig
from plscale.rank.mesh import Mesh
from plscale.rank.models.llama import RMSNorm, rope_tables
from plscale.strategies.hybrid.layer import HybridDecoderLayer
from plscale.strategies.tensor_parallel import operators as ops
from plscale.strategies.tensor_parallel.layers import VocabParallelEmbedding, vocab_parallel_cross_entropy

warnings.filterwarnings("ignore", message=r"c10d::broadcast_: an autograd kernel was not registered")


class PipeLayer(HybridDecoderLayer):
    """A HybridDecoderLayer taking one tensor, as DeepSpeed's pipeline passes: it reads its RoPE
    tables at the global positions of the rank's tokens itself."""

    def __init__(self, c: ModelConfig, tp_group, cp_group, split: str):
        super().__init__(c, tp_group, cp_group, split)
        self.config, self.cp_group, self.split = c, cp_group, split

    def forward(self, x):
        cp, rank = dist.get_world_size(self.cp_group), dist.get_rank(self.cp_group)
        seq = x.shape[1] * cp
        cos, sin = rope_tables(self.config.head_dim, seq, self.config.rope_theta, x.device)
        index = torch.tensor(positions(seq, cp, rank, self.split), device=x.device)
        return super().forward(x, cos[index], sin[index])


def head(embedding: VocabParallelEmbedding, x):
    """The tied head: f over tp, then this rank's vocabulary's logits."""
    return F.linear(ops.copy_to(x, embedding.group), embedding.weight)


class DeepSpeedHybrid:
    def __init__(self, config: ModelConfig, mesh: Mesh, ds_config: dict, split: str = "zigzag"):
        import deepspeed
        from deepspeed.pipe import LayerSpec, PipelineModule, TiedLayerSpec
        from deepspeed.runtime.pipe.topology import PipeModelDataParallelTopology

        self.config = config
        tp, cp = mesh.group("tp"), mesh.group("cp")
        t = dist.get_world_size(tp)
        start = mesh.rank_in("tp") * (config.vocab // t)
        specs = [TiedLayerSpec("embed", VocabParallelEmbedding, config.vocab, config.hidden, tp,
                               tied_weight_attr="weight")]
        specs += [LayerSpec(PipeLayer, config, tp, cp, split) for _ in range(config.layers)]
        specs += [LayerSpec(RMSNorm, config.hidden, config.norm_eps),
                  TiedLayerSpec("embed", VocabParallelEmbedding, config.vocab, config.hidden, tp, forward_fn=head,
                                tied_weight_attr="weight")]
        topology = PipeModelDataParallelTopology(num_pp=mesh.size("pp"), num_mp=t,
                                                 num_dp=mesh.size("dp") * mesh.size("cp"))
        self.module = PipelineModule(specs, topology=topology, partition_method="type:PipeLayer",
                                     loss_fn=lambda logits, y: vocab_parallel_cross_entropy(logits, y, start, tp))
        micro, m = ds_config["train_micro_batch_size_per_gpu"], ds_config["gradient_accumulation_steps"]
        config_ds = {**ds_config, "train_batch_size": micro * m * topology.get_dim("data"),
                     "pipeline": {"pipe_partitioned": False, "grad_partitioned": False}}
        self.engine, *_ = deepspeed.initialize(model=self.module, config=config_ds,
                                               model_parameters=[p for p in self.module.parameters()])
        grid = self.engine.grid
        self.groups = {"pp": list(grid.pp_group), "dp-cp": list(grid.dp_group)}

    @torch.no_grad()
    def load_dense(self, dense) -> None:
        """Every piece this rank holds, its shard of the dense Llama's weights."""
        L = self.config.layers
        for i, f in enumerate(self.module.forward_funcs):
            index = self.module._local_start + i
            piece = f if isinstance(f, torch.nn.Module) else f.args[0]   # a tied head: partial(head, embedding)
            if index in (0, L + 2):
                piece.load_shard(dense.embed_tokens.weight)
            elif index == L + 1:
                piece.weight.copy_(dense.norm.weight)
            else:
                piece.load_shard(dense.layers[index - 1])
        if hasattr(self.engine.optimizer, "refresh_fp32_params"):   # ZeRO-1 copied its fp32 master partition
            self.engine.optimizer.refresh_fp32_params()              # at initialize: take the loaded weights

    def __call__(self, micro_batches) -> float:
        loss = self.engine.train_batch(data_iter=iter(micro_batches))  # mean over m and dp x cp
        return float(loss.item())
