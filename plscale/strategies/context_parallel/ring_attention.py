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
the diagonal. Each pair is attention on its own, returning (out, lse): PyTorch's fused CPU
flash-attention kernel on CPU (it never holds the [sq, sk] scores), or the same written out
in einsums (`_math_forward`, the path on other devices). The backward recomputes the
probabilities from q, k, v, out and lse (the tensors SDPA saves, so activation memory is the
dense model's at s/cp tokens). The gradient
accumulators dk, dv travel with their block and arrive home after one more hop. The k, v
exchange overlaps the compute; the dk, dv hop follows each step's compute and is waited for
(ring-flash-attention overlaps it too, with one more buffer):

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
                     the chunk pairs actually computed (compare: attention_work)
    compute_seconds  time spent computing on blocks, not waiting for them (on CUDA, kernels run
                     asynchronously: measured with CUDA events, read when asked for)
    waited           seconds spent waiting for the next block after computing on this one: the
                     ring's exposed communication (on the host: under CUDA the wait is queued)
    """

    def __init__(self):
        self.reset()

    def reset(self) -> None:
        self.sends, self.sent_bytes = defaultdict(int), defaultdict(int)
        self.scores, self._seconds, self._events = defaultdict(int), defaultdict(float), defaultdict(list)
        self.pending = 0  # scores of the chunk pairs handed out since the last count
        self.waited = defaultdict(float)

    def start(self, device: torch.device):
        """A mark to pass to `count` when the step's compute is queued."""
        if device.type != "cuda":
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def count(self, phase: str, started) -> None:
        self.scores[phase] += self.pending
        self.pending = 0
        if isinstance(started, float):
            self._seconds[phase] += time.perf_counter() - started
        else:
            end = torch.cuda.Event(enable_timing=True)
            end.record()
            self._events[phase].append((started, end))

    @property
    def compute_seconds(self) -> dict:
        for phase, pairs in self._events.items():  # CUDA: wait for the recorded kernels, once
            for start, end in pairs:
                end.synchronize()
                self._seconds[phase] += start.elapsed_time(end) / 1e3
            pairs.clear()
        return self._seconds

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


def _wait(requests, phase: str) -> None:
    start = time.perf_counter()
    for request in requests:
        request.wait()
    TALLY.waited[phase] += time.perf_counter() - start


def _pairs(ring: Ring, owner: int, causal: bool):
    """(query slice, key slice, diagonal) for each chunk pair worth computing. Chunks are runs
    of consecutive positions, so a pair is all before (no mask), all after (skipped) or the
    same chunk (the diagonal: a causal mask, aligned top-left)."""
    size_q, size_k = len(ring.chunks[ring.rank][0]), len(ring.chunks[owner][0])
    for a, q_pos in enumerate(ring.chunks[ring.rank]):
        for b, k_pos in enumerate(ring.chunks[owner]):
            if causal and k_pos.min() > q_pos.max():
                continue                                   # every key after every query: skip
            diagonal = causal and k_pos.max() > q_pos.min()
            # the scores that count: for each query, the keys at or before it
            TALLY.pending += int(torch.searchsorted(k_pos, q_pos, right=True).sum()) if diagonal else size_q * size_k
            yield slice(a * size_q, (a + 1) * size_q), slice(b * size_k, (b + 1) * size_k), diagonal


# ---- One chunk pair: attention of a query chunk against one key chunk, on its own ------------
# Two kernels compute the same thing. "math" writes it out: scores, masked softmax through the
# log-sum-exp, and the backward from the saved lse. "fused" is PyTorch's CPU flash-attention
# kernel, which returns the lse too and never holds the [sq, sk] scores: the one to run
# (memory like SDPA's); "math" is what it computes, and the path on other devices.

def _wide(*tensors):
    """In float32 at least: the math kernel's softmax and sums lose too much in bf16."""
    return [t.to(torch.promote_types(t.dtype, torch.float32)) for t in tensors]


def _math_forward(q, k, v, diagonal: bool, scale: float):
    q, k, v = _wide(q, k, v)
    scores = torch.einsum("bhqd,bhkd->bhqk", q, k) * scale
    if diagonal:
        scores = scores.masked_fill(torch.ones_like(scores, dtype=torch.bool).triu(1), float("-inf"))
    lse = scores.logsumexp(-1)
    return torch.einsum("bhqk,bhkd->bhqd", (scores - lse[..., None]).exp(), v), lse


def _math_backward(dout, q, k, v, out, lse, diagonal: bool, scale: float):
    """Gradients of one block, given the WHOLE attention's out and lse: P = exp(S - lse) is then
    this block's share of the global softmax, and delta = rowsum(dO * O) its correction."""
    dout, q, k, v, out, lse = _wide(dout, q, k, v, out, lse)
    scores = torch.einsum("bhqd,bhkd->bhqk", q, k) * scale
    if diagonal:
        scores = scores.masked_fill(torch.ones_like(scores, dtype=torch.bool).triu(1), float("-inf"))
    probs = (scores - lse[..., None]).exp()
    delta = (dout * out).sum(-1, keepdim=True)
    dscores = probs * (torch.einsum("bhqd,bhkd->bhqk", dout, v) - delta) * scale
    return (torch.einsum("bhqk,bhkd->bhqd", dscores, k), torch.einsum("bhqk,bhqd->bhkd", dscores, q),
            torch.einsum("bhqk,bhqd->bhkd", probs, dout))


def _fused_forward(q, k, v, diagonal: bool, scale: float):
    return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, diagonal, scale=scale)


def _fused_backward(dout, q, k, v, out, lse, diagonal: bool, scale: float):
    return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(dout, q, k, v, out, lse, 0.0, diagonal,
                                                                               scale=scale)


KERNELS = {"math": (_math_forward, _math_backward), "fused": (_fused_forward, _fused_backward)}


def kernel_for(device: torch.device) -> str:
    return "fused" if device.type == "cpu" else "math"


def _expand(kv, group: int):
    """Key/value heads repeated for the query heads they serve (grouped-query attention)."""
    return kv if group == 1 else kv.repeat_interleave(group, dim=1)


def _fold(grad, group: int):
    """The gradient of repeated key/value heads, summed back onto each kv head."""
    return grad if group == 1 else grad.unflatten(1, (-1, group)).sum(2)


class RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, ring: Ring, causal: bool, kernel: str):
        b, h, s, d = q.shape
        group, acc, scale = h // k.shape[1], torch.promote_types(q.dtype, torch.float32), 1 / math.sqrt(d)
        attend = KERNELS[kernel][0]
        out = torch.zeros(b, h, s, d, dtype=acc, device=q.device)
        lse = torch.full((b, h, s), float("-inf"), dtype=acc, device=q.device)
        k_held, v_held = k.contiguous(), v.contiguous()
        for step in range(ring.cp):
            if step < ring.cp - 1:                         # pass the block on while computing with it
                requests, (k_next, v_next) = ring.exchange([k_held, v_held], "forward")
            started = TALLY.start(q.device)
            for qs, ks, diagonal in _pairs(ring, (ring.rank - step) % ring.cp, causal):
                block_out, block_lse = attend(q[..., qs, :], _expand(k_held[:, :, ks], group),
                                              _expand(v_held[:, :, ks], group), diagonal, scale)
                new_lse = torch.logaddexp(lse[..., qs], block_lse.to(acc))   # the online softmax
                out[..., qs, :] = (out[..., qs, :] * (lse[..., qs] - new_lse).exp()[..., None]
                                   + block_out.to(acc) * (block_lse - new_lse).exp()[..., None])
                lse[..., qs] = new_lse
            TALLY.count("forward", started)
            if step < ring.cp - 1:
                _wait(requests, "forward")
                k_held, v_held = k_next, v_next
        out = out.to(q.dtype)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.ring, ctx.causal, ctx.kernel = ring, causal, kernel
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        ring, causal = ctx.ring, ctx.causal
        group, acc, scale = q.shape[1] // k.shape[1], lse.dtype, 1 / math.sqrt(q.shape[-1])
        gradients = KERNELS[ctx.kernel][1]
        dout = dout.contiguous()
        dq = torch.zeros_like(q, dtype=acc)
        k_held, v_held = k.contiguous(), v.contiguous()
        dk_held, dv_held = torch.zeros_like(k_held, dtype=acc), torch.zeros_like(v_held, dtype=acc)
        for step in range(ring.cp):
            if step < ring.cp - 1:                         # the next k, v travel while we compute
                requests, (k_next, v_next) = ring.exchange([k_held, v_held], "backward")
            started = TALLY.start(q.device)
            for qs, ks, diagonal in _pairs(ring, (ring.rank - step) % ring.cp, causal):
                dq_b, dk_b, dv_b = gradients(dout[..., qs, :], q[..., qs, :], _expand(k_held[:, :, ks], group),
                                             _expand(v_held[:, :, ks], group), out[..., qs, :], lse[..., qs],
                                             diagonal, scale)
                dq[..., qs, :] += dq_b
                dk_held[:, :, ks] += _fold(dk_b, group)
                dv_held[:, :, ks] += _fold(dv_b, group)
            TALLY.count("backward", started)
            if step < ring.cp - 1:
                _wait(requests, "backward")
                k_held, v_held = k_next, v_next
            if ring.cp > 1:   # dk, dv follow their block; after the last step they reach its owner
                requests, (dk_held, dv_held) = ring.exchange([dk_held, dv_held], "backward")
                _wait(requests, "backward")
        return dq.to(q.dtype), dk_held.to(k.dtype), dv_held.to(v.dtype), None, None, None


def ring_attention(q, k, v, group, positions, causal: bool = True, kernel: str | None = None):
    """Attention of this rank's queries over the whole sequence, k/v passed round the ring.

    q [b, heads, s/cp, d]; k, v [b, kv_heads, s/cp, d] (heads a multiple of kv_heads);
    positions: the global positions of the local tokens, from
    `plscale.predict.context_parallel.positions(seq, cp, rank, split)`. Returns [b, heads, s/cp, d].
    kernel: "fused" or "math" for each chunk pair (default: fused on CPU, math elsewhere).
    """
    if q.shape[1] % k.shape[1]:
        raise ValueError(f"{q.shape[1]} query heads do not group over {k.shape[1]} key/value heads")
    return RingAttention.apply(q, k, v, Ring(group, positions), causal, kernel or kernel_for(q.device))
