"""A transformer encoder that classifies a padded token sequence (BERT-shaped, CPU-sized by
default), or a pretrained encoder (DistilBERT) from the Hugging Face hub.

    tokens -> embedding + learned positions -> N x [self-attention, MLP] -> mean over the
    real (unpadded) tokens -> linear -> class logits
"""

import torch
from torch import nn

from plscale.errors import UserError


class EncoderClassifier(nn.Module):
    def __init__(self, vocab: int, max_len: int, dim: int = 128, layers: int = 2, heads: int = 4,
                 ff: int = 256, dropout: float = 0.1, classes: int = 2):
        super().__init__()  # heads must divide dim: a lab checks its settings before launch (check.py)
        self.tokens = nn.Embedding(vocab, dim)
        self.positions = nn.Embedding(max_len, dim)
        layer = nn.TransformerEncoderLayer(dim, heads, ff, dropout, batch_first=True, norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, classes)
        self.drop = nn.Dropout(dropout)

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """ids, mask: (batch, length); mask is True on real tokens. Returns (batch, classes)."""
        positions = torch.arange(ids.shape[1], device=ids.device)
        x = self.drop(self.tokens(ids) + self.positions(positions))
        x = self.norm(self.encoder(x, src_key_padding_mask=~mask))
        weights = mask.unsqueeze(-1).to(x.dtype)
        pooled = (x * weights).sum(1) / weights.sum(1).clamp(min=1.0)
        return self.head(pooled)


class Pretrained(nn.Module):
    """A Hugging Face sequence classifier behind the same forward(ids, mask) -> logits."""

    def __init__(self, hf_model):
        super().__init__()
        self.hf = hf_model

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return self.hf(input_ids=ids, attention_mask=mask.long()).logits


def pretrained(name: str, classes: int = 2):
    """(model, tokenizers.Tokenizer) of a pretrained encoder, e.g. distilbert-base-uncased.
    Needs the hub (or the model already in the local Hugging Face cache)."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    try:
        hf_tokenizer = AutoTokenizer.from_pretrained(name)
        model = AutoModelForSequenceClassification.from_pretrained(name, num_labels=classes)
    except OSError as exc:
        first = str(exc).splitlines()[0]
        raise UserError(f"model.init=pretrained: cannot load {name!r} from the hub or the local cache ({first}). "
                        f"Connect to the hub once, or use model.init=scratch.") from None
    return Pretrained(model), hf_tokenizer.backend_tokenizer


def parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
