"""A decoder layer split two ways at once: its weights over tp, its sequence over cp.

    x: [b, s/cp, h], this rank's tokens (zig-zag chunks), the residual stream whole in h
      |  RMSNorm (replicated)
      |  qkv   column-parallel: f, then this rank's heads/t query and kv_heads/t key/value heads
      |  RoPE  at the tokens' GLOBAL positions (the caller's cos, sin rows)
      |  core  ring attention over the cp group, on those local heads only:
      |        k, v blocks of [b, kv_heads/t, s/cp, d] go round the cp ring
      |  o     row-parallel: g (all-reduce over tp)
      |  RMSNorm, MLP: gate/up column-parallel, down row-parallel (f ... g), as in lab 07
      v
    x: [b, s/cp, h]

With sequence parallelism (`sp`) the residual stream holds s/(cp t) tokens: the column layer
all-gathers the rank's s/cp tokens over tp before q, k, v, so ring attention sees the same
[b, heads/t, s/cp, d] as without, and the row layer reduce-scatters them back (lab 07).

The two splits do not meet: tp cuts the heads and the MLP's width, cp cuts the tokens. A
rank's ring holds the ranks with its own tp index (they hold the same heads), so the
ring passes the k/v of heads/t heads, a tp-th of what the cp-only model passes.

This is the tensor-parallel layer of plscale/strategies/tensor_parallel/llama.py with one
method replaced: `ParallelAttention.attend(q, k, v)`, the core between RoPE and o_proj (the
dense Attention has the same hook, which ContextParallelAttention overrides the same way).

    layer = HybridDecoderLayer(config, mesh.group("tp"), mesh.group("cp"))
    x = layer(x, cos[index], sin[index])        # index: positions(seq, cp, cp_rank, "zigzag")
"""

import torch.distributed as dist

from plscale.predict.context_parallel import positions
from plscale.predict.presets import ModelConfig
from plscale.strategies.context_parallel.ring_attention import ring_attention
from plscale.strategies.tensor_parallel.layers import ColumnParallelLinear, RowParallelLinear
from plscale.strategies.tensor_parallel.llama import ParallelAttention, ParallelDecoderLayer


class RingParallelAttention(ParallelAttention):
    """The tensor-parallel attention block; its core is ring attention over the cp group."""

    def __init__(self, c: ModelConfig, tp_group, cp_group, split: str = "zigzag", sp: bool = False):
        super().__init__(c, tp_group, sp, ColumnParallelLinear, RowParallelLinear)
        self.cp_group, self.split = cp_group, split

    def attend(self, q, k, v):
        """q [b, heads/t, s/cp, d], k, v [b, kv_heads/t, s/cp, d]: this rank's heads and tokens,
        attending over every token of the sequence (the cp group holds the rest)."""
        cp, rank = dist.get_world_size(self.cp_group), dist.get_rank(self.cp_group)
        if cp == 1:
            return super().attend(q, k, v)
        return ring_attention(q, k, v, self.cp_group, positions(q.shape[2] * cp, cp, rank, self.split))


class HybridDecoderLayer(ParallelDecoderLayer):
    """Lab 07's ParallelDecoderLayer with RingParallelAttention in place of its attention."""

    def __init__(self, c: ModelConfig, tp_group, cp_group, split: str = "zigzag", sp: bool = False):
        super().__init__(c, tp_group, sp, ColumnParallelLinear, RowParallelLinear)
        self.self_attn = RingParallelAttention(c, tp_group, cp_group, split, sp)
