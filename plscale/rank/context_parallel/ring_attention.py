"""Ring attention: each rank keeps its queries, the keys and values travel round the ring.

Context parallelism gives each of cp ranks s/cp tokens of every sequence (which ones:
`plscale.predict.context_parallel.positions`, plain or zig-zag). A query needs every key
before it, so the key/value blocks go round: at step i rank r holds the block of owner
(r - i) mod cp, computes with it while it passes it on to r + 1 and receives the next from
r - 1. After cp steps every query has met every key, and nobody held more than two blocks.

    step 0      step 1      step 2            r0 r1 r2 r3   (cp = 4)
    r: own      r: r-1      r: r-2     ...    k/v blocks move one rank right each step

Partial results merge with the online softmax (flash attention's trick): keep per query the
output so far and lse = log(sum of exp(scores)); a new block with (out_b, lse_b) gives

    lse' = log(exp(lse) + exp(lse_b))        out' = out exp(lse - lse') + out_b exp(lse_b - lse')

Work is done per chunk pair (a query chunk against a held key chunk): skipped when every key
comes after every query, computed unmasked when every key comes before, and masked only on
the diagonal. The backward recomputes the probabilities from q, k, v, out and lse (the
tensors SDPA saves, so activation memory is the dense model's at s/cp tokens). The gradient
accumulators dk, dv travel with their block and arrive home after one more hop:

    forward    (cp - 1) x k, v                 = 2 (cp - 1) blocks sent per rank
    backward   (cp - 1) x k, v, dk, dv  + dk, dv = 4 (cp - 1) + 2 blocks,
               block = batch x s/cp x kv_heads x head_dim x element bytes

dk and dv accumulate (and travel) in float32 at least, so in bf16 they weigh twice a block.

    out = ring_attention(q, k, v, group, positions(seq, cp, rank, "zigzag"))
    TALLY.reset(); out.sum().backward(); TALLY.rows()
"""

import math
import time
from collections import defaultdict

import torch
import torch.distributed as dist

from plscale.predict.context_parallel import SPLITS, chunks, positions as split_positions

PHASES = ("forward", "backward")


class Tally:
    """What ring attention did on this rank, by phase ("forward", "backward"):

    sends            tensors sent point-to-point (one isend each)
    sent_bytes       bytes of those tensors
    scores           unmasked query-key scores evaluated, per sequence and head, counted from
                     the blocks and masks actually computed (compare: attention_work)
    compute_seconds  time spent computing on blocks, not waiting for them
    """

    def __init__(self):
        self.reset()

    def reset(self) -> None:
        self.sends, self.sent_bytes = defaultdict(int), defaultdict(int)
        self.scores, self.compute_seconds = defaultdict(int), defaultdict(float)

    def rows(self) -> dict:
        """{phase: {"sends", "sent_bytes", "scores", "compute_seconds"}}"""
        return {phase: {"sends": self.sends[phase], "sent_bytes": self.sent_bytes[phase],
                        "scores": self.scores[phase], "compute_seconds": self.compute_seconds[phase]}
                for phase in PHASES}


TALLY = Tally()


class Ring:
    """This rank's place in the ring, and every rank's tokens cut into its chunks."""

    def __init__(self, group, local_positions):
        self.group, self.cp, self.rank = group, dist.get_world_size(group), dist.get_rank(group)
        self.next = dist.get_global_rank(group, (self.rank + 1) % self.cp)
        self.prev = dist.get_global_rank(group, (self.rank - 1) % self.cp)
        local = [int(p) for p in local_positions]
        seq = len(local) * self.cp
        split = next((s for s in SPLITS if seq % (self.cp * len(chunks(self.cp, 0, s))) == 0
                      and split_positions(seq, self.cp, self.rank, s) == local), None)
        if split is None:
            raise ValueError("ring attention takes the positions of a plain or zig-zag split: "
                             "plscale.predict.context_parallel.positions(seq, cp, rank, split)")
        self.chunks = [torch.tensor(split_positions(seq, self.cp, owner, split)).chunk(len(chunks(self.cp, owner, split)))
                       for owner in range(self.cp)]   # [owner][chunk] -> global positions

    def exchange(self, tensors: list, phase: str) -> tuple:
        """Send tensors to the next rank, receive as many from the previous one; returns
        (requests, received): wait on the requests before reading the received tensors."""
        received = [torch.empty_like(t) for t in tensors]
        ops = [dist.P2POp(dist.isend, t, self.next, self.group) for t in tensors]
        ops += [dist.P2POp(dist.irecv, t, self.prev, self.group) for t in received]
        TALLY.sends[phase] += len(tensors)
        TALLY.sent_bytes[phase] += sum(t.numel() * t.element_size() for t in tensors)
        return dist.batch_isend_irecv(ops), received


def _wait(requests) -> None:
    for request in requests:
        request.wait()


def _pairs(ring: Ring, owner: int, causal: bool):
    """(query slice, key slice, mask) for each chunk pair worth computing; mask None = all visible."""
    size_q, size_k = len(ring.chunks[ring.rank][0]), len(ring.chunks[owner][0])
    for a, q_pos in enumerate(ring.chunks[ring.rank]):
        for b, k_pos in enumerate(ring.chunks[owner]):
            if causal and k_pos.min() > q_pos.max():
                continue                                   # every key after every query: skip
            mask = None if not causal or k_pos.max() <= q_pos.min() else q_pos[:, None] >= k_pos[None, :]
            yield slice(a * size_q, (a + 1) * size_q), slice(b * size_k, (b + 1) * size_k), mask


def _scores(q, k, mask, scale, phase):
    """Scaled scores [b, kv_heads, group, sq, sk] of grouped queries against one key chunk."""
    s = torch.einsum("bngqd,bnkd->bngqk", q, k) * scale
    TALLY.scores[phase] += int(mask.sum()) if mask is not None else s.shape[-2] * s.shape[-1]
    return s if mask is None else s.masked_fill(~mask, float("-inf"))


class RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, ring: Ring, causal: bool):
        b, h, s, d = q.shape
        h_kv, acc = k.shape[1], torch.promote_types(q.dtype, torch.float32)
        scale = 1 / math.sqrt(d)
        qg = q.to(acc).reshape(b, h_kv, h // h_kv, s, d)   # query heads grouped by their kv head
        out = torch.zeros_like(qg)
        lse = torch.full(qg.shape[:-1], float("-inf"), dtype=acc)
        k_held, v_held = k.contiguous(), v.contiguous()
        for step in range(ring.cp):
            if step < ring.cp - 1:                         # pass the block on while computing with it
                requests, (k_next, v_next) = ring.exchange([k_held, v_held], "forward")
            start = time.perf_counter()
            for qs, ks, mask in _pairs(ring, (ring.rank - step) % ring.cp, causal):
                scores = _scores(qg[..., qs, :], k_held[:, :, ks].to(acc), mask, scale, "forward")
                block_lse = scores.logsumexp(-1)
                block_out = torch.einsum("bngqk,bnkd->bngqd", (scores - block_lse[..., None]).exp(),
                                         v_held[:, :, ks].to(acc))
                new_lse = torch.logaddexp(lse[..., qs], block_lse)
                out[..., qs, :] = (out[..., qs, :] * (lse[..., qs] - new_lse).exp()[..., None]
                                   + block_out * (block_lse - new_lse).exp()[..., None])
                lse[..., qs] = new_lse
            TALLY.compute_seconds["forward"] += time.perf_counter() - start
            if step < ring.cp - 1:
                _wait(requests)
                k_held, v_held = k_next, v_next
        out = out.reshape(b, h, s, d).to(q.dtype)
        lse = lse.reshape(b, h, s)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.ring, ctx.causal = ring, causal
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        ring, causal = ctx.ring, ctx.causal
        b, h, s, d = q.shape
        h_kv, acc = k.shape[1], lse.dtype
        scale = 1 / math.sqrt(d)
        grouped = (b, h_kv, h // h_kv, s)
        qg, dout = q.to(acc).reshape(*grouped, d), dout.to(acc).reshape(*grouped, d)
        lse = lse.reshape(grouped)
        delta = (dout * out.to(acc).reshape(*grouped, d)).sum(-1)  # rowsum(dO * O) = sum_k P dP
        dq = torch.zeros_like(qg)
        k_held, v_held = k.contiguous(), v.contiguous()
        dk_held, dv_held = torch.zeros_like(k_held, dtype=acc), torch.zeros_like(v_held, dtype=acc)
        for step in range(ring.cp):
            if step < ring.cp - 1:                         # the next k, v travel while we compute
                requests, (k_next, v_next) = ring.exchange([k_held, v_held], "backward")
            start = time.perf_counter()
            for qs, ks, mask in _pairs(ring, (ring.rank - step) % ring.cp, causal):
                k_blk, v_blk = k_held[:, :, ks].to(acc), v_held[:, :, ks].to(acc)
                probs = (_scores(qg[..., qs, :], k_blk, mask, scale, "backward") - lse[..., qs, None]).exp()
                dv_held[:, :, ks] += torch.einsum("bngqk,bngqd->bnkd", probs, dout[..., qs, :])
                dprobs = torch.einsum("bngqd,bnkd->bngqk", dout[..., qs, :], v_blk)
                dscores = probs * (dprobs - delta[..., qs, None]) * scale
                dq[..., qs, :] += torch.einsum("bngqk,bnkd->bngqd", dscores, k_blk)
                dk_held[:, :, ks] += torch.einsum("bngqk,bngqd->bnkd", dscores, qg[..., qs, :])
            TALLY.compute_seconds["backward"] += time.perf_counter() - start
            if step < ring.cp - 1:
                _wait(requests)
                k_held, v_held = k_next, v_next
            if ring.cp > 1:   # dk, dv follow their block; after the last step they reach its owner
                requests, (dk_held, dv_held) = ring.exchange([dk_held, dv_held], "backward")
                _wait(requests)
        return dq.reshape(b, h, s, d).to(q.dtype), dk_held.to(k.dtype), dv_held.to(v.dtype), None, None


def ring_attention(q, k, v, group, positions, causal: bool = True):
    """Attention of this rank's queries over the whole sequence, k/v passed round the ring.

    q [b, heads, s/cp, d]; k, v [b, kv_heads, s/cp, d] (heads a multiple of kv_heads);
    positions: the global positions of the local tokens, from
    `plscale.predict.context_parallel.positions(seq, cp, rank, split)`. Returns [b, heads, s/cp, d].
    """
    if q.shape[1] % k.shape[1]:
        raise ValueError(f"{q.shape[1]} query heads do not group over {k.shape[1]} key/value heads")
    return RingAttention.apply(q, k, v, Ring(group, positions), causal)
