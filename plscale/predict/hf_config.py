"""A Hugging Face causal LM's shape, from its config.json, as a ModelConfig the estimator and the
planner take (plscale.predict.presets).

    config, read = from_hf(json.load(open("config.json")))   # read: what was taken, and from where

Families, by `model_type`:
    llama, mistral, qwen2   the Llama block (SwiGLU, RMSNorm, RoPE); Qwen2 adds q, k, v biases,
                            Llama's `attention_bias` q, k, v and o biases, `mlp_bias` the MLP's
    gpt2                    GPT-2's block: biases everywhere, LayerNorm, a GELU MLP of n_inner
                            (4 d by default), a learned position table of n_positions
Mixture-of-experts configs (num_local_experts, num_experts) and encoder models are refused, in
one line naming what is not modelled. Pure: the file is read by the caller (plscale/cli/hf_model.py).
"""

from plscale.predict.errors import PredictionError
from plscale.predict.presets import ModelConfig

LLAMA_LIKE = {"llama", "mistral", "qwen2"}
MOE_KEYS = ("num_local_experts", "num_experts", "n_routed_experts", "moe_intermediate_size")


def from_hf(raw: dict, source: str = "config.json") -> tuple[ModelConfig, list[str]]:
    """The shape and the list of `field = value` it was read from."""
    kind = raw.get("model_type")
    architectures = raw.get("architectures") or []
    if architectures and not any(a.endswith(("CausalLM", "LMHeadModel")) for a in architectures):
        raise _refuse(source, f"is a {', '.join(architectures)}, not a causal language model (…ForCausalLM, "
                              f"…LMHeadModel): plscale trains and plans decoder-only LMs")
    moe = [k for k in MOE_KEYS if raw.get(k)]
    if moe:
        raise _refuse(source, f"is a mixture of experts ({moe[0]} = {raw[moe[0]]}): a Hugging Face config's experts "
                              f"are not read yet (the planner knows Mixtral's shapes by name: {{model}} mixtral-8x7b, "
                              f"mixtral-8x22b; plscale's own MoE Llama: estimate moe)")
    if kind in LLAMA_LIKE:
        return _llama(raw, kind, source)
    if kind == "gpt2":
        return _gpt2(raw, source)
    raise _refuse(source, f"has model_type {kind!r}: plscale reads {', '.join(sorted(LLAMA_LIKE))} and gpt2 configs")


def _refuse(source: str, problem: str) -> PredictionError:
    return PredictionError("model", source, f"{source} {problem}.", lead=False)


def _need(raw: dict, source: str, *keys):
    missing = [k for k in keys if raw.get(k) is None]
    if missing:
        raise _refuse(source, f"lacks {', '.join(missing)}: is it a model's config.json?")
    return [raw[k] for k in keys]


def _llama(raw: dict, kind: str, source: str) -> tuple[ModelConfig, list[str]]:
    hidden, layers, heads, ffn, vocab = _need(raw, source, "hidden_size", "num_hidden_layers", "num_attention_heads",
                                              "intermediate_size", "vocab_size")
    kv_heads = raw.get("num_key_value_heads") or heads
    head_dim = raw.get("head_dim") or hidden // heads
    if head_dim * heads != hidden or heads % kv_heads:
        raise _refuse(source, f"has {heads} heads of {head_dim} for hidden_size {hidden} and {kv_heads} kv heads: "
                              f"plscale's model needs heads x head_dim = hidden and kv heads dividing the heads")
    attention_bias = bool(raw.get("attention_bias"))
    config = ModelConfig(vocab=vocab, hidden=hidden, layers=layers, heads=heads, kv_heads=kv_heads, ffn=ffn,
                         max_seq=raw.get("max_position_embeddings") or 2048,
                         tie_embeddings=bool(raw.get("tie_word_embeddings", False)),
                         rope_theta=float(raw.get("rope_theta") or 10_000.0),
                         norm_eps=float(raw.get("rms_norm_eps") or 1e-5),
                         qkv_bias=kind == "qwen2" or attention_bias, o_bias=attention_bias,
                         mlp_bias=bool(raw.get("mlp_bias")), origin="hf")
    read = [f"model_type = {kind}", f"hidden_size = {hidden}", f"num_hidden_layers = {layers}",
            f"num_attention_heads = {heads}", f"num_key_value_heads = {kv_heads}", f"intermediate_size = {ffn}",
            f"vocab_size = {vocab}", f"tie_word_embeddings = {config.tie_embeddings}",
            f"max_position_embeddings = {config.max_seq}"]
    if config.qkv_bias or config.o_bias or config.mlp_bias:
        read.append("biases: " + ", ".join(name for name, on in (("q k v", config.qkv_bias), ("o", config.o_bias),
                                                                 ("mlp", config.mlp_bias)) if on))
    return config, read


def _gpt2(raw: dict, source: str) -> tuple[ModelConfig, list[str]]:
    hidden, layers, heads, vocab = _need(raw, source, "n_embd", "n_layer", "n_head", "vocab_size")
    ffn = raw.get("n_inner") or 4 * hidden
    positions = raw.get("n_positions") or 1024
    if hidden % heads:
        raise _refuse(source, f"has n_embd {hidden} over n_head {heads}, which does not divide it")
    config = ModelConfig(vocab=vocab, hidden=hidden, layers=layers, heads=heads, kv_heads=heads, ffn=ffn,
                         max_seq=positions, tie_embeddings=bool(raw.get("tie_word_embeddings", True)),
                         norm_eps=float(raw.get("layer_norm_epsilon") or 1e-5), family="gpt2",
                         origin="hf")
    read = ["model_type = gpt2", f"n_embd = {hidden}", f"n_layer = {layers}", f"n_head = {heads}",
            f"n_inner = {ffn}", f"vocab_size = {vocab}", f"n_positions = {positions}",
            f"tie_word_embeddings = {config.tie_embeddings}"]
    return config, read


def end_of_text(raw: dict, token_id) -> int | None:
    """The id a lab puts between paragraphs: config.json's eos_token_id (the first, if a list), else
    the tokenizer's own end-of-text token (`token_id`: name -> id or None); None if neither names one."""
    eos = raw.get("eos_token_id")
    if isinstance(eos, list):
        eos = eos[0] if eos else None
    if eos is None:
        eos = next((token_id(t) for t in ("<|endoftext|>", "</s>", "<|end_of_text|>", "<eos>")
                    if token_id(t) is not None), None)
    return eos


def folder_of(source: str):
    """model.hf's folder, as the host and every rank read it: ~ expanded, and a config.json names its folder."""
    from pathlib import Path

    path = Path(str(source)).expanduser()
    return path.parent if path.name == "config.json" and path.is_file() else path
