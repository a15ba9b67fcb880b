"""Mixture-of-experts on paper: how many tokens an expert takes, how many are dropped.

Host-side and pure: `plscale estimate moe` prints it, the expert lab prints it beside what
its routers count, and the router written by hand (plscale/rank/experts/router.py) sizes its
buffers with `capacity`, so the lab and the mechanism cannot disagree.

A router sends each of S tokens to its top-k of E experts. Every expert has room for C
tokens per micro-batch and rank (GShard's capacity; DeepSpeed's `_capacity`):

    C = max(ceil(S / E * (k * capacity_factor)), min_capacity)

(DeepSpeed's top-2 gate passes 2 x capacity_factor, the same formula with k = 2.) Tokens
routed to a full expert are dropped: that route adds nothing, and the residual carries the
token past the MLP unchanged.
"""

from math import ceil

from plscale.errors import UserError


def check_experts(experts: int, ep: int) -> None:
    if experts < 1:
        raise UserError(f"experts {experts}: use 1 or more experts.")
    if ep < 1 or experts % ep:
        ok = [str(d) for d in range(1, experts + 1) if experts % d == 0]
        raise UserError(f"{experts} experts do not split over ep {ep} ranks: use ep {', '.join(ok)}, "
                        f"or a number of experts divisible by {ep}.")


def check_capacity(capacity_factor: float) -> None:
    if not isinstance(capacity_factor, (int, float)) or capacity_factor <= 0:
        raise UserError(f"capacity factor {capacity_factor!r}: use a number above 0 (1.0 gives each expert "
                        f"its even share of the tokens; 1.25 is common).")


def check_top_k(top_k: int, experts: int) -> None:
    if top_k not in (1, 2) or top_k > experts:
        raise UserError(f"top_k {top_k!r}: use 1 or 2 (DeepSpeed's gates), and no more than the {experts} experts.")


def capacity(tokens: int, experts: int, top_k: int, capacity_factor: float, min_capacity: int = 0) -> int:
    """Tokens each expert takes per micro-batch and rank."""
    return max(ceil(tokens / experts * (top_k * capacity_factor)), min_capacity)  # DeepSpeed's order of operations
