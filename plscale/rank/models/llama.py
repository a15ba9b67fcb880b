"""A Llama-shaped decoder: RMSNorm, rotary position embeddings (RoPE), SwiGLU, no biases.

Built from a `plscale.predict.presets.ModelConfig`. Module names follow Hugging Face's
LlamaForCausalLM (embed_tokens, layers.N.self_attn.q_proj ... mlp.down_proj, norm, lm_head)
so DeepSpeed AutoTP recognises which projections to split by column and which by row.
The output head shares the embedding's weight when `config.tie_embeddings`; with
`config.dropout` > 0 each residual branch is dropped out in training (draws from torch's RNG).
The attention core is PyTorch's fused kernel (`config.attention = "fused"`: flash attention,
which keeps only q, k, v, the output and the log-sum-exp for backward) or written out
(`"math"`: softmax(q k^T / sqrt(d) + mask) v, which keeps the heads x s x s probabilities, the
activations Megatron's selective recomputation drops).

    model = Llama(preset("small"))
    loss = model(tokens, targets)          # (batch, seq) int64 -> mean cross-entropy
"""

import math

import torch
import torch.nn.functional as F
from torch import nn

from plscale.predict.presets import ModelConfig


class RMSNorm(nn.Module):
    """x / rms(x) * weight: LayerNorm without the mean and the bias."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)


def rope_tables(head_dim: int, seq: int, theta: float, device=None):
    """cos and sin of position * frequency, (seq, head_dim / 2) each."""
    freqs = theta ** (-torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim)
    angles = torch.outer(torch.arange(seq, device=device, dtype=torch.float32), freqs)
    return angles.cos(), angles.sin()


def apply_rope(x, cos, sin):
    """Rotate each (even, odd) half-pair of x (batch, heads, seq, head_dim) by its angle."""
    x1, x2 = x.to(torch.promote_types(x.dtype, torch.float32)).chunk(2, dim=-1)  # fp32 at least
    rotated = torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)
    return rotated.to(x.dtype)


def math_attention(q, k, v):
    """Causal softmax(q k^T / sqrt(d)) v written out, q [b, heads, s, d], k, v [b, kv_heads, s, d].
    Saved for backward: the scaled q, k, v and the probabilities [b, heads, s, s]."""
    if k.shape[1] != q.shape[1]:  # grouped-query: each k/v head serves heads / kv_heads query heads
        k, v = (t.repeat_interleave(q.shape[1] // k.shape[1], dim=1) for t in (k, v))
    s = q.shape[-2]
    mask = torch.full((s, s), float("-inf"), device=q.device, dtype=q.dtype).triu(1)
    probs = torch.softmax((q * q.shape[-1] ** -0.5) @ k.transpose(-2, -1) + mask, dim=-1)
    return probs @ v


class Attention(nn.Module):
    def __init__(self, c: ModelConfig):
        super().__init__()
        if c.attention not in ("fused", "math"):
            raise ValueError(f"attention core {c.attention!r}: use fused or math")
        self.heads, self.kv_heads, self.head_dim, self.core = c.heads, c.kv_heads, c.head_dim, c.attention
        self.q_proj = nn.Linear(c.hidden, c.hidden, bias=False)
        self.k_proj = nn.Linear(c.hidden, c.kv_dim, bias=False)
        self.v_proj = nn.Linear(c.hidden, c.kv_dim, bias=False)
        self.o_proj = nn.Linear(c.hidden, c.hidden, bias=False)

    def forward(self, x, cos, sin):
        b, s, _ = x.shape
        q = self.q_proj(x).view(b, s, -1, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, s, -1, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, s, -1, self.head_dim).transpose(1, 2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        return self.o_proj(self.attend(q, k, v).transpose(1, 2).reshape(b, s, -1))

    def attend(self, q, k, v):
        """Causal attention of q [b, heads, s, d] over k, v [b, kv_heads, s, d]: the core that
        context parallelism distributes, and selective recomputation rebuilds in backward."""
        if self.core == "math":
            return math_attention(q, k, v)
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=self.kv_heads != self.heads)


class MLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x))."""

    def __init__(self, c: ModelConfig):
        super().__init__()
        self.gate_proj = nn.Linear(c.hidden, c.ffn, bias=False)
        self.up_proj = nn.Linear(c.hidden, c.ffn, bias=False)
        self.down_proj = nn.Linear(c.ffn, c.hidden, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, c: ModelConfig):
        super().__init__()
        self.input_layernorm = RMSNorm(c.hidden, c.norm_eps)
        self.self_attn = Attention(c)
        self.post_attention_layernorm = RMSNorm(c.hidden, c.norm_eps)
        self.mlp = MLP(c)
        self.dropout = c.dropout

    def forward(self, x, cos, sin):
        x = x + F.dropout(self.self_attn(self.input_layernorm(x), cos, sin), self.dropout, self.training)
        return x + F.dropout(self.mlp(self.post_attention_layernorm(x)), self.dropout, self.training)


class Llama(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab, config.hidden)
        self.layers = nn.ModuleList(DecoderLayer(config) for _ in range(config.layers))
        self.norm = RMSNorm(config.hidden, config.norm_eps)
        self.lm_head = nn.Linear(config.hidden, config.vocab, bias=False)
        if config.tie_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self, std: float = 0.02) -> None:
        """GPT-2's initialisation: N(0, 0.02), residual outputs scaled by 1/sqrt(2L)."""
        for name, p in self.named_parameters():
            if p.dim() == 1:
                p.fill_(1.0)
            elif name.endswith(("o_proj.weight", "down_proj.weight")):
                p.normal_(0.0, std / math.sqrt(2 * self.config.layers))
            else:
                p.normal_(0.0, std)

    def forward(self, tokens, targets=None):
        cos, sin = rope_tables(self.config.head_dim, tokens.shape[1], self.config.rope_theta, tokens.device)
        return self.forward_rotated(tokens, targets, cos, sin)

    def forward_rotated(self, tokens, targets, cos, sin):
        """The forward pass given its RoPE tables, one row per token (context parallelism
        reads them at the tokens' places in the whole sequence)."""
        x = self.embed_tokens(tokens)
        for layer in self.layers:
            x = layer(x, cos, sin)
        logits = self.lm_head(self.norm(x))
        if targets is None:
            return logits
        logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
        return F.cross_entropy(logits.flatten(0, 1), targets.flatten())
