"""Llama-shaped decoder sizes, from a CI-sized toy to Llama-2-7B, and their exact counts.

Host-side and pure: the estimator and the labs' predictions count parameters, FLOPs and
the largest layer from these configs without building a model. `plscale.rank.models.llama`
builds the same shapes as torch modules; a test checks both agree to the parameter.

Shape of one decoder layer (no biases anywhere, as in Llama):
    attention  q, o: d x d       k, v: d x d_kv   (d_kv = d * kv_heads / heads: grouped-query)
    MLP        gate, up: d x f   down: f x d      (SwiGLU)
    two RMSNorm weights of d
plus the token embedding V x d, a final RMSNorm d and the output head V x d, which shares
the embedding's weight when `tie_embeddings` (GPT-2 and Llama-3.2-1B do; Llama-2-7B does not).

A mixture of experts (`experts` E > 1, as Mixtral and Qwen3's MoE models): every layer's MLP is E
SwiGLU experts of width f and a router (h x E, no bias) that sends each token to its `top_k` of them.
The parameters count all E experts; a token's FLOPs count its top_k and the router
(`layer_active_params`). Mixtral-8x7B: 46,702,792,704 parameters, 12,879,925,248 a token runs through
(Mistral's "12.9B active").

A Hugging Face model read from its config.json (plscale.predict.hf_config) may add biases to that
shape (Qwen2's q, k, v; Llama's `attention_bias`, `mlp_bias`), or be GPT-2's block (`family`
"gpt2"): q, k, v, o of d x d with biases, a GELU MLP d x f and f x d with biases, two LayerNorms
(weight and bias) a layer and one at the end, and a learned position table of max_seq x d.
"""

from dataclasses import asdict, dataclass, replace

from plscale.errors import did_you_mean
from plscale.predict.errors import PredictionError


@dataclass(frozen=True)
class ModelConfig:
    vocab: int
    hidden: int           # d
    layers: int           # L
    heads: int            # attention heads a
    kv_heads: int         # key/value heads (== heads: multi-head; fewer: grouped-query)
    ffn: int              # f, the SwiGLU inner width
    max_seq: int          # longest sequence (RoPE needs no table of learned positions)
    tie_embeddings: bool = True
    rope_theta: float = 10_000.0
    norm_eps: float = 1e-5
    dropout: float = 0.0  # on each residual branch in training (GPT-2 style); Llama uses none
    attention: str = "fused"  # the attention core: "fused" (PyTorch's flash kernel) or "math" (scores kept)
    family: str = "llama"     # "llama" (SwiGLU, RMSNorm, RoPE) or "gpt2" (GELU, LayerNorm, learned positions)
    qkv_bias: bool = False    # biases on q, k and v (Qwen2; Llama's attention_bias also on o)
    o_bias: bool = False
    mlp_bias: bool = False
    origin: str = "plscale"   # whose modules hold the tensors, and so their order: "plscale" or "hf" (predict.tensors)
    experts: int = 1          # E SwiGLU experts a layer's MLP (1: a dense MLP)
    top_k: int = 1            # the experts a token goes to (with experts > 1)
    head_size: int = 0        # a head's width where it is not hidden / heads (Qwen3: 128 at hidden 2048, 32 heads);
                              # 0: hidden / heads
    qk_norm: bool = False     # an RMSNorm of a head's width on q and on k (Qwen3)

    @property
    def head_dim(self) -> int:
        return self.head_size or self.hidden // self.heads

    @property
    def q_dim(self) -> int:
        """The width of q and of the attention's output: heads x head_dim (hidden, unless head_size says)."""
        return self.heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.head_dim * self.kv_heads

    @property
    def moe(self) -> bool:
        return self.experts > 1

    def with_vocab(self, vocab: int) -> "ModelConfig":
        return replace(self, vocab=vocab)

    def to_dict(self) -> dict:
        return asdict(self)


PRESETS = {
    # CI-sized: a few seconds of CPU per step count.
    "tiny": ModelConfig(vocab=2048, hidden=128, layers=2, heads=4, kv_heads=4, ffn=384, max_seq=128),
    # CPU-sized: the lab's default, a minute or two on a laptop.
    "small": ModelConfig(vocab=8192, hidden=256, layers=4, heads=4, kv_heads=4, ffn=704, max_seq=128),
    # small's width, twice its depth, a quarter of its vocabulary: cut into pipeline stages of
    # near-equal work (the output head costs about 0.6 of a layer, not small's 2.6).
    "deep": ModelConfig(vocab=2048, hidden=256, layers=8, heads=4, kv_heads=4, ffn=704, max_seq=256),
    # GPT-2 small/medium widths, Llama-shaped (f = 8/3 d, rounded up to 256), tied embeddings.
    "124m": ModelConfig(vocab=50304, hidden=768, layers=12, heads=12, kv_heads=12, ffn=2048, max_seq=1024),
    "350m": ModelConfig(vocab=50304, hidden=1024, layers=24, heads=16, kv_heads=16, ffn=2816, max_seq=1024),
    # Llama-3.2-1B's shape (grouped-query attention, tied): 1,235,814,400 parameters.
    "1b": ModelConfig(vocab=128256, hidden=2048, layers=16, heads=32, kv_heads=8, ffn=8192, max_seq=2048,
                      rope_theta=500_000.0),
    # Llama-2-7B's shape (untied): 6,738,415,616 parameters.
    "7b": ModelConfig(vocab=32000, hidden=4096, layers=32, heads=32, kv_heads=32, ffn=11008, max_seq=4096,
                      tie_embeddings=False),
}


def preset(name: str) -> ModelConfig:
    if name not in PRESETS:
        raise PredictionError("model", name, f"No model preset {name!r}.{did_you_mean(name, PRESETS)} "
                                             f"Presets: {', '.join(PRESETS)}.", lead=False)
    return PRESETS[name]


def mlp_params(c: ModelConfig) -> int:
    """One MLP's (one expert's) matmul weights: SwiGLU's gate, up and down, GPT-2's two."""
    return (2 if c.family == "gpt2" else 3) * c.hidden * c.ffn


def layer_matmul_params(c: ModelConfig) -> int:
    """One layer's matmul weights, every expert's (not the router's): what its tensor-parallel shards hold."""
    return 2 * c.hidden * c.q_dim + 2 * c.hidden * c.kv_dim + c.experts * mlp_params(c)


def router_params(c: ModelConfig) -> int:
    """One layer's router gate, h x E (none for a dense MLP): whole on every tensor-parallel rank."""
    return c.hidden * c.experts if c.moe else 0


def layer_active_params(c: ModelConfig) -> int:
    """The matmul weights one token runs through in a layer: what its FLOPs count. A dense layer's
    every weight; with experts, the attention, the router and top_k experts."""
    return layer_matmul_params(c) - (c.experts - c.top_k) * mlp_params(c) + router_params(c)


def layer_params(c: ModelConfig) -> int:
    """One layer's parameters: its matmuls, its norms and its biases."""
    d, f = c.hidden, c.ffn
    if c.family == "gpt2":  # every projection has a bias; two LayerNorms of weight and bias
        return layer_matmul_params(c) + (3 * d + d) + (f + d) + 2 * 2 * d
    biases = (c.q_dim + 2 * c.kv_dim if c.qkv_bias else 0) + (d if c.o_bias else 0) + ((2 * f + d) if c.mlp_bias else 0)
    return layer_matmul_params(c) + router_params(c) + biases + 2 * d + (2 * c.head_dim if c.qk_norm else 0)


def param_count(c: ModelConfig) -> int:
    """Exactly sum(p.numel() for p in model.parameters()) of the built model."""
    embeddings = c.vocab * c.hidden * (1 if c.tie_embeddings else 2)
    if c.family == "gpt2":  # a learned position table; the final LayerNorm's weight and bias
        return embeddings + c.max_seq * c.hidden + c.layers * layer_params(c) + 2 * c.hidden
    return embeddings + c.layers * layer_params(c) + c.hidden


def largest_layer_params(c: ModelConfig) -> int:
    """The most parameters one module owns directly (what ZeRO-3 gathers at once at most):
    the embedding table, unless an MLP projection is larger."""
    return max(c.vocab * c.hidden, c.hidden * c.ffn)


def flops_per_token(c: ModelConfig, seq: int) -> float:
    """Training FLOPs per token: 6 per weight of the matmuls (forward 2, backward 4), plus
    attention's scores and weighted sum, 6 * 2 * L * seq * heads * head_dim (d unless head_size; causal-free, as in
    the PaLM paper's MFU). With experts, the weights a token runs through (layer_active_params)."""
    matmul_weights = c.layers * layer_active_params(c) + c.vocab * c.hidden
    return 6 * matmul_weights + 12 * c.layers * seq * c.q_dim


def check_moe_shape(c: ModelConfig) -> None:
    """One line for a mixture of experts the counts above do not describe."""
    if c.experts < 1:
        raise PredictionError("experts", c.experts, ": use 1 (a dense MLP) or more experts.")
    if not 1 <= c.top_k <= c.experts:
        raise PredictionError("top_k", c.top_k, f": a token goes to 1 to {c.experts} experts.")
    if c.moe and (c.family != "llama" or c.mlp_bias):
        raise PredictionError("experts", c.experts, ": experts are SwiGLU MLPs without biases (Mixtral's, "
                                                    "Qwen3's): a Llama-family shape.")


def parse_count(text: str) -> int:
    """'7b', '350M', '1.3e9', '124000000' -> a parameter count."""
    raw = text.strip().lower().replace("_", "").replace(",", "")
    scale = {"k": 1e3, "m": 1e6, "b": 1e9, "t": 1e12}.get(raw[-1:], 1)
    try:
        value = float(raw[:-1] if scale != 1 else raw) * scale
    except ValueError:
        raise PredictionError("model", text, f"{text!r} is neither a model preset ({', '.join(PRESETS)}) nor a "
                                             f"parameter count such as 7b, 350M or 1.3e9.", lead=False) from None
    if value < 1:
        raise PredictionError("model", text, f"A model has at least one parameter, not {text!r}.", lead=False)
    return int(value)
