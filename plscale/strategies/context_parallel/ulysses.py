"""DeepSpeed-Ulysses: trade the sequence split for a head split, attend, and trade back.

Each of P ranks holds s/P tokens with all h heads. Attention needs every token of a head but
each head is independent, so one all-to-all regroups the data: afterwards each rank holds
all s tokens of h/P heads, attends exactly as on one GPU, and a second all-to-all brings the
output back to the sequence split (Jacobs et al., DeepSpeed Ulysses, 2023):

    [b, s/P, h, d] --all-to-all--> [b, s, h/P, d] --attention--> [b, s, h/P, d] --all-to-all--> [b, s/P, h, d]

q, k and v each take an all-to-all in, the output one back: four per attention forward, and
four again backward (the gradients travel the reverse way). Each moves the whole local tensor
(what DeepSpeed's comms logger counts as the message size), of which (P - 1)/P leaves the
rank. Query heads and key/value heads must both divide by P; the tokens are the plain
(contiguous) split, since the local attention sees the whole sequence in order.

    out = ulysses_attention(q, k, v, group)        # same layout as ring_attention
    TALLY.reset(); out.sum().backward(); TALLY.rows()

DeepSpeed's communication layer must be up: `deepspeed.init_distributed()` (plscale's rank
runtime does it) after, or instead of, torch's.
"""

import deepspeed.comm
import torch
import torch.distributed as dist
import torch.nn.functional as F
from deepspeed.sequence.layer import DistributedAttention

from plscale.rank.tally import Tally

TALLY = Tally()


class _Crossed(torch.autograd.Function):
    """Identity that counts one all-to-all each way: every tensor entering or leaving the local
    attention crossed one in the forward, and its gradient crosses one in the backward."""

    @staticmethod
    def forward(ctx, x):
        TALLY.add("all_to_all", "forward", x)
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        TALLY.add("all_to_all", "backward", grad)
        return grad


class LocalAttention(torch.nn.Module):
    """Causal SDPA over the whole sequence for this rank's h/P heads, in DeepSpeed's [b, s, h, d]."""

    def __init__(self, causal: bool = True):
        super().__init__()
        self.causal = causal

    def forward(self, q, k, v):
        q, k, v = (_Crossed.apply(t).transpose(1, 2) for t in (q, k, v))   # -> [b, h/P, s, d]
        out = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal,
                                             enable_gqa=q.shape[1] != k.shape[1])
        return _Crossed.apply(out.transpose(1, 2))


def check_heads(heads: int, kv_heads: int, size: int) -> None:
    """Ulysses gives each rank h/P query heads and h_kv/P key/value heads: both must divide."""
    if heads % size or kv_heads % size:
        raise ValueError(f"Ulysses over {size} ranks needs query heads ({heads}) and key/value heads "
                         f"({kv_heads}) divisible by {size}: use ring attention, or fewer ranks.")


def ulysses_attention(q, k, v, group, causal: bool = True):
    """Attention of this rank's s/P tokens over the whole sequence by two all-to-alls.

    q [b, heads, s/P, d]; k, v [b, kv_heads, s/P, d], the plain split (rank r holds tokens
    r s/P .. (r+1) s/P - 1). Returns [b, heads, s/P, d], as ring_attention does.
    """
    check_heads(q.shape[1], k.shape[1], dist.get_world_size(group))
    if not deepspeed.comm.is_initialized():
        raise RuntimeError("DeepSpeed's communication layer is not initialised: call "
                           "deepspeed.init_distributed() once torch.distributed is up.")
    attention = DistributedAttention(LocalAttention(causal), group, scatter_idx=2, gather_idx=1)
    out = attention(*(t.transpose(1, 2) for t in (q, k, v)), batch_dim_idx=0)   # [b, s/P, h, d]
    return out.transpose(1, 2)
