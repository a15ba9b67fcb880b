"""Context parallelism on paper: which tokens each rank holds, how much attention it computes,
and what its ranks send each other (ring attention and DeepSpeed-Ulysses).

Host-side and pure: `plscale estimate cp` prints it, the context-parallel lab prints it beside
what its ranks count, and the ranks split their sequences with `positions`, so the lab's
split and its prediction are one definition.

Context parallelism splits the sequence of s tokens over cp ranks. Each rank keeps its
queries; keys and values travel (ring attention) or heads are exchanged (Ulysses). With a
causal mask a query sees only the keys before it, so the work is a triangle:

    plain split    rank r holds chunk r of cp chunks. Rank 0 attends within its chunk only;
                   the last rank attends to everything before it: work grows with r,
                   max/min -> 2cp - 1 for long chunks.
    zig-zag split  2cp chunks; rank r holds chunk r and chunk 2cp - 1 - r, one early and
                   one late, so every rank's two rows of the triangle add up to the same
                   work: max/min = 1.

Work is counted as query-key scores that count (unmasked pairs), per sequence and head:
a chunk pair (i, j) of c tokens each gives c^2 when j < i, c(c + 1)/2 when j = i (the
diagonal), nothing when j > i.

Communication, per attention layer and micro-batch of b sequences, e bytes an element, d the
head dimension, a heads, a_kv key/value heads. Every rank holds s/cp tokens whatever the
split (zig-zag's two chunks are s/2cp each), so one rank's keys (or values) are a block of

    B = b * (s/cp) * a_kv * d * e bytes.

Ring attention (Liu et al., 2023; the zig-zag ring of ring-flash-attention): the k, v blocks
go round the ring of cp ranks by point-to-point send/recv, one hop a step, while each rank
attends its queries to the block in hand.

    forward   cp - 1 hops of (k, v)                                  2(cp - 1) B sent
    backward  cp - 1 hops of (k, v), travelling with the gradient
              accumulators (dk, dv) that collect every rank's part   4(cp - 1) B
              and one more hop of the finished (dk, dv), home to
              the rank that owns those keys                        + 2 B
    (cp = 1: nothing is sent.)

2(cp - 1) B = 2(cp - 1)/cp of the whole sequence's k and v: each rank's forward volume
stays about constant (-> 2 b s a_kv d e) as cp grows, and every hop can hide behind the
attention of the block in hand (send the next block while computing this one).

DeepSpeed-Ulysses (Jacobs et al., 2023; deepspeed.sequence.layer.DistributedAttention)
swaps the split instead: an all-to-all turns q [b, s/P, a, d] into [b, s, a/P, d] (every
token, a P-th of the heads), the same for k and v [b, s/P, a_kv, d], attention runs on
whole sequences, and one more all-to-all turns the output back. Backward runs the four in
reverse on the gradients. The message (the tensor given to all_to_all_single, what
DeepSpeed's comms logger records) is the local tensor; a rank keeps 1/P of it and sends
the rest:

    forward   q, k, v, out: 2 b (s/P) (a + a_kv) d e in 4 messages    sent: (P - 1)/P of it
    backward  dout, dq, dk, dv: the same

so each rank sends about 2 b s (a + a_kv) d e / P each way: Ulysses' volume falls as 1/P,
but every all-to-all stands between the projections and the attention (no overlap), and
P may not exceed (and must divide, here) the number of key/value heads.

    >>> r = ring_bytes(micro_batch=1, seq=1024, cp=4, kv_heads=8, head_dim=64, element_bytes=2)
    >>> r.block, r.forward // r.block, r.backward // r.block
    (262144, 6, 14)
    >>> u = ulysses_bytes(1, 1024, 4, heads=8, kv_heads=8, head_dim=64, element_bytes=2)
    >>> u.forward_message // u.message_q, u.forward_sent == u.forward_message * 3 // 4
    (4, True)
"""

from dataclasses import dataclass
from math import gcd

from plscale.predict.errors import PredictionError
from plscale.predict.presets import ModelConfig

SPLITS = ("plain", "zigzag")


def check_split(seq: int, cp: int, split: str) -> None:
    """One line when the sequence does not cut into the split's chunks."""
    if split not in SPLITS:
        raise PredictionError("split", split, ": use plain or zigzag.")
    parts = 2 * cp if split == "zigzag" else cp
    if seq % parts:
        why = f"2 x cp = {parts} chunks (zig-zag)" if split == "zigzag" else f"cp = {cp} chunks"
        low, high = seq // parts * parts, -(-seq // parts) * parts
        raise PredictionError("seq", seq, f" does not cut into {why}: use {low or high}"
                                          f"{f' or {high}' if low and low != high else ''}.")


def chunks(cp: int, rank: int, split: str) -> list[int]:
    """The chunks rank holds, in order: [rank] of cp, or [rank, 2cp - 1 - rank] of 2cp."""
    return [rank, 2 * cp - 1 - rank] if split == "zigzag" else [rank]


def positions(seq: int, cp: int, rank: int, split: str) -> list[int]:
    """Global positions of the rank's tokens, in the order it holds them."""
    check_split(seq, cp, split)
    size = seq // (2 * cp if split == "zigzag" else cp)
    return [i * size + t for i in chunks(cp, rank, split) for t in range(size)]


def pair_work(i: int, j: int, size: int, causal: bool = True) -> int:
    """Unmasked query-key scores of query chunk i against key chunk j, chunks of `size` tokens."""
    if not causal or j < i:
        return size * size
    return size * (size + 1) // 2 if j == i else 0


def attention_work(seq: int, cp: int, split: str, causal: bool = True) -> list[int]:
    """Unmasked query-key scores per rank (one sequence, one head): the rank's query chunks
    against every chunk of the sequence."""
    check_split(seq, cp, split)
    n = 2 * cp if split == "zigzag" else cp
    size = seq // n
    return [sum(pair_work(i, j, size, causal) for i in chunks(cp, r, split) for j in range(n)) for r in range(cp)]


def imbalance(work: list) -> float:
    """max / min work per rank: 1.0 is perfect balance."""
    return max(work) / min(work) if min(work) else float("inf")


# ---- communication -----------------------------------------------------------------------------

def _check_tokens(seq: int, cp: int, micro_batch: int = 1) -> None:
    if cp < 1:
        raise PredictionError("cp", cp, ": context parallelism needs at least 1 rank; use {cp} 1 (no split) or more.")
    for name, value in (("seq", seq), ("micro_batch", micro_batch)):
        if value < 1:
            raise PredictionError(name, value, ": must be at least 1.")
    if seq % cp:
        raise PredictionError("seq", seq, f" does not split over {{cp}} {cp} ranks: use a multiple of {cp}.")


@dataclass(frozen=True)
class RingBytes:
    """Bytes one rank sends by point-to-point per attention layer and micro-batch (ring attention)."""
    cp: int
    block: int           # one rank's keys (or values): b * s/cp * a_kv * d * e
    forward: int         # 2(cp - 1) blocks: k, v
    backward: int        # 4(cp - 1) + 2 blocks: k, v with dk, dv; then dk, dv home (0 at cp 1)

    @property
    def total(self) -> int:
        return self.forward + self.backward


def ring_bytes(micro_batch: int, seq: int, cp: int, kv_heads: int, head_dim: int,
               element_bytes: int) -> RingBytes:
    """What each rank of a ring of cp sends per attention layer and micro-batch.

    >>> ring_bytes(2, 64, 2, kv_heads=4, head_dim=32, element_bytes=4)   # block 2*32*4*32*4
    RingBytes(cp=2, block=32768, forward=65536, backward=196608)
    >>> ring_bytes(2, 64, 1, 4, 32, 4).total
    0
    """
    _check_tokens(seq, cp, micro_batch)
    block = micro_batch * (seq // cp) * kv_heads * head_dim * element_bytes
    hops = cp - 1
    return RingBytes(cp, block, 2 * hops * block, (4 * hops + 2) * block if cp > 1 else 0)


def ulysses_degrees(heads: int, kv_heads: int) -> list[int]:
    """The Ulysses degrees that divide both the query heads and the key/value heads."""
    common = gcd(heads, kv_heads)
    return [d for d in range(1, common + 1) if common % d == 0]


def check_ulysses(heads: int, kv_heads: int, degree: int) -> None:
    """One line when the heads do not split over the Ulysses degree.

    (DeepSpeed itself also splits heads unevenly, with at least one key/value head a rank;
    this model, like the lab, keeps to even splits.)"""
    if degree < 1:
        raise PredictionError("ulysses_degree", degree, f"Ulysses degree {degree}: use 1 (no split) or more.", lead=False)
    if heads % degree or kv_heads % degree:
        ok = ulysses_degrees(heads, kv_heads)
        choices = ok[0] if len(ok) == 1 else f"{', '.join(map(str, ok[:-1]))} or {ok[-1]}"
        raise PredictionError("ulysses_degree", degree, f"{heads} heads and {kv_heads} key/value heads do not split "
                              f"over Ulysses degree {degree}: use degree {choices} (they divide both), or ring "
                              f"attention.", lead=False)


@dataclass(frozen=True)
class UlyssesBytes:
    """DeepSpeed-Ulysses' all-to-alls per attention layer and micro-batch, one rank of P."""
    degree: int
    message_q: int       # the message of q's all-to-all, and of the output's: b * s/P * a * d * e
    message_kv: int      # of k's, and of v's: b * s/P * a_kv * d * e

    @property
    def calls(self) -> int:
        """all_to_all_single calls per phase (forward; backward the same): q, k, v, out."""
        return 4 if self.degree > 1 else 0

    @property
    def forward_message(self) -> int:
        return 2 * (self.message_q + self.message_kv) if self.degree > 1 else 0

    @property
    def forward_sent(self) -> int:
        """(P - 1)/P of every message leaves the rank; it keeps the P-th addressed to itself."""
        return self.forward_message // self.degree * (self.degree - 1)

    backward_message = forward_message   # dout, dq, dk, dv: the same shapes in reverse
    backward_sent = forward_sent

    @property
    def total_sent(self) -> int:
        return self.forward_sent + self.backward_sent


def ulysses_bytes(micro_batch: int, seq: int, cp: int, heads: int, kv_heads: int, head_dim: int,
                  element_bytes: int) -> UlyssesBytes:
    """DeepSpeed-Ulysses (DistributedAttention) over cp = P ranks, per attention layer.

    >>> u = ulysses_bytes(2, 64, 2, heads=4, kv_heads=4, head_dim=32, element_bytes=4)
    >>> u.message_q, u.forward_message, u.forward_sent, u.total_sent
    (32768, 131072, 65536, 131072)
    """
    _check_tokens(seq, cp, micro_batch)
    check_ulysses(heads, kv_heads, cp)
    local = micro_batch * (seq // cp) * head_dim * element_bytes
    return UlyssesBytes(cp, local * heads, local * kv_heads)


@dataclass(frozen=True)
class CommRow:
    """One (seq, cp) of `comm_table`: bytes one rank sends per attention layer, forward + backward."""
    seq: int
    cp: int
    ring: int
    ulysses: int | None  # None: the heads do not split over cp


def comm_table(config: ModelConfig, micro_batch: int, seqs, cps, element_bytes: int) -> list[CommRow]:
    """Ring and Ulysses bytes sent per rank per layer (forward + backward) for every seq x cp,
    skipping pairs where seq does not split over cp. The lesson in the numbers: down a column
    of cp, ring's bytes stay near 6 b s a_kv d e (2(cp-1)/cp of k, v forward) while Ulysses'
    fall as 1/P; both double with seq.

    >>> from plscale.predict.presets import preset
    >>> [(r.cp, r.ring, r.ulysses) for r in comm_table(preset("small"), 1, [128], [2, 4, 8], 2)]
    [(2, 262144, 131072), (4, 327680, 98304), (8, 360448, None)]
    """
    rows = []
    for seq in seqs:
        for cp in cps:
            if seq % cp:
                continue
            ring = ring_bytes(micro_batch, seq, cp, config.kv_heads, config.head_dim, element_bytes).total
            split = config.heads % cp == 0 and config.kv_heads % cp == 0
            uly = ulysses_bytes(micro_batch, seq, cp, config.heads, config.kv_heads, config.head_dim,
                                element_bytes).total_sent if split else None
            rows.append(CommRow(seq, cp, ring, uly))
    return rows
