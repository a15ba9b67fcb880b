"""The Llama-shaped decoder of plscale/rank/models/llama.py in JAX: the same math, as functions.

Parameters are one dict pytree, every weight stored as x @ W ([in, out]) and the layers
stacked on axis 0, so a sharding rule or a pipeline stage slices them all at once:

    {"embed": [V, d], "layers": {"input_norm": [L, d], "q": [L, d, d], "k": [L, d, dkv],
     "v": [L, d, dkv], "o": [L, d, d], "post_norm": [L, d], "gate": [L, d, f], "up": [L, d, f],
     "down": [L, f, d]}, "norm": [d], "head": [d, V] (only when the embedding is not tied)}

`constrain(name, x)` is where a layout annotates activations (GSPMD then shards the rest):
"hidden" [b, s, d], "heads" [b, s, heads, head_dim], "ffn" [b, s, f]. The default keeps
whatever sharding XLA picks.

    params = init(config, jax.random.key(0))
    value = loss(params, tokens, targets, config)        # (batch, seq) int32 -> mean cross-entropy
"""

import math
from functools import partial

import jax
import jax.numpy as jnp

from plscale.predict.presets import ModelConfig


def no_constraint(name, x):
    return x


@partial(jax.jit, static_argnums=0)      # one compile, not one per weight shape
def init(config: ModelConfig, key) -> dict:
    """GPT-2's initialisation, as the torch model's reset_parameters: N(0, 0.02), the residual
    outputs o and down N(0, 0.02 / sqrt(2L)), norms 1 (the labs copy torch's weights instead)."""
    c, L = config, config.layers
    shapes = {"q": (L, c.hidden, c.hidden), "k": (L, c.hidden, c.kv_dim), "v": (L, c.hidden, c.kv_dim),
              "o": (L, c.hidden, c.hidden), "gate": (L, c.hidden, c.ffn), "up": (L, c.hidden, c.ffn),
              "down": (L, c.ffn, c.hidden)}
    keys = jax.random.split(key, len(shapes) + 2)
    residual_std = 0.02 / math.sqrt(2 * L)
    layers = {name: jax.random.normal(k, shape) * (residual_std if name in ("o", "down") else 0.02)
              for k, (name, shape) in zip(keys, shapes.items())}
    layers["input_norm"] = layers["post_norm"] = jnp.ones((L, c.hidden))
    params = {"embed": jax.random.normal(keys[-2], (c.vocab, c.hidden)) * 0.02, "layers": layers,
              "norm": jnp.ones((c.hidden,))}
    if not c.tie_embeddings:
        params["head"] = jax.random.normal(keys[-1], (c.hidden, c.vocab)) * 0.02
    return params


def rms_norm(x, weight, eps):
    """x / rms(x) * weight, in fp32."""
    x32 = x.astype(jnp.float32)
    return (x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps) * weight).astype(x.dtype)


def rope_tables(head_dim: int, seq: int, theta: float):
    """cos and sin of position * frequency, (seq, head_dim / 2) each."""
    freqs = theta ** (-jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim)
    angles = jnp.outer(jnp.arange(seq, dtype=jnp.float32), freqs)
    return jnp.cos(angles), jnp.sin(angles)


def apply_rope(x, cos, sin):
    """Rotate the pairs (x[i], x[i + head_dim/2]) of x [b, s, heads, head_dim] by their angles
    (the two halves, as torch's apply_rope; not interleaved)."""
    x1, x2 = jnp.split(x.astype(jnp.float32), 2, axis=-1)
    cos, sin = cos[:, None, :], sin[:, None, :]           # broadcast over heads
    return jnp.concatenate((x1 * cos - x2 * sin, x1 * sin + x2 * cos), axis=-1).astype(x.dtype)


def attention(q, k, v):
    """Causal softmax(q k^T / sqrt(head_dim)) v, q [b, s, heads, hd], k, v [b, s, kv_heads, hd]."""
    if k.shape[2] != q.shape[2]:      # grouped-query: each k/v head serves heads / kv_heads query heads
        k, v = (jnp.repeat(t, q.shape[2] // k.shape[2], axis=2) for t in (k, v))
    scores = jnp.einsum("bqhd,bkhd->bhqk", q * q.shape[-1] ** -0.5, k)
    s = q.shape[1]
    causal = jnp.tril(jnp.ones((s, s), dtype=bool))
    probs = jax.nn.softmax(jnp.where(causal, scores, -jnp.inf), axis=-1)
    return jnp.einsum("bhqk,bkhd->bqhd", probs, v)


def layer(p, x, cos, sin, config: ModelConfig, constrain=no_constraint):
    """One decoder layer; p holds one layer's weights (params["layers"] at one index)."""
    b, s, _ = x.shape
    hd = config.head_dim
    h = rms_norm(x, p["input_norm"], config.norm_eps)
    q = constrain("heads", (h @ p["q"]).reshape(b, s, -1, hd))
    k = constrain("heads", (h @ p["k"]).reshape(b, s, -1, hd))
    v = constrain("heads", (h @ p["v"]).reshape(b, s, -1, hd))
    q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
    out = constrain("heads", attention(q, k, v)).reshape(b, s, -1)
    x = constrain("hidden", x + out @ p["o"])
    h = rms_norm(x, p["post_norm"], config.norm_eps)
    inner = constrain("ffn", jax.nn.silu(h @ p["gate"]) * (h @ p["up"]))      # SwiGLU
    return constrain("hidden", x + inner @ p["down"])


def layers(p_layers, x, cos, sin, config: ModelConfig, constrain=no_constraint):
    """Every layer of a stacked slice in order (lax.scan: compiled once, whatever the depth)."""
    def one(x, p):
        return layer(p, x, cos, sin, config, constrain), None
    return jax.lax.scan(one, x, p_layers)[0]


def embed(params, tokens):
    return params["embed"][tokens]


def head_loss(params, x, targets, config: ModelConfig):
    """Final norm, output head (the embedding's transpose when tied), mean cross-entropy in fp32."""
    w = params["embed"].T if config.tie_embeddings else params["head"]
    logits = (rms_norm(x, params["norm"], config.norm_eps) @ w).astype(jnp.float32)
    logp = jax.nn.log_softmax(logits, axis=-1)
    return -jnp.mean(jnp.take_along_axis(logp, targets[..., None], axis=-1))


def loss(params, tokens, targets, config: ModelConfig, constrain=None):
    """The whole model: mean cross-entropy of predicting targets [b, s] from tokens [b, s]."""
    constrain = constrain or no_constraint
    cos, sin = rope_tables(config.head_dim, tokens.shape[1], config.rope_theta)
    x = constrain("hidden", embed(params, tokens))
    return head_loss(params, layers(params["layers"], x, cos, sin, config, constrain), targets, config)
