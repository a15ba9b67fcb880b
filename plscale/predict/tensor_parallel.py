"""Tensor and sequence parallelism on paper: parameters per rank, collectives per step.

Host-side and pure: `plscale estimate tp` prints it, and the tensor-parallel lab prints it
beside what each rank counts.

Megatron tensor parallelism (Shoeybi et al., 2019) splits every matmul of a layer over the
t ranks of a TP group: q, k, v, gate and up by columns (each rank owns heads / t heads and
f / t of the SwiGLU width), o and down by rows, so each rank ends a block with a partial sum.
Two conjugate operators join the pieces:

    f   identity forward, all-reduce backward    before attention and before the MLP
    g   all-reduce forward, identity backward    after attention and after the MLP

so a layer costs 2 all-reduces forward and 2 backward of the activation b*s*h (A bytes).
The embedding is split by vocabulary (each rank looks up its V/t rows, zeros elsewhere, then
g); the output head by vocabulary too (f on its input), and the cross-entropy over the split
logits all-reduces three b*s fp32 vectors (max, sum of exp, target logit). The RMSNorm weights
are replicated: each rank holds all (2L + 1) * h of them.

Sequence parallelism (Korthikanti et al., 2022) splits the norms' and residuals' activations
by sequence as well. An all-reduce is a reduce-scatter followed by an all-gather, so SP trades
each g for a reduce-scatter (to the sequence shard) and each f for an all-gather (back to the
whole sequence): the same bytes, fewer activations held. The norm weights now see only s/t
tokens each, so their gradients are summed over the TP group: here as backward computes them,
one all-reduce of h per norm per micro-batch (Megatron-LM sums them once per step; its own
layers also re-gather a linear's input in backward instead of saving it: not counted).

    >>> from plscale.predict.presets import preset
    >>> c = preset("small")                      # L = 4, h = 256
    >>> [(r.op, r.phase, r.calls) for r in collectives(c, 2, seq=128, micro_batch=4, precision="fp32")][:2]
    [('all_reduce', 'forward', 1), ('all_reduce', 'forward', 8)]
    >>> params_per_rank(c, 2).replicated         # (2L + 1) * h
    2304
"""

from dataclasses import dataclass
from math import gcd

from plscale.predict.errors import PredictionError
from plscale.predict.presets import ModelConfig, layer_matmul_params, param_count, router_params
from plscale.predict.units import BYTES as ELEMENT_BYTES  # activations' element size

SHAPES = ("hidden", "heads", "kv_heads", "ffn", "vocab")


def check_divisible(c: ModelConfig, tp: int, name: str = "the model") -> None:
    """One line naming the first shape tp does not divide, and the degrees that would work."""
    if tp < 1:
        raise PredictionError("tp", tp, ": tensor parallelism needs at least 1 rank; use {tp} 1 (no split) or more.")
    for shape in SHAPES:
        value = getattr(c, shape)
        if value % tp:
            common = gcd(*(getattr(c, s) for s in SHAPES))
            ok = [str(d) for d in range(1, common + 1) if common % d == 0]
            choices = ok[0] if len(ok) == 1 else f"{', '.join(ok[:-1])} or {ok[-1]}"
            raise PredictionError("tp", tp, f"{shape} {value} of {name} is not divisible by tp {tp}: use tp {choices} "
                                            f"(they divide hidden, heads, kv_heads, ffn and vocab).", lead=False)


@dataclass(frozen=True)
class RankParams:
    sharded: int         # embedding (and untied head) + every layer's matmuls (and their column biases), / tp
    replicated: int      # the norms, (2L + 1) * h for the Llama, on every rank (and row biases, positions)

    @property
    def total(self) -> int:
        return self.sharded + self.replicated


def layer_split(c: ModelConfig) -> tuple[int, int]:
    """One layer's (split, replicated) parameters under Megatron's layout: the matmuls and the
    column-parallel layers' biases (q, k, v, gate, up; GPT-2's qkv and fc) are split over tp, the
    norms and the row-parallel layers' biases (o, down; GPT-2's proj) are whole on every rank. Experts
    split as the MLP does (Megatron-Core's expert tensor parallelism at its default, tp); the router is whole."""
    d, f = c.hidden, c.ffn
    if c.family == "gpt2":
        return layer_matmul_params(c) + 3 * d + f, 2 * d + 2 * 2 * d
    column = (c.q_dim + 2 * c.kv_dim if c.qkv_bias else 0) + (2 * f if c.mlp_bias else 0)
    row = (d if c.o_bias else 0) + (d if c.mlp_bias else 0) + (2 * c.head_dim if c.qk_norm else 0)
    return layer_matmul_params(c) + column, row + 2 * d + router_params(c)


def _outside(c: ModelConfig, first: bool, last: bool) -> int:
    """The whole parameters outside the layers: the final norm on the last stage, GPT-2's position table
    on the first."""
    gpt2 = c.family == "gpt2"
    return ((2 if gpt2 else 1) * c.hidden if last else 0) + (c.max_seq * c.hidden if gpt2 and first else 0)


def params_per_rank(c: ModelConfig, tp: int) -> RankParams:
    """Parameters one rank of a TP group holds (exact; tp 1 gives param_count)."""
    check_divisible(c, tp)
    embeddings = c.vocab * c.hidden * (1 if c.tie_embeddings else 2)
    split, whole = layer_split(c)
    replicated = c.layers * whole + _outside(c, True, True)
    assert embeddings + c.layers * split + replicated == param_count(c)
    return RankParams((embeddings + c.layers * split) // tp, replicated)


def stage_params(c: ModelConfig, tp: int, pp: int, index: int) -> RankParams:
    """Parameters one rank of pipeline stage `index` (of pp) holds, its layers split over tp:
    L/pp layers (their norms whole), the embedding's vocabulary shard on the first stage, the
    final norm and the head's shard on the last. A tied head on a last stage that is not also
    the first is a copy of the embedding's shard (Megatron's, lab 11's: the two copies' gradients
    are summed), so with pp > 1 a tied model holds its embedding twice over the pipeline.
    pp 1 gives params_per_rank."""
    check_divisible(c, tp)
    h, first, last = c.hidden, index == 0, index == pp - 1
    table = c.vocab * h // tp
    heads = (1 if first else 0) + (1 if last and (not c.tie_embeddings or not first) else 0)
    layers = c.layers // pp
    split, whole = layer_split(c)
    return RankParams(heads * table + layers * split // tp, layers * whole + _outside(c, first, last))


@dataclass(frozen=True)
class Collective:
    op: str              # all_reduce, all_gather, reduce_scatter
    phase: str           # forward or backward
    where: str
    calls: int           # per optimizer step
    bytes: int           # per call: all-reduce its tensor, all-gather its output, reduce-scatter its input

    @property
    def total(self) -> int:
        return self.calls * self.bytes


def collectives(c: ModelConfig, tp: int, seq: int, micro_batch: int, precision: str,
                sp: bool = False, micro_batches: int = 1, layers: int | None = None,
                embedding: bool = True, head: bool = True) -> list[Collective]:
    """What one rank issues in its TP group per optimizer step (micro_batches passes).

    A pipeline stage (lab 11) holds `layers` of the decoder layers (default: all), the
    embedding on the first stage only and the final norm, head and loss on the last only;
    `seq` is the tokens each rank runs (s / cp with context parallelism)."""
    check_divisible(c, tp)
    if precision not in ELEMENT_BYTES:
        raise PredictionError("precision", precision, ": use fp32, bf16 or fp16.")
    for name, value in (("seq", seq), ("micro_batch", micro_batch), ("micro_batches", micro_batches)):
        if value < 1:
            raise PredictionError(name, value, f" must be at least 1 (got {value}).", show="")
    if sp and tp == 1:
        raise PredictionError("sp", sp, ": sequence parallelism needs tp >= 2: raise {tp} or drop {sp}.", show="")
    if sp and seq % tp:
        raise PredictionError("seq", seq, f" does not split into {tp} sequence shards: use a multiple of {tp} "
                                          f"with {{sp}}.")
    if tp == 1:
        return []
    L, m = c.layers if layers is None else layers, micro_batches
    a = micro_batch * seq * c.hidden * ELEMENT_BYTES[precision]
    logits = micro_batch * seq * 4
    ce = Collective("all_reduce", "forward", "cross-entropy (max, sum of exp, target logit)", 3 * m, logits)
    if not sp:
        rows = [Collective("all_reduce", "forward", "embedding (vocab-parallel)", m, a),
                Collective("all_reduce", "forward", "layers (g after attention and after MLP)", 2 * L * m, a),
                ce,
                Collective("all_reduce", "backward", "head input (f)", m, a),
                Collective("all_reduce", "backward", "layers (f before attention and before MLP)", 2 * L * m, a)]
        return [r for r in rows if _on_stage(r, embedding, head) and r.calls]
    rows = [Collective("reduce_scatter", "forward", "embedding (vocab-parallel, to sequence shards)", m, a),
            Collective("all_gather", "forward", "layers (before attention and before MLP)", 2 * L * m, a),
            Collective("reduce_scatter", "forward", "layers (after attention and after MLP)", 2 * L * m, a),
            Collective("all_gather", "forward", "head input", m, a),
            ce,
            Collective("reduce_scatter", "backward", "head input", m, a),
            Collective("reduce_scatter", "backward", "layers (before attention and before MLP)", 2 * L * m, a),
            Collective("all_gather", "backward", "layers (after attention and after MLP)", 2 * L * m, a),
            Collective("all_gather", "backward", "embedding", m, a),
            Collective("all_reduce", "backward", "replicated norm weights' gradients", (2 * L + head) * m,
                       c.hidden * ELEMENT_BYTES[precision])]
    return [r for r in rows if _on_stage(r, embedding, head) and r.calls]


def _on_stage(row: Collective, embedding: bool, head: bool) -> bool:
    """Whether a stage holding (or not) the embedding and the head issues this row."""
    if row.where.startswith("embedding"):
        return embedding
    return head or not row.where.startswith(("head", "cross-entropy"))


def totals(rows: list[Collective]) -> dict[str, tuple[int, int]]:
    """op -> (calls, bytes) summed over the rows."""
    out: dict[str, tuple[int, int]] = {}
    for r in rows:
        calls, nbytes = out.get(r.op, (0, 0))
        out[r.op] = (calls + r.calls, nbytes + r.total)
    return out


def by_op_phase(rows: list[Collective]) -> dict[tuple[str, str], tuple[int, int]]:
    """(op, phase) -> (calls, bytes) summed over the rows: the keys of a rank's tally of them."""
    out: dict[tuple[str, str], tuple[int, int]] = {}
    for r in rows:
        calls, nbytes = out.get((r.op, r.phase), (0, 0))
        out[(r.op, r.phase)] = (calls + r.calls, nbytes + r.total)
    return out


def megatron_paper_count(layers: int) -> dict[str, int]:
    """The paper's all-reduces in the transformer layers per pass: 2 per layer each way."""
    return {"forward": 2 * layers, "backward": 2 * layers}
