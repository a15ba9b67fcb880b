"""The torch Llama's weights as the JAX model's params, and back.

torch's nn.Linear keeps W [out, in] and computes x @ W.T; the JAX params keep W.T [in, out]
and stack the layers on axis 0 (plscale.jaxlab.model's docstring has the layout). So

    params = from_torch(torch_model)                       # fp32 numpy arrays
    torch_model.load_state_dict({k: torch.from_numpy(v) for k, v in to_state_dict(params, config).items()})

round-trips exactly. Needs torch only for the model passed in (called in the lab and the tests).
"""

import numpy as np

from plscale.predict.presets import ModelConfig

# JAX name in params["layers"] -> the torch module under layers.N, and whether torch stores it [out, in]
LAYER_WEIGHTS = {
    "input_norm": ("input_layernorm", False),
    "q": ("self_attn.q_proj", True),
    "k": ("self_attn.k_proj", True),
    "v": ("self_attn.v_proj", True),
    "o": ("self_attn.o_proj", True),
    "post_norm": ("post_attention_layernorm", False),
    "gate": ("mlp.gate_proj", True),
    "up": ("mlp.up_proj", True),
    "down": ("mlp.down_proj", True),
}


def from_torch(model) -> dict:
    """Params (fp32 numpy) holding the torch Llama's weights."""
    # copies: .numpy() would share memory with the torch tensors, which training then changes
    state = {k: v.detach().float().cpu().numpy().copy() for k, v in model.state_dict().items()}
    layers = range(model.config.layers)
    params = {
        "embed": state["embed_tokens.weight"],
        "layers": {name: np.stack([state[f"layers.{i}.{module}.weight"].T if linear
                                   else state[f"layers.{i}.{module}.weight"] for i in layers])
                   for name, (module, linear) in LAYER_WEIGHTS.items()},
        "norm": state["norm.weight"],
    }
    if not model.config.tie_embeddings:
        params["head"] = state["lm_head.weight"].T
    return {k: _contiguous(v) for k, v in params.items()}


def to_state_dict(params: dict, config: ModelConfig) -> dict[str, np.ndarray]:
    """The torch Llama's state_dict (fp32 numpy) of these params; lm_head.weight is the
    embedding when tied, as torch lists the shared weight under both names."""
    embed = np.asarray(params["embed"], dtype=np.float32)
    out = {"embed_tokens.weight": embed}
    for i in range(config.layers):
        for name, (module, linear) in LAYER_WEIGHTS.items():
            w = np.asarray(params["layers"][name][i], dtype=np.float32)
            out[f"layers.{i}.{module}.weight"] = np.ascontiguousarray(w.T if linear else w)
    out["norm.weight"] = np.asarray(params["norm"], dtype=np.float32)
    out["lm_head.weight"] = embed if config.tie_embeddings else np.ascontiguousarray(
        np.asarray(params["head"], dtype=np.float32).T)
    return out


def _contiguous(tree):
    if isinstance(tree, dict):
        return {k: _contiguous(v) for k, v in tree.items()}
    return np.ascontiguousarray(tree, dtype=np.float32)
