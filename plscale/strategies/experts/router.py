"""Top-k gating by hand: which expert each token goes to, in which slot, with what weight.

A router is one linear layer, hidden -> E scores per token, then a softmax (GShard; DeepSpeed's
TopKGate, whose weight `wg` this mirrors, in fp32 whatever the model's precision):

    gates = softmax(x @ wg.T)                       [S, E], each row sums to 1
    first = argmax(gates)                           top-1: the token's expert
    second = argmax(gates without first)            top-2: its runner-up

Every expert has a queue of C slots, C = capacity(S, E, k, capacity_factor, min_capacity)
(plscale.predict.experts, the formula the labs predict with). A route's place in the queue
is a running count in token order, cumsum(mask) - 1; with top-2 every first choice queues
before any second choice. A route whose place is C or more is dropped:

    expert 0's queue (C = 3):  t0 t2 t5 | t7 t9     t7 and t9 dropped (their residual carries them)

DeepSpeed's top-1 gate picks the survivors another way: it asks `torch.topk` for C rows of
the 0/1 mask of each expert. All its tokens tie at 1, and topk breaks the tie by its selection
algorithm, not by token order: on CPU std::nth_element (the first come only where 64 * C <= S,
when it uses std::partial_sort). An overflowing expert keeps C tokens, as many, but not always
the first C. This router calls topk the same way, so it keeps exactly the tokens DeepSpeed
keeps. Top-2 keeps the first come, as above.

What the layer needs comes back as dense [S, E, C] tensors (GShard's einsum form):

    dispatch[s, e, c]   True where token s sits in slot c of expert e
    combine[s, e, c]    the weight its expert's output gets on the way back: the gate value
                        (top-1), or the two kept gates renormalised to sum to 1 (top-2)

and the load-balancing loss (Switch Transformer; DeepSpeed's l_aux), smallest when the
experts share the tokens evenly:

    l_aux = E * sum_e mean_s(gates[s, e]) * fraction of tokens whose first choice is e
"""

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from plscale.predict.experts import capacity, check_capacity, check_top_k


@dataclass
class Routing:
    combine: torch.Tensor   # [S, E, C] fp32: the weight of each kept route at its slot, else 0
    dispatch: torch.Tensor  # [S, E, C] bool: token s in slot c of expert e
    l_aux: torch.Tensor     # scalar, the load-balancing loss
    counts: torch.Tensor    # [E] routes sent to each expert, before drops (DeepSpeed's exp_counts)
    dropped: int            # routes beyond capacity (of S * k)
    capacity: int           # C, slots per expert


def route(logits: torch.Tensor, top_k: int, capacity_factor: float, min_capacity: int = 4) -> Routing:
    """Top-1 or top-2 routing of S tokens from their [S, E] router logits (fp32)."""
    tokens, experts = logits.shape
    check_top_k(top_k, experts)
    if top_k == 1 and tokens < min_capacity:
        raise ValueError(f"{tokens} tokens, fewer than min_capacity {min_capacity} (DeepSpeed's top1gating asserts)")
    gates = F.softmax(logits, dim=1)
    slots = capacity(tokens, experts, top_k, capacity_factor, min_capacity)

    first = F.one_hot(gates.argmax(dim=1), experts)                        # [S, E] 0/1
    routes = [first]
    if top_k == 2:
        routes.append(F.one_hot(logits.masked_fill(first.bool(), float("-inf")).argmax(dim=1), experts))
    counts = sum(routes).sum(dim=0)
    l_aux = experts * torch.sum(gates.mean(dim=0) * first.float().mean(dim=0))

    if top_k == 1:  # DeepSpeed's top1gating: topk chooses which C of the tied 1s survive
        chosen = torch.topk(first, k=min(slots, tokens), dim=0).indices
        kept = [first * torch.zeros_like(first).scatter_(0, chosen, 1)]
        places = [torch.cumsum(kept[0], dim=0) - 1]
    else:           # top2gating: first come, first served; second choices queue behind all first
        places = [torch.cumsum(routes[0], dim=0) - 1,
                  torch.cumsum(routes[1], dim=0) - 1 + routes[0].sum(dim=0, keepdim=True)]
        kept = [mask * (place < slots) for mask, place in zip(routes, places)]

    weights = [(gates * mask).sum(dim=1) for mask in kept]                 # [S] each; 0 when dropped
    if top_k == 2:  # the kept gates of a token, renormalised to sum to 1
        total = torch.clamp(weights[0] + weights[1], min=torch.finfo(gates.dtype).eps)
        weights = [w / total for w in weights]
    combine = 0
    for w, mask, place in zip(weights, kept, places):
        slot = F.one_hot((place * mask).sum(dim=1), slots).float()        # [S, C] each token's slot
        combine = combine + torch.einsum("se,sc->sec", w[:, None] * mask, slot)
    dropped = int(counts.sum() - sum(mask.sum() for mask in kept))
    return Routing(combine, combine.bool(), l_aux, counts, dropped, slots)


class Router(nn.Module):
    """The gate: a bias-free linear layer to E logits, in fp32, then `route`."""

    def __init__(self, hidden: int, experts: int, top_k: int, capacity_factor: float, min_capacity: int = 4):
        super().__init__()
        check_top_k(top_k, experts)
        check_capacity(capacity_factor)
        self.wg = nn.Linear(hidden, experts, bias=False)
        self.top_k, self.capacity_factor, self.min_capacity = top_k, capacity_factor, min_capacity

    def forward(self, x: torch.Tensor) -> Routing:
        """x: [S, hidden] -> the routing of those S tokens."""
        logits = F.linear(x.float(), self.wg.weight.float())
        return route(logits, self.top_k, self.capacity_factor, self.min_capacity)
