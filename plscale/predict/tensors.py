"""Every parameter tensor of a model, from its shape alone, in the order model.parameters() gives.

Host-side and pure. ZeRO-1/2's partitions (plscale.predict.zero_partitions) cut the flat buffer
in that order, FSDP2 splits each tensor on dim 0 (plscale.predict.fsdp) and a checkpoint writes
one record a tensor (plscale.predict.checkpoint): all three read the tensors here.

Each tensor is (rows, cols): dim 0 and the rest; a vector is (n, 1).

plscale's Llama (plscale.rank.models.llama), `origin` "plscale":
    embedding V x d | per layer: input norm d, q d x d, k kv x d, v kv x d, o d x d,
    post-attention norm d, gate f x d, up f x d, down d x f | final norm d | head V x d (untied)

A Hugging Face model (`origin` "hf", plscale.predict.hf_config), as transformers registers its
modules (modeling_llama.py, modeling_qwen2.py, modeling_gpt2.py):
    Llama, Mistral, Qwen2   embed_tokens V x d | per layer: q_proj, k_proj, v_proj, o_proj (each
                            weight, then its bias where the config has one), gate_proj, up_proj,
                            down_proj (biases with mlp_bias), input_layernorm d,
                            post_attention_layernorm d | norm d | lm_head V x d (untied)
    GPT-2                   wte V x d, wpe P x d | per layer: ln_1 (weight d, bias d), c_attn
                            (Conv1D: weight d x 3d, bias 3d), c_proj (d x d, d), ln_2 (d, d),
                            c_fc (d x f, f), c_proj (f x d, d) | ln_f (d, d) | lm_head tied
    Mixtral (experts)       ... o_proj, then mlp.gate E x d, mlp.experts.gate_up_proj E x 2f x d and
                            down_proj E x d x f (every expert's fused, transformers 5; transformers 4
                            held a tensor an expert's matrix), input_layernorm d, post_attention_layernorm d
    Qwen3 (qk_norm)         q_proj is (heads x head_dim) x d and o_proj d x (heads x head_dim); after o_proj
                            q_norm and k_norm of head_dim; its MoE block registers the experts, then the gate
A tied head is the embedding's own tensor: model.parameters() yields it once, at the embedding.
"""

from plscale.predict.presets import ModelConfig

Shape = tuple[int, int]


def layer(c: ModelConfig) -> list[Shape]:
    """One decoder layer's tensors, in registration order."""
    d, q, kv, f = c.hidden, c.q_dim, c.kv_dim, c.ffn
    qk = [(c.head_dim, 1)] * 2 if c.qk_norm else []
    if c.family == "gpt2":
        return [(d, 1), (d, 1), (d, 3 * d), (3 * d, 1), (d, d), (d, 1), (d, 1), (d, 1), (d, f), (f, 1), (f, d), (d, 1)]
    if c.moe:
        router, experts = [(c.experts, d)], [(c.experts, 2 * f * d), (c.experts, d * f)]
        mlp = experts + router if c.qk_norm else router + experts   # Qwen3's block registers its router last
        return [(q, d), (kv, d), (kv, d), (d, q), *qk, *mlp, (d, 1), (d, 1)]
    if c.origin == "plscale":
        return [(d, 1), (d, d), (kv, d), (kv, d), (d, d), (d, 1), (f, d), (f, d), (d, f)]
    bias = lambda rows, on: [(rows, 1)] if on else []  # noqa: E731
    return [(q, d), *bias(q, c.qkv_bias), (kv, d), *bias(kv, c.qkv_bias), (kv, d), *bias(kv, c.qkv_bias),
            (d, q), *bias(d, c.o_bias), *qk, (f, d), *bias(f, c.mlp_bias), (f, d), *bias(f, c.mlp_bias),
            (d, f), *bias(d, c.mlp_bias), (d, 1), (d, 1)]


def embeddings(c: ModelConfig) -> list[Shape]:
    """What comes before the layers: the token table (and GPT-2's position table)."""
    return [(c.vocab, c.hidden)] + ([(c.max_seq, c.hidden)] if c.family == "gpt2" else [])


def final(c: ModelConfig) -> list[Shape]:
    """What comes after them: the final norm (GPT-2's LayerNorm has a bias too), the untied head."""
    norm = [(c.hidden, 1)] * (2 if c.family == "gpt2" else 1)
    return norm + ([] if c.tie_embeddings else [(c.vocab, c.hidden)])


def parameters(c: ModelConfig) -> list[Shape]:
    """Every tensor, in model.parameters() order."""
    return embeddings(c) + layer(c) * c.layers + final(c)


def sizes(c: ModelConfig) -> list[int]:
    """Elements of each tensor, in model.parameters() order."""
    return [rows * cols for rows, cols in parameters(c)]
