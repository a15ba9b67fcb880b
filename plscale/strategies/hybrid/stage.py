"""One pipeline stage of the 4D Llama: a run of HybridDecoderLayers, with the embedding on the
first stage and the final norm, the tied head and the loss on the last.

    stage 0 (first)            stage s                 stage p-1 (last)
    tokens [b, s/cp]           x [b, s/cp, h]          x [b, s/cp, h]
    vocab-parallel embedding   layers [a, b)           layers [a, b)
    layers [0, L/p)                                    final norm, f
    -> x [b, s/cp, h]          -> x                    head: x @ E_t^T -> logits [b, s/cp, V/t]
                                                       vocab-parallel cross-entropy / cp

Every tensor sent between stages is [micro, s/cp, h]: tp leaves the residual stream whole,
cp keeps a rank's tokens only. With `sequence_parallel` it is [micro, s/(cp t), h]: the
embedding reduce-scatters, the last stage all-gathers before the head, and the norms, each
rank seeing its own tokens only, sum their gradients over tp in backward (a hook, as
TensorParallelLlama's).

The head is tied to the embedding. With pp > 1 the last stage keeps its own copy of its
rank's vocabulary shard E_t (loaded from the same dense weight), and the first and last stage
of each pipeline sum the two copies' gradients before the optimizer step
(plscale/strategies/pipeline/stages.py: TiedGroups), so the copies stay equal. With pp = 1
the head multiplies by the embedding's own weight.

The loss each last-stage rank returns is its SHARE: the mean over its s/cp tokens / cp, so
that the shares of a cp group add up to the micro-batch's mean loss (as ContextParallelLlama
does); the schedule divides it by the micro-batch count m.

    stage = HybridStage(config, mesh, index=mesh.rank_in("pp"), stages=mesh.size("pp"))
    stage.load_dense(dense)                   # this rank's shard of this stage's dense weights
    y = stage(tokens_or_x)                    # hidden states, or logits on the last stage
    loss = stage.loss(y, targets)             # last stage: this rank's share
"""

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from plscale.predict.context_parallel import positions
from plscale.predict.presets import ModelConfig
from plscale.rank.mesh import Mesh
from plscale.rank.models.llama import RMSNorm, rope_tables
from plscale.strategies.hybrid.layer import HybridDecoderLayer
from plscale.strategies.tensor_parallel import operators as ops
from plscale.strategies.tensor_parallel.layers import VocabParallelEmbedding, vocab_parallel_cross_entropy


def layer_range(layers: int, stages: int, index: int) -> range:
    """The decoder layers of stage `index`: an even split, L/p each."""
    if layers % stages:
        raise ValueError(f"{layers} layers do not split evenly into {stages} stages")
    per = layers // stages
    return range(index * per, (index + 1) * per)


class HybridStage(nn.Module):
    def __init__(self, config: ModelConfig, mesh: Mesh, index: int, stages: int, split: str = "zigzag",
                 sequence_parallel: bool = False):
        super().__init__()
        if not config.tie_embeddings or config.dropout:
            raise ValueError("the 4D Llama ties its head to the embedding and applies no dropout: use a tied "
                             "preset with dropout 0")
        self.config, self.split, self.sequence_parallel = config, split, sequence_parallel
        self.tp_group, self.cp_group, self.t = mesh.group("tp"), mesh.group("cp"), mesh.size("tp")
        self.cp, self.cp_rank = mesh.size("cp"), mesh.rank_in("cp")
        self.first, self.last = index == 0, index == stages - 1
        self.layer_ids = layer_range(config.layers, stages, index)
        self.layers = nn.ModuleList(HybridDecoderLayer(config, self.tp_group, self.cp_group, split, sequence_parallel)
                                    for _ in self.layer_ids)
        if self.first:
            self.embed_tokens = VocabParallelEmbedding(config.vocab, config.hidden, self.tp_group, sequence_parallel)
        if self.last:
            self.norm = RMSNorm(config.hidden, config.norm_eps)
            if not self.first:  # the last stage's copy of the tied weight's shard
                rows = config.vocab // dist.get_world_size(self.tp_group)
                self.lm_head = nn.Parameter(torch.empty(rows, config.hidden))
                self.lm_head.tensor_model_parallel = True
        self.vocab_start = dist.get_rank(self.tp_group) * (config.vocab // dist.get_world_size(self.tp_group))
        for m in self.modules():  # the norms: whole on every rank, each fed its own tokens under sp
            if isinstance(m, RMSNorm):
                m.weight.sequence_parallel = sequence_parallel
                if sequence_parallel:
                    m.weight.register_hook(lambda grad: ops.all_reduce(grad, self.tp_group, "backward"))

    def tied_weight(self):
        """The tied embedding/head shard this stage holds (None on a middle stage)."""
        if self.first:
            return self.embed_tokens.weight
        return self.lm_head if self.last else None

    @torch.no_grad()
    def load_dense(self, dense: nn.Module) -> None:
        """Take this rank's shard of this stage's weights from a dense Llama."""
        if self.first:
            self.embed_tokens.load_shard(dense.embed_tokens.weight)
        if self.last:
            self.norm.weight.copy_(dense.norm.weight)
            if not self.first:
                t, start = self.lm_head.shape[0], self.vocab_start
                self.lm_head.copy_(dense.embed_tokens.weight[start:start + t])
        for mine, i in zip(self.layers, self.layer_ids):
            mine.load_shard(dense.layers[i])

    def rope(self, local: int, device):
        """cos, sin at the global positions of this rank's `local` tokens (zig-zag chunks)."""
        seq = local * self.cp
        cos, sin = rope_tables(self.config.head_dim, seq, self.config.rope_theta, device)
        index = torch.tensor(positions(seq, self.cp, self.cp_rank, self.split), device=device)
        return cos[index], sin[index]

    def forward(self, x):
        """tokens [b, s/cp] (first stage) or hidden states [b, s/cp, h] ([b, s/(cp t), h] under
        sequence parallelism); hidden states out, or this rank's logits [b, s/cp, V/t] last."""
        local = x.shape[1] * (self.t if self.sequence_parallel and not self.first else 1)  # s/cp
        x = self.embed_tokens(x) if self.first else x        # g over tp (or reduce-scatter): [b, s/cp, h]
        cos, sin = self.rope(local, x.device)                # attention sees all s/cp tokens of the rank
        for layer in self.layers:
            x = layer(x, cos, sin)
        if not self.last:
            return x
        x = self.norm(x)                                     # f, or all-gather: the head sees s/cp tokens
        x = ops.gather_sequence(x, self.tp_group) if self.sequence_parallel else ops.copy_to(x, self.tp_group)
        return F.linear(x, self.tied_weight())

    def loss(self, logits, targets):
        """This rank's share of the micro-batch's mean loss: its tokens' mean / cp."""
        return vocab_parallel_cross_entropy(logits, targets, self.vocab_start, self.tp_group) / self.cp
