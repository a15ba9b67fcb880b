"""Context parallelism on paper: which tokens each rank holds, and how much attention it computes.

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
"""

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
