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

from plscale.errors import UserError

SPLITS = ("plain", "zigzag")


def check_split(seq: int, cp: int, split: str) -> None:
    """One line when the sequence does not cut into the split's chunks."""
    if split not in SPLITS:
        raise UserError(f"split {split!r}: use plain or zigzag.")
    parts = 2 * cp if split == "zigzag" else cp
    if seq % parts:
        why = f"2 x cp = {parts} chunks (zig-zag)" if split == "zigzag" else f"cp = {cp} chunks"
        low, high = seq // parts * parts, -(-seq // parts) * parts
        raise UserError(f"sequence length {seq} does not cut into {why}: use {low or high}"
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
