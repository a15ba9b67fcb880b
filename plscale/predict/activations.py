"""Activations saved for backward by plscale's Llama, per micro-batch per rank, and what each
recomputation strategy keeps, drops and rebuilds.

Counted from the model's autograd graph. tests/test_recompute_predict.py measures the bytes a
real forward allocates and still holds at its end (torch's allocator history): equal to this
model for every strategy, both cores, grouped-query attention, fp32 and bf16, but for RoPE's
cos and sin tables and the targets (4.6 KB of 2.1 MB on preset tiny at seq 32).
Per token of a layer, in elements of e bytes (e = 4 fp32, 2 bf16/fp16), h hidden, h_kv the
key/value width, f SwiGLU width, a heads, s sequence, V vocabulary, t tensor-parallel ranks:

    norms      2 x [(2h + 1) x 4 bytes + h]    each RMSNorm keeps its input, 1/rms and the
                                               normalised input in fp32 (torch's rms_norm on CPU
                                               computes in fp32 at least; a fused GPU kernel may
                                               keep less), the linear after it the norm's output
    attention  (2h + 2h_kv)/t                  q, k (after RoPE), v, and o_proj's input
    core       fused: h/t + 4a/t bytes         the output; the log-sum-exp in fp32
               math:  a*s/t + 2(h - h_kv)/t    the probabilities [a, s] of each query; k and v
                                               repeated to every head under grouped-query
    mlp        4f/t                            gate, up, silu(gate) and down's input
    head       (2h + 1) x 4 bytes + h  +  4V/t bytes [the final RMSNorm; log-softmax in fp32]

With e = 4 the norms are s*b*(6h + 2)*e. Tensor parallelism splits everything inside the blocks
and the vocabulary, not the norms. Sequence parallelism (sp) splits the norms' own 2h + 1 along
the sequence too; the all-gathered input a column-parallel linear keeps stays whole (h) here
(Megatron-LM gathers it again in backward instead, and keeps only its slice).

Recomputation (Korthikanti et al., 2022), of the first k layers of the whole model (k = 0: all).
Megatron's --recompute-num-layers counts per pipeline stage: its k is pp·k here, as 1F1B's first
stage holds pp micro-batches of its L/pp layers, k of each recomputed. The strategies (STRATEGIES):

    none       each layer keeps all of the above
    selective  a recomputed layer drops its attention core's tensors (torch.utils.checkpoint
               around the core keeps only its inputs q, k, v): the `core` term goes
    full       a recomputed layer keeps only its input, h (h/t under sp)
    deepspeed  full recomputation through DeepSpeed's CheckpointFunction (deepspeed.checkpointing.
               checkpoint): keeps what full keeps. It also keeps the two RNG states it restores for
               the rerun, torch's and the accelerator's: host tensors on a GPU, not device memory,
               so not counted; on CPU both are the CPU generator's (5,056 bytes each, 10 KB a
               layer), left out as RoPE's tables are

`activation_bytes` is what is kept at the end of the forward (what a census measures);
`rebuilt_bytes` what one recomputation holds when its rerun ends, just before the region's
backward uses it. Their sum is what the forward keeps plus the most one rerun adds to it. It is
not the step's peak: the head's backward holds the logits' gradient beside what is kept, and the
parameters' gradients come on top (lab 09's memory_over_step chart: none peaks at 199 MiB, 135 kept).
What a rerun holds is not what the forward dropped: torch.utils.checkpoint (non-reentrant) runs
the region again under hooks that catch each tensor it saves, and stops the rerun (early stop,
torch's default) as soon as the last one is caught: down_proj's input, before down_proj runs
(a layer); probs and v, before the last matmul runs (the math core); the fused kernel's output
and log-sum-exp, after it runs. Whatever the stopped rerun's Python frames still name is alive
then too. Measured by tests/test_recompute_predict.py (the allocator's history: what a label's
second run, inside the backward, allocated and still held when it ended; fused and math cores,
grouped-query attention, fp32 and bf16; fp16 and preset small's shape by hand), equal to these
but for the 8 bytes of the math core's scale (a 0-dim fp64 tensor its mul saves, left out of
the forward's count too):

    selective, fused  h/t + 4a/t bytes    the output and the log-sum-exp (the fused kernel saves
                                          them after it runs; q, k, v are the kept inputs)
    selective, math   (a*s + 2h + g*h)/t  the probabilities, the scaled q, v copied (matmul makes
                      + s x s x e bytes   the transposed view contiguous) or repeated to every
                                          head, and, under grouped-query attention (g = 1 when
                                          h_kv < h, else 0), k repeated (else k^T is a view of the
                                          kept k); the causal mask [s, s], still named in the core's
                                          frame when the rerun stops ((s/cp) x s under cp)
    full              layer - h   (e = 4) every tensor the layer saves, but for the first norm's
                      layer + h   (e < 4) input, the layer's input itself in fp32 (kept already);
                                          in bf16/fp16 that norm saves an fp32 copy instead, and
                                          the residual x + attention(x), which no one saves at
                                          e < 4, is still named in the layer's frame when the
                                          rerun stops in down_proj (h: h/t under sp). The layer's
                                          output is never rebuilt.
    deepspeed         layer       (e = 4) DeepSpeed's CheckpointFunction (reentrant) reruns the
                      layer + h   (e < 4) layer to its end: every tensor the layer saves, less the
                                          input at e = 4, plus the layer's output, h: one h over
                                          torch's at e = 4, as much as torch's at e < 4 (the
                                          output in place of the residual)

Pipeline parallelism (1F1B) does not cut the first stage's activations: it holds pp
micro-batches of L/pp layers, the whole model's worth. Context parallelism (cp ranks share
each sequence) cuts every term to s/cp tokens; the math core's probabilities still span all s
keys. A caller passes a `plscale.predict.setup.Setup` (which also holds the strategies' names
and the rules on them).
"""

# lab 09's check.py asks these of this module; the rules on a Setup's settings live in setup.py
from plscale.predict.setup import STRATEGIES, check_core, check_layers, check_strategy  # noqa: F401
from plscale.predict.setup import WHOLE_LAYER, Setup, recomputed_count
from plscale.predict.units import BYTES

NORM_BYTES = 4  # RMSNorm's input, 1/rms and normalised input are fp32 whatever the precision


def element_bytes(precision: str) -> int:
    return BYTES[precision]


def _tokens(s: Setup) -> int:
    return s.tokens * s.micro_batch


def _norm(s: Setup) -> float:
    """One RMSNorm and the linear after it: (2h + 1) fp32 (a t-th under sp) + h elements."""
    c, e = s.model, element_bytes(s.precision)
    return _tokens(s) * ((2 * c.hidden + 1) * NORM_BYTES / (s.tp if s.sp else 1) + c.hidden * e)


def layer_parts(s: Setup) -> dict[str, float]:
    """Bytes one decoder layer saves for backward without recomputation, by part (module doc)."""
    c, e, t, sb = s.model, element_bytes(s.precision), s.tp, _tokens(s)
    if c.attention == "math":
        core = sb * (c.heads * s.seq + 2 * (c.hidden - c.kv_dim)) * e / t
    else:
        core = sb * c.hidden * e / t + 4 * c.heads * sb / t
    return {"norms": 2 * _norm(s), "attention": sb * (2 * c.hidden + 2 * c.kv_dim) * e / t, "core": core,
            "mlp": sb * 4 * c.ffn * e / t}


def layer_activation_bytes(s: Setup) -> float:
    """Bytes one decoder layer saves for backward without recomputation."""
    return sum(layer_parts(s).values())


def layer_input_bytes(s: Setup) -> float:
    """A layer's input, s*b*h elements (a t-th of the sequence under sp): all full recomputation keeps."""
    return _tokens(s) * s.model.hidden * element_bytes(s.precision) / (s.tp if s.sp else 1)


def layer_kept_bytes(s: Setup, recomputed: bool = True) -> float:
    """Bytes one layer keeps at the end of the forward: all of them unless `recomputed` under
    s.recompute; selective drops the core, full and deepspeed keep only the input."""
    if not recomputed or s.recompute == "none":
        return layer_activation_bytes(s)
    if s.recompute in WHOLE_LAYER:
        return layer_input_bytes(s)
    return layer_activation_bytes(s) - layer_parts(s)["core"]


def head_activation_bytes(s: Setup) -> float:
    """Bytes the final RMSNorm and the output head's log-softmax save, per micro-batch."""
    return _norm(s) + 4 * _tokens(s) * s.model.vocab / s.tp


def recomputed_layers(s: Setup, layers: int | None = None) -> int:
    """How many of `layers` (default: all) are recomputed: the first recompute_layers of them."""
    return recomputed_count(s.recompute, s.recompute_layers, s.model.layers if layers is None else layers)


def activation_bytes(s: Setup, layers: int | None = None, head: bool = True) -> float:
    """Bytes kept for backward at the end of the forward per micro-batch by `layers` decoder
    layers (default: all) and, if `head`, the head: the whole model, or a pipeline stage's share."""
    layers = s.model.layers if layers is None else layers
    k = recomputed_layers(s, layers)
    kept = k * layer_kept_bytes(s, recomputed=True) + (layers - k) * layer_activation_bytes(s)
    return kept + (head_activation_bytes(s) if head else 0)


def core_rebuilt_bytes(s: Setup) -> float:
    """What a selective rerun of one attention core holds when torch's checkpoint stops it: fused,
    the output and the log-sum-exp; math, the probabilities, the scaled q, v copied or repeated,
    k repeated under grouped-query attention, and the causal mask (module doc)."""
    c, e, t, sb = s.model, element_bytes(s.precision), s.tp, _tokens(s)
    if c.attention != "math":
        return layer_parts(s)["core"]
    repeated = c.hidden if c.kv_dim < c.hidden else 0
    return sb * (c.heads * s.seq + 2 * c.hidden + repeated) * e / t + s.tokens * s.seq * e


def rebuilt_bytes(s: Setup) -> float:
    """What the backward's largest recomputation holds when its rerun ends (module doc): one core's
    (selective); one layer's saved tensors, less its input at e = 4, plus one h (full: the residual
    torch's stopped rerun still names, at e < 4 only; deepspeed: the layer's output, always); 0
    (none, or no layer recomputed)."""
    if not recomputed_layers(s):
        return 0.0
    if s.recompute == "selective":
        return core_rebuilt_bytes(s)
    aliased = element_bytes(s.precision) == NORM_BYTES  # the first norm saves the kept input itself
    if aliased and s.recompute == "deepspeed":  # less the input, plus the output
        return layer_activation_bytes(s)
    return layer_activation_bytes(s) + (-1 if aliased else 1) * layer_input_bytes(s)


def activation_formula(s: Setup) -> str:
    """The activations term's formula as `plscale estimate memory` prints it: kept plus one rerun."""
    c, t = s.model, "" if s.tp == 1 else "/t"
    norms = "sb(4h+2)·4/t + 2sbhp" if s.sp else "sb(4h+2)·4 + 2sbhp"
    core = "a·s·sbp + 2sb(h-h_kv)p" if c.attention == "math" else "sbhp + 4asb"
    linears = f"sb(2h+2h_kv+4f)p{t}"  # the inputs and outputs of attention's and the MLP's matmuls
    layer = f"{norms} + {linears} + [{core}]{t}"
    k = recomputed_layers(s)
    rest = f"(L-{k})·layer + " if k < c.layers else ""
    n = "L" if k == c.layers else str(k)
    if s.recompute == "none":
        formula = f"L·[{layer}] + head"
    elif s.recompute in WHOLE_LAYER:
        kept = "sbhp/t" if s.sp else "sbhp"
        aliased = element_bytes(s.precision) == NORM_BYTES  # the input aliased; the residual or output named
        rebuilt = f"[{layer}]" if aliased and s.recompute == "deepspeed" else \
            f"([{layer}] {'-' if aliased else '+'} {kept})"
        formula = f"{n}·{kept} + {rest}one layer rebuilt {rebuilt} + head"
    else:
        if c.attention == "math":  # the rerun's probabilities, scaled q, v (and k) copies, and the mask
            mask = "(s/cp)·s·p" if s.cp > 1 else "s²p"
            core = f"a·s·sbp + {3 if c.kv_dim < c.hidden else 2}sbhp]{t} + {mask}"
        else:
            core = f"{core}]{t}"
        formula = f"{n}·[{norms} + {linears}] + {rest}one core rebuilt [{core} + head"
    return formula.replace("sb", "(s/cp)b") if s.cp > 1 else formula  # each rank's s/cp tokens
