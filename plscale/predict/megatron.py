"""Activation memory as Megatron-LM keeps it (Korthikanti et al., "Reducing Activation Recomputation
in Large Transformer Models", 2022), for the layouts published runs use.

Host-side and pure. plscale's own Llama keeps its activations as plscale.predict.activations
counts them (measured by the labs); a Megatron-LM run keeps fewer: its LayerNorms keep their input
in 16 bits, sequence parallelism splits them too, and a column-parallel linear gathers its input
again in backward instead of keeping it. `plscale estimate memory --activations megatron` and
`plscale plan --activations megatron` price a layout with this model instead.

Bytes per layer for s tokens of b sequences, h hidden, a heads, t tensor-parallel ranks, 16-bit
activations and 1-byte dropout masks (the paper's table 2):

    no parallelism                       sbh (34 + 5as/h)
    tensor parallel                      sbh (10 + 24/t + 5as/(ht))
    tensor + sequence parallel           sbh/t (34 + 5as/h)
    tensor parallel + selective          sbh (10 + 24/t)
    tensor + sequence + selective        sbh/t 34
    full recomputation                   2sbh (the layer's input; /t with sequence parallelism)

The paper's attention writes its scores (ModelConfig.attention "math"); flash attention (the default,
"fused", as Megatron-Core runs it through Transformer Engine) keeps none, so its layers keep the
selective rows' bytes without recomputing anything (its few bytes of softmax statistics not counted).
The 34 is 10 + 24 with the paper's MLP of 4h: its 16sbh are 4 of the MLP's 2 x 4h-wide tensors
(Megatron's theoretical_memory_usage.py writes the sequence-parallel, selective row as
sbh (18 + 4f/h)/t for an MLP of width f). The 5as/h is the attention's scores, softmax and its
dropout mask, what selective recomputation drops. The first pipeline stage holds p micro-batches
of its L/p layers under 1F1B, the whole model's L layers (interleaved over v chunks: times
1 + (p - 1)/(p v)), plus the embedding's dropout mask and its input ids for each of them; with
one stage, also the final norm's and the head's input and the loss's fp32 logits: 4sbh(1 + V/h)
(with sequence parallelism, all divided by t).

Heads wider than h / a (ModelConfig.head_size, Qwen3): q and the attention's output keep 2sb x q_dim bytes
each where the paper's keep 2sbh, and q and k norms (qk_norm) keep their inputs, 2sb (q_dim + kv_dim).

A mixture of experts (Megatron-Core's dropless experts): each token's top_k routes each keep an MLP's
4f/h, and the experts' input is each token permuted k times, 2ksbh where a dense MLP keeps its input
once (the 2 of the 18): a layer keeps (18 + 2(k - 1) + 4kf/h) sbh, with sequence parallelism / t. Even
routing is assumed: an expert that gets more than its share holds more (not modelled), and the router's
probabilities (E fp32 a token) are left out.
"""

from plscale.predict.errors import PredictionError
from plscale.predict.presets import ModelConfig

RECOMPUTE = ("none", "selective", "full")


def layer_bytes(c: ModelConfig, seq: int, micro: int, tp: int = 1, sp: bool = False,
                recompute: str = "none") -> float:
    """One layer's activations on one tensor-parallel rank (the paper's table 2, f = 4h as there;
    another MLP width scales the MLP's share, 4f/h of the 34)."""
    if recompute not in RECOMPUTE:
        raise PredictionError("recompute", recompute, f": Megatron's activation model knows {', '.join(RECOMPUTE)}.")
    if sp and tp == 1:
        raise PredictionError("sp", sp, ": sequence parallelism splits over the tensor-parallel group: tp >= 2.")
    sbh, t, scores = seq * micro * c.hidden, tp, 5 * c.heads * seq / c.hidden
    if c.attention != "math":   # flash attention keeps no scores: only the softmax statistics, s a head
        scores = 0.0
    if recompute == "full":
        return 2 * sbh / (t if sp else 1)
    mlp = 4 * c.ffn / c.hidden          # 16 at f = 4h
    if c.moe:                           # top_k routes, each token's input permuted k times (module doc)
        mlp = c.top_k * mlp + 2 * (c.top_k - 1)
    kept = (18 + mlp) / t if sp else 10 + (8 + mlp) / t   # 34/t, or 10 + 24/t at f = 4h
    # heads wider than h / a (Qwen3): q and the attention's output are q_dim wide, not h; q and k norms keep
    # their inputs too (all split over the tp ranks' heads)
    wider = 4 * (c.q_dim - c.hidden) + (2 * (c.q_dim + c.kv_dim) if c.qk_norm else 0)
    return sbh * (kept + (0 if recompute == "selective" else scores / t)) + seq * micro * wider / t


def first_stage_bytes(c: ModelConfig, seq: int, micro: int, tp: int = 1, pp: int = 1, sp: bool = False,
                      recompute: str = "none", virtual: int = 1, micro_batches: int | None = None) -> float:
    """What the first pipeline stage holds at its peak (Megatron's compute_activation_memory, the
    paper's section 4.3): L layers' worth under 1F1B (fewer micro-batches than stages: that many),
    the embedding's ids and dropout mask for each in flight, and with one stage the head's."""
    in_flight = pp if micro_batches is None or virtual > 1 else min(pp, micro_batches)
    layers = c.layers * layer_bytes(c, seq, micro, tp, sp, recompute) * in_flight / pp
    embedding = (8 * seq * micro + seq * micro * c.hidden) * in_flight / (tp if sp else 1)
    total = layers + embedding
    if virtual > 1:
        total *= 1 + (pp - 1) / (pp * virtual)
    if pp == 1:
        total += 4 * seq * micro * c.hidden * (1 + c.vocab / c.hidden) / (tp if sp else 1)
    return total
