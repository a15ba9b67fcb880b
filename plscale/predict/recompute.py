"""What recomputation costs: the FLOPs of a training step, per token, split into forward,
backward and the forward work backward does again.

Counted as `plscale.predict.presets.flops_per_token` counts a step (PaLM's MFU, attention
causal-free): W matmul weights (every layer's q, k, v, o, gate, up, down and the head), L
layers of width h, s tokens a sequence, 2 FLOPs per weight per token forward:

    forward      F = 2W + 4Lsh              (4sh a layer: the scores q k^T and the weighted sum p v)
    backward     2F                          (the gradients of the inputs and of the weights)
    recompute    full       k x (2 W_layer + 4sh)   the forward of each recomputed layer again
                                                     (not the embedding, not the head)
                 deepspeed  as full                  the same rerun, through DeepSpeed's checkpoint
                 selective  k x 4sh                  the attention core's forward again
                 none       0

k is the number of recomputed layers (recompute_layers, 0: all L). The step takes about
(3F + recompute) / 3F the time of one without recomputation, if time follows FLOPs:

    time_ratio(preset("7b"), 4096, "full")       = 1.328  (an extra forward of the 32 layers)
    time_ratio(preset("7b"), 4096, "selective")  = 1.047  (4sh = 67 MFLOPs a token a layer again:
                                                           2.1 of a step's 3 x 15.4 GFLOPs)
"""

from dataclasses import dataclass

from plscale.predict.presets import ModelConfig, layer_active_params
from plscale.predict.setup import check_recompute, recomputed_count


@dataclass(frozen=True)
class StepFlops:
    """FLOPs per token of one training step."""
    forward: float
    backward: float
    recompute: float

    @property
    def step(self) -> float:
        """Forward and backward: presets.flops_per_token."""
        return self.forward + self.backward

    @property
    def total(self) -> float:
        return self.step + self.recompute

    @property
    def time_ratio(self) -> float:
        return self.total / self.step


def layer_forward_flops(c: ModelConfig, seq: int) -> float:
    """One decoder layer's forward per token: 2 per matmul weight it runs through (with experts, its
    top_k), plus 4sh of attention."""
    return 2 * layer_active_params(c) + attention_core_flops(c, seq)


def attention_core_flops(c: ModelConfig, seq: int) -> float:
    """The attention core's forward per token: q k^T and p v, 2 x 2 x s x h (causal-free)."""
    return 4 * seq * c.q_dim


def step_flops(c: ModelConfig, seq: int, strategy: str = "none", layers: int = 0) -> StepFlops:
    """Forward, backward (2 x forward) and recomputation FLOPs per token of one step."""
    check_recompute(strategy, layers, c.layers)
    forward = c.layers * layer_forward_flops(c, seq) + 2 * c.vocab * c.hidden   # the head's matmul
    again = {"none": 0.0, "selective": attention_core_flops(c, seq), "full": layer_forward_flops(c, seq),
             "deepspeed": layer_forward_flops(c, seq)}[strategy]
    return StepFlops(forward=forward, backward=2 * forward,
                     recompute=recomputed_count(strategy, layers, c.layers) * again)


def time_ratio(c: ModelConfig, seq: int, strategy: str, layers: int = 0) -> float:
    """(step + recompute) / step: the step time with recomputation against without, by FLOPs."""
    return step_flops(c, seq, strategy, layers).time_ratio
