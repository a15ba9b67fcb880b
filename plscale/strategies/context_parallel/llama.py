"""The dense Llama with context parallelism: each rank runs s/cp tokens of every sequence.

Everything but attention works token by token (embedding, norms, MLP, head, loss), so it
runs on the rank's tokens unchanged. Two things need the rest of the sequence:

    attention   the queries need every earlier key: ring attention passes k/v round the
                ring, Ulysses trades the sequence split for a head split (all-to-all)
    RoPE        rotates by a token's place in the WHOLE sequence, so the tables are read at
                the global positions of the rank's tokens, not at 0 .. s/cp - 1

The parameters are the dense model's, same names and the same values from the same seed, so
`model.load_state_dict(dense.state_dict())` works. Each rank returns its SHARE of the loss:
the sum over its own tokens / all the sequence's tokens (every rank holds as many, so the
mean over its tokens / cp). The shares add up to the dense loss, and their gradients, summed
over the cp group, to the dense gradients: what DeepSpeed does with context parallelism,
which it calls sequence parallelism (summed over cp, averaged over dp; see MegatronMPU).

    tokens, targets = split_batch(batch[:, :-1], batch[:, 1:], cp, rank, "zigzag")
    model = ContextParallelLlama(config, mesh.group("cp"), attention="ring", split="zigzag")
    loss = model(tokens, targets)
"""

import torch
import torch.distributed as dist

from plscale.predict.context_parallel import check_split, positions
from plscale.predict.presets import ModelConfig
from plscale.strategies.context_parallel.ring_attention import ring_attention
from plscale.strategies.context_parallel.ulysses import check_heads, ulysses_attention
from plscale.rank.models.llama import Attention, Llama, rope_tables

ATTENTIONS = ("ring", "ulysses")


def split_batch(tokens, targets, cp: int, rank: int, split: str):
    """This rank's columns of (batch, seq) tokens and targets: the positions it holds."""
    index = torch.tensor(positions(tokens.shape[1], cp, rank, split), device=tokens.device)
    return tokens[:, index], targets[:, index]


class ContextParallelAttention(Attention):
    """The dense attention block; only the core between RoPE and o_proj is distributed."""

    def __init__(self, c: ModelConfig, group, attention: str, split: str):
        super().__init__(c)
        self.group, self.attention, self.split = group, attention, split

    def attend(self, q, k, v):
        """q, k, v of this rank's tokens, [b, heads, s/cp, d]: attention over the whole sequence."""
        if self.attention == "ulysses":
            return ulysses_attention(q, k, v, self.group)
        cp, rank = dist.get_world_size(self.group), dist.get_rank(self.group)
        return ring_attention(q, k, v, self.group, positions(q.shape[2] * cp, cp, rank, self.split))


class ContextParallelLlama(Llama):
    def __init__(self, config: ModelConfig, group, attention: str = "ring", split: str = "zigzag"):
        if attention not in ATTENTIONS:
            raise ValueError(f"attention {attention!r}: use ring or ulysses.")
        cp = dist.get_world_size(group)
        if attention == "ulysses":
            if split != "plain":
                raise ValueError("Ulysses attends over the sequence in order: use split='plain'.")
            check_heads(config.heads, config.kv_heads, cp)
        super().__init__(config)
        self.group, self.attention, self.split = group, attention, split
        for layer in self.layers:  # swap the attention blocks, keeping the weights just drawn
            dense = layer.self_attn
            layer.self_attn = ContextParallelAttention(config, group, attention, split)
            layer.self_attn.load_state_dict(dense.state_dict())

    def forward(self, tokens, targets=None):
        """tokens, targets: this rank's (batch, s/cp) columns, as `split_batch` cuts them."""
        cp, rank = dist.get_world_size(self.group), dist.get_rank(self.group)
        seq = tokens.shape[1] * cp
        check_split(seq, cp, self.split)
        index = torch.tensor(positions(seq, cp, rank, self.split), device=tokens.device)
        cos, sin = rope_tables(self.config.head_dim, seq, self.config.rope_theta, tokens.device)
        loss = self.forward_rotated(tokens, targets, cos[index], sin[index])  # RoPE at the global positions
        # this rank's share: its mean / cp, as every rank holds as many tokens (no ignored targets)
        return loss if targets is None else loss / cp
