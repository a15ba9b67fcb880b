"""The lab's Llama (plscale/rank/models/llama.py) with every block split over a tensor-parallel group.

    attention   q, k, v: one column-parallel linear (each rank: heads/t query heads and
                kv_heads/t key/value heads); o: row-parallel. One f before, one g after.
    MLP         gate and up: one column-parallel linear (ffn/t each); down: row-parallel.
    embedding   vocabulary-parallel; the tied head multiplies by the same shard, giving
                logits for V/t words, and the loss is vocabulary-parallel cross-entropy.
    norms       RMSNorm weights, replicated on every rank.

With `sequence_parallel` the residual stream between blocks holds s/t tokens per rank:
the norms work on a slice of the sequence, the embedding reduce-scatters, the column
layers all-gather and the row layers reduce-scatter. Each rank's norm weights then see only
its tokens, so a hook sums their gradients over the group as backward computes them (one
small all-reduce per norm per micro-batch; Megatron sums them once per step, in
finalize_model_grads, which a DeepSpeed engine that reduces gradients inside the backward
leaves no room for). They carry Megatron's mark, `param.sequence_parallel = True`.

    tp = TensorParallelLlama(config, mesh.group("tp"), sequence_parallel=False)
    tp.load_dense(dense)                 # every rank takes its shard of the same dense weights
    loss = tp(tokens, targets)           # the same loss as dense(tokens, targets)

`linears` swaps the column and row classes, e.g. megatron-core's (megatron_path.py).
"""

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from plscale.predict.presets import ModelConfig
from plscale.rank.models.llama import RMSNorm, apply_rope, rope_tables
from plscale.strategies.tensor_parallel import operators as ops
from plscale.strategies.tensor_parallel.layers import (ColumnParallelLinear, RowParallelLinear, VocabParallelEmbedding,
                                                 vocab_parallel_cross_entropy)


class ParallelAttention(nn.Module):
    def __init__(self, c: ModelConfig, group, sp: bool, column, row):
        super().__init__()
        t = dist.get_world_size(group)
        self.head_dim, self.gqa = c.head_dim, c.kv_heads != c.heads
        self.qkv = column(c.hidden, [c.hidden, c.kv_dim, c.kv_dim], group, sequence_parallel=sp)
        self.o_proj = row(c.hidden, c.hidden, group, sequence_parallel=sp)
        self.widths = [c.hidden // t, c.kv_dim // t, c.kv_dim // t]

    def forward(self, x, cos, sin):
        qkv = self.qkv(x)                                   # f (or all-gather): whole sequence, my heads
        q, k, v = qkv if isinstance(qkv, (tuple, list)) else qkv.split(self.widths, dim=-1)
        b, s = q.shape[:2]
        q, k, v = (y.reshape(b, s, -1, self.head_dim).transpose(1, 2) for y in (q, k, v))
        v = v.contiguous()  # attention then saves v alone, not the whole fused q|k|v output it views
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        return self.o_proj(self.attend(q, k, v).transpose(1, 2).reshape(b, s, -1))   # g (or reduce-scatter)

    def attend(self, q, k, v):
        """Causal attention of this rank's heads, q [b, heads/t, s, d] over k, v [b, kv_heads/t, s, d]:
        the core a composed layer replaces (ring attention over a context-parallel group, lab 11)."""
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=self.gqa)


class ParallelMLP(nn.Module):
    def __init__(self, c: ModelConfig, group, sp: bool, column, row):
        super().__init__()
        self.gate_up = column(c.hidden, [c.ffn, c.ffn], group, sequence_parallel=sp)
        self.down_proj = row(c.ffn, c.hidden, group, sequence_parallel=sp)
        self.width = c.ffn // dist.get_world_size(group)

    def forward(self, x):
        gate_up = self.gate_up(x)
        gate, up = gate_up if isinstance(gate_up, (tuple, list)) else gate_up.split(self.width, dim=-1)
        return self.down_proj(F.silu(gate) * up)


class ParallelDecoderLayer(nn.Module):
    def __init__(self, c: ModelConfig, group, sp: bool, column, row):
        super().__init__()
        self.input_layernorm = RMSNorm(c.hidden, c.norm_eps)
        self.self_attn = ParallelAttention(c, group, sp, column, row)
        self.post_attention_layernorm = RMSNorm(c.hidden, c.norm_eps)
        self.mlp = ParallelMLP(c, group, sp, column, row)

    def forward(self, x, cos, sin):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        return x + self.mlp(self.post_attention_layernorm(x))

    @torch.no_grad()
    def load_shard(self, full) -> None:
        """This rank's shard of a dense DecoderLayer (plscale/rank/models/llama.py): q|k|v and
        gate|up by rows, o and down by columns, the norms whole."""
        a, m = full.self_attn, full.mlp
        self.self_attn.qkv.load_shard(a.q_proj.weight, a.k_proj.weight, a.v_proj.weight)
        self.self_attn.o_proj.load_shard(a.o_proj.weight)
        self.mlp.gate_up.load_shard(m.gate_proj.weight, m.up_proj.weight)
        self.mlp.down_proj.load_shard(m.down_proj.weight)
        self.input_layernorm.weight.copy_(full.input_layernorm.weight)
        self.post_attention_layernorm.weight.copy_(full.post_attention_layernorm.weight)


class TensorParallelLlama(nn.Module):
    def __init__(self, config: ModelConfig, group, sequence_parallel: bool = False,
                 linears=(ColumnParallelLinear, RowParallelLinear)):
        super().__init__()
        if not config.tie_embeddings:
            raise ValueError("the tensor-parallel Llama ties its head to the embedding: use a tied preset")
        if config.dropout:
            raise ValueError("the tensor-parallel Llama applies no dropout (its ranks would need one random "
                             "stream for the replicated regions): use model dropout 0")
        self.config, self.group, self.sequence_parallel = config, group, sequence_parallel
        column, row = linears
        self.embed_tokens = VocabParallelEmbedding(config.vocab, config.hidden, group, sequence_parallel)
        self.layers = nn.ModuleList(ParallelDecoderLayer(config, group, sequence_parallel, column, row)
                                    for _ in range(config.layers))
        self.norm = RMSNorm(config.hidden, config.norm_eps)
        for p in self.replicated():
            p.sequence_parallel = sequence_parallel
            if sequence_parallel:
                p.register_hook(lambda grad: ops.all_reduce(grad, group, "backward"))

    @torch.no_grad()
    def load_dense(self, dense: nn.Module) -> None:
        """Take this rank's shard of every weight of a dense Llama (replicated norms whole)."""
        self.embed_tokens.load_shard(dense.embed_tokens.weight)
        self.norm.weight.copy_(dense.norm.weight)
        for mine, full in zip(self.layers, dense.layers):
            mine.load_shard(full)

    def replicated(self) -> list:
        """The parameters every rank holds whole: the norm weights."""
        return [m.weight for m in self.modules() if isinstance(m, RMSNorm)]

    def forward(self, tokens, targets=None):
        cos, sin = rope_tables(self.config.head_dim, tokens.shape[1], self.config.rope_theta, tokens.device)
        x = self.embed_tokens(tokens)                      # g, or reduce-scatter: [b, s/t, h] under SP
        for layer in self.layers:
            x = layer(x, cos, sin)
        x = self.norm(x)
        x = ops.gather_sequence(x, self.group) if self.sequence_parallel else ops.copy_to(x, self.group)
        logits = F.linear(x, self.embed_tokens.weight)    # [b, s, V/t]: my words' logits
        if targets is None:
            return logits
        return vocab_parallel_cross_entropy(logits, targets, self.embed_tokens.start, self.group)
