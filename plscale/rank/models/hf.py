"""A Hugging Face causal LM in the place of plscale's Llama: the same `model(tokens, targets)`.

    model = build("path/to/model", seed=0)   # its weights where the folder has them, else from its config
    loss = model(tokens, targets)            # (batch, seq) int64 -> mean cross-entropy, as Llama's
    model.layers                             # its decoder layers: FSDP2's groups

The strategies take it as they take plscale's Llama: DeepSpeed wraps any module, FSDP2 shards
`model.layers` one group each and the rest as the root, a checkpoint saves its state dict. What
is written for plscale's Llama alone (the tensor-parallel layers, the pipeline's cuts) refuses
`model.hf` on the host (plscale.lab.settings). The shape its memory is predicted from is read
from the same config.json by plscale.predict.hf_config.
"""

import json

import torch
import torch.nn.functional as F
from torch import nn

from plscale.predict.hf_config import end_of_text, folder_of, from_hf
from plscale.predict.presets import ModelConfig

WEIGHTS = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json")


class CausalLM(nn.Module):
    def __init__(self, hf: nn.Module):
        super().__init__()
        self.hf = hf

    @property
    def layers(self) -> nn.ModuleList:
        """The decoder layers: LlamaForCausalLM's model.layers, GPT2LMHeadModel's transformer.h."""
        base = self.hf.base_model
        return base.layers if hasattr(base, "layers") else base.h

    def forward(self, tokens, targets=None):
        logits = self.hf(input_ids=tokens, use_cache=False).logits
        if targets is None:
            return logits
        logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
        return F.cross_entropy(logits.flatten(0, 1), targets.flatten())


def shape(source: str) -> ModelConfig:
    """The shape plscale/predict reads from the model's config.json (the host's reader, the same file)."""
    return from_hf(_raw(source), f"{folder_of(source)}/config.json")[0]


def model_type(source: str) -> str:
    return _raw(source).get("model_type", "?")


def has_weights(source: str) -> bool:
    return any((folder_of(source) / name).is_file() for name in WEIGHTS)


def build(source: str, seed: int, dropout: float = 0.0, meta: bool = False) -> CausalLM:
    """The model in fp32: loaded from its weights where the folder has them, else initialised from its
    config; torch's RNG seeded by `seed` first either way (the same weights on every rank and every
    call, a weight the checkpoint lacks too); `meta`: shapes only, on the meta device (FSDP2 fills the
    shards). Every dropout of the config (attention_dropout; GPT-2's resid, embd and attn_pdrop) is set
    to `dropout`."""
    import transformers

    transformers.logging.set_verbosity_error()   # its notes on a toy config's ids; the lab says what it loads
    transformers.utils.logging.disable_progress_bar()
    folder = str(folder_of(source))
    config = transformers.AutoConfig.from_pretrained(folder)
    for key, value in config.to_dict().items():
        if key.endswith(("dropout", "pdrop")) and isinstance(value, float):
            setattr(config, key, dropout)
    torch.manual_seed(seed)
    if meta:
        with torch.device("meta"):
            return CausalLM(transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32))
    if has_weights(source):
        return CausalLM(transformers.AutoModelForCausalLM.from_pretrained(folder, config=config, dtype=torch.float32))
    return CausalLM(transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32))


def tokenizer(source: str):
    """The model's own tokenizer, as the labs' data reads one: (tokenizers.Tokenizer, description,
    end-of-text id), or None where the folder has no tokenizer.json (the lab trains its local BPE
    at the model's vocabulary size instead). Checked against the model's vocabulary on the host."""
    file = folder_of(source) / "tokenizer.json"
    if not file.is_file():
        return None
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(file))
    return tok, f"{source}'s own tokenizer ({tok.get_vocab_size():,} tokens)", end_of_text(_raw(source), tok.token_to_id)


def _raw(source: str) -> dict:
    return json.loads((folder_of(source) / "config.json").read_text())
