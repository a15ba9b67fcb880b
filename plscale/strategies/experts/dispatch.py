"""Sending tokens to their experts and back: two all-to-alls per MoE layer (GShard).

E experts are split over the ep ranks of an expert-parallel group, E/ep on each: rank r holds
experts r*E/ep ... (r+1)*E/ep - 1. Each rank routes its own tokens, then:

    dispatch   [S, h] tokens -> [E, C, h]         each expert's C slots, filled from this rank
    all-to-all [E, C, h] -> [ep, E/ep, C, h]      block j of the E experts goes to rank j; from
                                                  rank i comes its block for my experts
    regroup    -> [E/ep, ep*C, h]                 each local expert sees every rank's slots
    experts    run their MLP on their ep*C rows
    all-to-all back (the same exchange, inverted), then
    combine    [E, C, h] -> [S, h]                the kept routes' outputs, weighted by the gate

An all-to-all transposes blocks between ranks. ep 2, E 4 (rank 0 holds e0 e1, rank 1 e2 e3):

               before: my slots, by expert         after: my experts' slots, by source rank
    rank 0     [ r0->e0,e1 | r0->e2,e3 ]           [ r0->e0,e1 | r1->e0,e1 ]
    rank 1     [ r1->e0,e1 | r1->e2,e3 ]           [ r0->e2,e3 | r1->e2,e3 ]

The all-to-all's gradient is an all-to-all the other way, so one MoE layer costs four per
micro-batch: dispatch and combine, forward and backward. Each moves the [E, C, h] buffer, of
which a rank keeps its own block and sends (ep-1)/ep. Every call is counted in TALLY:

    TALLY.reset(); model(x, y).backward(); TALLY.rows()   # {("all_to_all", phase): (calls, bytes)}

With ep = 1 (one rank holds every expert) there is nothing to exchange and nothing is counted.
"""

import torch
import torch.distributed as dist

from plscale.strategies.experts.router import Routing
from plscale.rank.tally import Tally

TALLY = Tally()


def all_to_all(x: torch.Tensor, group, phase: str) -> torch.Tensor:
    """Block j of x's first dimension to rank j; block i of the result from rank i (even blocks)."""
    x = x.contiguous()
    out = torch.empty_like(x)
    dist.all_to_all_single(out, x, group=group)
    TALLY.add("all_to_all", phase, x)
    return out


class _AllToAll(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return all_to_all(x, group, "forward")

    @staticmethod
    def backward(ctx, grad):
        return all_to_all(grad, ctx.group, "backward"), None


def group_size(group) -> int:
    """Ranks in the expert-parallel group; None means one rank holding every expert."""
    return 1 if group is None else dist.get_world_size(group)


def dispatch(x: torch.Tensor, routing: Routing) -> torch.Tensor:
    """[S, h] tokens -> [E, C, h]: slot c of expert e holds its token, or zeros when empty."""
    return torch.einsum("sec,sh->ech", routing.dispatch.to(x.dtype), x)


def to_experts(buffer: torch.Tensor, group) -> torch.Tensor:
    """[E, C, h] slots of this rank -> [E/ep, ep*C, h]: every rank's slots of my experts."""
    ep = group_size(group)
    experts, slots, hidden = buffer.shape
    if ep > 1:
        buffer = _AllToAll.apply(buffer, group)                     # [ep * E/ep, C, h], source rank first
    local = buffer.view(ep, experts // ep, slots, hidden).transpose(0, 1)
    return local.reshape(experts // ep, ep * slots, hidden)


def from_experts(out: torch.Tensor, group) -> torch.Tensor:
    """[E/ep, ep*C, h] outputs of my experts -> [E, C, h] outputs for this rank's slots."""
    ep = group_size(group)
    local, rows, hidden = out.shape
    blocks = out.view(local, ep, rows // ep, hidden).transpose(0, 1).reshape(local * ep, rows // ep, hidden)
    return _AllToAll.apply(blocks, group) if ep > 1 else blocks


def combine(out: torch.Tensor, routing: Routing) -> torch.Tensor:
    """[E, C, h] expert outputs -> [S, h]: each token's kept routes, weighted; at least fp32."""
    dtype = torch.promote_types(out.dtype, torch.float32)
    return torch.einsum("sec,ech->sh", routing.combine.to(dtype), out.to(dtype)).to(out.dtype)
