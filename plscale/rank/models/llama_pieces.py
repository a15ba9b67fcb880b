"""plscale's Llama cut into the pieces a pipeline places on its stages.

    pieces:  [embedding, layer 0, ..., layer L-1, final norm, output head]     (L + 3 of them)
    index:    0          1            L           L + 1       L + 2

Each piece is an nn.Module whose forward takes one tensor and returns one: token ids in,
hidden states through, logits out. A stage is a contiguous run of pieces; every engine of
the pipeline lab (plscale's schedules, DeepSpeed's PipelineModule, torch.distributed.pipelining)
cuts the same pieces, and each loads its weights from one full `Llama` built with the lab's
seed, so all of them start where the unpipelined model starts.

The output head shares the embedding's weight (`tie_embeddings`). On one rank the two pieces
hold the same Parameter; on two stages each holds a copy, and their gradients must be summed
before the optimizer steps (Megatron's "embedding group"; DeepSpeed's TiedLayerSpec).
"""

import torch
import torch.nn.functional as F
from torch import nn

from plscale.predict.presets import ModelConfig
from plscale.rank.models.llama import DecoderLayer, Llama, RMSNorm, rope_tables


class Embedding(nn.Module):
    def __init__(self, c: ModelConfig):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(c.vocab, c.hidden))

    def forward(self, tokens):
        return F.embedding(tokens, self.weight)


class Layer(DecoderLayer):
    """A decoder layer that makes its own RoPE tables (cheap), so it takes one tensor."""

    def __init__(self, c: ModelConfig):
        super().__init__(c)
        self.head_dim, self.theta = c.head_dim, c.rope_theta

    def forward(self, x):
        cos, sin = rope_tables(self.head_dim, x.shape[1], self.theta, x.device)
        return super().forward(x, cos, sin)


class FinalNorm(RMSNorm):
    def __init__(self, c: ModelConfig):
        super().__init__(c.hidden, c.norm_eps)


class Head(nn.Module):
    """logits = x @ weight.T; the weight is the embedding's when the model ties them."""

    def __init__(self, c: ModelConfig):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(c.vocab, c.hidden))

    def forward(self, x):
        return x @ self.weight.t()


def head_forward(embedding: Embedding, x):
    """DeepSpeed's TiedLayerSpec calls this with the embedding module on the last stage."""
    return x @ embedding.weight.t()


def piece_classes(c: ModelConfig) -> list:
    return [Embedding, *[Layer] * c.layers, FinalNorm, Head]


def piece_names(c: ModelConfig) -> list[str]:
    return ["embedding", *[f"layer {i}" for i in range(c.layers)], "final norm", "head"]


@torch.no_grad()
def load_piece(piece: nn.Module, index: int, reference: Llama) -> None:
    """Copy the weights of piece `index` out of a full model."""
    c = reference.config
    if index == 0:
        piece.weight.copy_(reference.embed_tokens.weight)
    elif index <= c.layers:
        piece.load_state_dict(reference.layers[index - 1].state_dict())
    elif index == c.layers + 1:
        piece.weight.copy_(reference.norm.weight)
    else:
        piece.weight.copy_(reference.lm_head.weight)


def build_pieces(reference: Llama, start: int, stop: int) -> nn.Sequential:
    """Pieces [start, stop) as one module, weights copied from `reference`; where both the
    embedding and a tied head are inside, they share one Parameter as in the full model."""
    c = reference.config
    pieces = []
    for index in range(start, stop):
        piece = piece_classes(c)[index](c)
        load_piece(piece, index, reference)
        pieces.append(piece)
    if c.tie_embeddings and start == 0 and stop == c.layers + 3:
        pieces[-1].weight = pieces[0].weight
    return nn.Sequential(*pieces)


def tied_weight(stage: nn.Module):
    """The embedding or head weight a stage holds (the tied one), else None."""
    for piece in stage.children():
        if isinstance(piece, (Embedding, Head)):
            return piece.weight
    return None


def loss_fn(logits, targets):
    """Mean cross-entropy over every token of a micro-batch, in fp32 (as `Llama.forward`)."""
    return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())
