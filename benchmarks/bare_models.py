"""The two models the overhead benchmarks compare: plscale's Llama and transformers'
LlamaForCausalLM of the same shape, built offline from a LlamaConfig (no weights
downloaded), starting from the same weights (plscale's initialisation, copied over).

    model = build("transformers", preset("small"))
    loss = loss_of(model, "transformers", tokens[:, :-1], tokens[:, 1:])
"""

import torch

from plscale.predict.presets import ModelConfig
from plscale.rank.models.llama import Llama

KINDS = ("plscale", "transformers")


def transformers_llama(c: ModelConfig, threads_note: bool = False):
    """LlamaForCausalLM with c's shape: SDPA attention, SwiGLU, tied head, no biases, no cache."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=c.vocab, hidden_size=c.hidden, intermediate_size=c.ffn,
                         num_hidden_layers=c.layers, num_attention_heads=c.heads, num_key_value_heads=c.kv_heads,
                         max_position_embeddings=c.max_seq, rms_norm_eps=c.norm_eps,
                         rope_parameters={"rope_type": "default", "rope_theta": c.rope_theta},
                         tie_word_embeddings=c.tie_embeddings, attention_bias=False, mlp_bias=False,
                         hidden_act="silu", use_cache=False, attn_implementation="sdpa")
    return LlamaForCausalLM(config)


def build(kind: str, c: ModelConfig) -> torch.nn.Module:
    """plscale's Llama, or LlamaForCausalLM holding the very weights plscale's Llama starts with
    (same torch seed before the call gives the same weights on both sides)."""
    ours = Llama(c)
    if kind == "plscale":
        return ours
    theirs = transformers_llama(c)
    state = {("" if k.startswith("lm_head") else "model.") + k: v for k, v in ours.state_dict().items()}
    missing, unexpected = theirs.load_state_dict(state, strict=False)
    missing = [k for k in missing if not (c.tie_embeddings and k == "lm_head.weight")]
    assert not missing and not unexpected, (missing, unexpected)
    assert sum(p.numel() for p in theirs.parameters()) == sum(p.numel() for p in ours.parameters())
    return theirs


def loss_of(model, kind: str, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy of inputs x against targets y (both (batch, seq)).
    `model` may be a DeepSpeed engine wrapping either kind."""
    if kind == "plscale":
        return model(x, y)
    # shift_labels: y is already shifted, so transformers scores the same seq positions as plscale
    y = y.contiguous()  # transformers views it flat (plscale flattens it, a copy too)
    return model(input_ids=x, labels=y, shift_labels=y, use_cache=False).loss
