"""Mixture-of-experts on paper: how many tokens an expert takes, how many are dropped.

Host-side and pure: `plscale estimate moe` prints it, the expert lab prints it beside what
its routers count, and the router written by hand (plscale/strategies/experts/router.py) sizes its
buffers with `capacity`, so the lab and the mechanism cannot disagree.

A router sends each of S tokens to its top-k of E experts. Every expert has room for C
tokens per micro-batch and rank (GShard's capacity; DeepSpeed's `_capacity`):

    C = max(ceil(S / E * (k * capacity_factor)), min_capacity)

(DeepSpeed's top-2 gate passes 2 x capacity_factor, the same formula with k = 2.) Tokens
routed to a full expert are dropped: that route adds nothing, and the residual carries the
token past the MLP unchanged.

The capacity factor is the trade GShard (Lepikhin et al., 2020) and Switch (Fedus et al.,
2021) tune: with perfectly even routing k*S routes fill E*C >= k*S*capacity_factor slots,
so a factor above 1 buys headroom for uneven routing with padding (empty slots still
computed, sent and held in memory), and a factor below 1 drops at least 1 - E*C/(k*S) of
the routes even when routing is even. Switch trains well with 1.0-1.25.

Expert parallelism (DeepSpeed MoE, ep ranks in an expert-parallel group) gives each rank
E/ep whole experts. Each rank builds the [E, C, h] buffer of its tokens for every expert,
and an all-to-all sends each expert's rows to the rank that owns it (dispatch); the experts'
outputs return by a second all-to-all (combine); backward runs both again on the gradients.
Per MoE layer and micro-batch, e bytes an element:

    4 all-to-alls of E * C * h * e bytes    (dispatch and combine, forward and backward)
    each rank sends (ep - 1)/ep of every message (it keeps the ep-th for its own experts)

none at ep 1 (DeepSpeed skips the all-to-all). The message does not shrink with ep: what
the capacity factor pads is padding on the wire too.

Parameters: the experts are split over ep; everything else (embedding, attention, norms,
the router's h x E gate, the head) is replicated. DeepSpeed sums each expert's gradient over
the ranks that hold the same experts (expert data parallelism, edp = dp / ep) and divides it
by dp, as it averages the rest over all dp ranks: the all-to-all's backward has already
brought every rank's tokens into each expert's gradient.

    >>> capacity(tokens=1024, experts=8, top_k=2, capacity_factor=1.25)
    320
    >>> m = alltoall_bytes(1024, 8, 2, 1.25, hidden=256, ep=4, element_bytes=2)
    >>> m.message == 8 * 320 * 256 * 2, m.sent == m.message * 3 // 4, m.calls
    (True, True, 4)
"""

import struct
from dataclasses import dataclass
from math import ceil

from plscale.predict.errors import PredictionError
from plscale.predict.presets import ModelConfig, flops_per_token, param_count


def check_experts(experts: int, ep: int) -> None:
    if experts < 1:
        raise PredictionError("experts", experts, ": use 1 or more experts.")
    ok = [str(d) for d in range(1, experts + 1) if experts % d == 0]
    if ep < 1:
        raise PredictionError("ep", ep, f": expert parallelism needs at least 1 rank; use {{ep}} {', '.join(ok)}.")
    if experts % ep:
        raise PredictionError("ep", ep, f"{experts} experts do not split over ep {ep} ranks: use ep {', '.join(ok)}, "
                                        f"or a number of experts divisible by {ep}.", lead=False)


def check_capacity(capacity_factor: float) -> None:
    if not isinstance(capacity_factor, (int, float)) or capacity_factor <= 0:
        raise PredictionError("capacity_factor", capacity_factor, ": use a number above 0 (1.0 gives each expert "
                                                                  "its even share of the tokens; 1.25 is common).")


def check_top_k(top_k: int, experts: int) -> None:
    if top_k not in (1, 2) or top_k > experts:
        raise PredictionError("top_k", top_k, f": use 1 or 2 (DeepSpeed's gates), and no more than the {experts} "
                                             f"experts.", show=repr(top_k))


def _f32(value: float) -> float:
    """value rounded to the nearest float32, as a torch.tensor(value) would hold it."""
    return struct.unpack("f", struct.pack("f", value))[0]


def capacity(tokens: int, experts: int, top_k: int, capacity_factor: float, min_capacity: int = 0) -> int:
    """Tokens each expert takes per micro-batch and rank, computed as DeepSpeed's `_capacity`
    does: S/E times the factor (k x factor for top-2) in float32, so that the ceiling lands
    where DeepSpeed's does (in float64, S=25, E=1, factor 0.6 gives 15; DeepSpeed takes 16).

    >>> capacity(512, 8, 2, 1.25), capacity(25, 1, 1, 0.6)
    (160, 16)
    """
    return max(ceil(_f32(_f32(tokens / experts) * _f32(top_k * capacity_factor))), min_capacity)


@dataclass(frozen=True)
class MoEAllToAll:
    """One rank's all-to-alls per MoE layer and micro-batch (DeepSpeed's MOELayer)."""
    ep: int
    capacity: int        # C, tokens per expert
    message: int         # E * C * h * e: the [E, C, h] buffer given to all_to_all_single

    @property
    def calls(self) -> int:
        """dispatch and combine, forward and backward (none at ep 1)."""
        return 4 if self.ep > 1 else 0

    @property
    def sent(self) -> int:
        """Bytes the rank sends in one all-to-all: (ep - 1)/ep of the message."""
        return self.message // self.ep * (self.ep - 1) if self.ep > 1 else 0

    @property
    def total_message(self) -> int:
        return self.calls * self.message

    @property
    def total_sent(self) -> int:
        return self.calls * self.sent

    def per_step(self, moe_layers: int, micro_batches: int = 1) -> tuple[int, int, int]:
        """(calls, message bytes, bytes sent) of one optimizer step: every MoE layer, every micro-batch."""
        n = moe_layers * micro_batches
        return n * self.calls, n * self.total_message, n * self.total_sent


def alltoall_bytes(tokens: int, experts: int, top_k: int, capacity_factor: float, hidden: int, ep: int,
                   element_bytes: int, min_capacity: int = 0) -> MoEAllToAll:
    """All-to-all bytes per MoE layer and micro-batch of `tokens` tokens on this rank.

    >>> a = alltoall_bytes(tokens=64, experts=4, top_k=1, capacity_factor=1.0, hidden=8, ep=2, element_bytes=4)
    >>> a.capacity, a.message, a.sent, a.total_sent
    (16, 2048, 1024, 4096)
    """
    check_experts(experts, ep)
    check_capacity(capacity_factor)
    check_top_k(top_k, experts)
    if tokens < 1:
        raise PredictionError("tokens", tokens, ": a micro-batch has at least one token.")
    c = capacity(tokens, experts, top_k, capacity_factor, min_capacity)
    return MoEAllToAll(ep, c, experts * c * hidden * element_bytes)


@dataclass(frozen=True)
class ExpertParams:
    """Parameters of a Llama-shaped model whose MLPs (every `every`-th layer) are E experts."""
    dense: int           # embedding(s), attention, norms, the dense MLPs left, the final norm
    gates: int           # the routers: h x E per MoE layer
    experts: int         # every expert of every MoE layer: 3hf each
    moe_layers: int

    @property
    def total(self) -> int:
        return self.dense + self.gates + self.experts

    def per_rank(self, ep: int) -> int:
        """What one rank of an expert-parallel group of ep holds: a ep-th of the experts, all the rest."""
        return self.dense + self.gates + self.experts // ep


def expert_params(config: ModelConfig, experts: int, every: int = 1) -> ExpertParams:
    """Each MoE layer's SwiGLU MLP (3hf) becomes `experts` copies and a router gate (h x E);
    `every` = 2 makes every other layer MoE (DeepSpeed-Megatron's expert interval).

    >>> from plscale.predict.presets import param_count, preset
    >>> p = expert_params(preset("small"), 8)     # L 4, h 256, f 704
    >>> p.experts == 4 * 8 * 3 * 256 * 704, p.gates == 4 * 256 * 8, p.per_rank(4) == p.dense + p.gates + p.experts // 4
    (True, True, True)
    >>> p.dense == param_count(preset("small")) - 4 * 3 * 256 * 704
    True
    """
    if experts < 1:
        raise PredictionError("experts", experts, ": use 1 or more experts.")
    if every < 1:
        raise PredictionError("every", every, ": an MoE layer every 1 (all layers) or more layers.")
    mlp = 3 * config.hidden * config.ffn
    moe_layers = config.layers // every
    return ExpertParams(param_count(config) - moe_layers * mlp, moe_layers * config.hidden * experts,
                        moe_layers * experts * mlp, moe_layers)


def active_params(config: ModelConfig, experts: int, top_k: int, every: int = 1) -> int:
    """Parameters one token runs through: all but the experts, and top_k experts a MoE layer.

    >>> from plscale.predict.presets import preset
    >>> p = expert_params(preset("small"), 8)     # L 4, h 256, f 704
    >>> active_params(preset("small"), 8, 2) == p.dense + p.gates + 4 * 2 * 3 * 256 * 704
    True
    """
    if not 1 <= top_k <= experts:
        raise PredictionError("top_k", top_k, f": a token goes to 1 to {experts} experts.")
    p = expert_params(config, experts, every)
    return p.dense + p.gates + p.experts // experts * top_k


def dropped_if_even(tokens: int, experts: int, top_k: int, capacity_factor: float, min_capacity: int = 0) -> int:
    """Routes dropped per micro-batch and rank if the router shared the k*S routes out evenly
    (each expert floor or ceil of kS/E): the least a capacity factor can drop. Below 1.0 even
    a perfect router drops; above it, every drop is the router's imbalance.

    >>> dropped_if_even(512, 4, 2, 0.5), dropped_if_even(512, 4, 2, 1.25)
    (512, 0)
    """
    slots = capacity(tokens, experts, top_k, capacity_factor, min_capacity)
    routes = top_k * tokens
    share, extra = divmod(routes, experts)
    return sum(max(0, share + (e < extra) - slots) for e in range(experts))


def even_routing(tokens: int, experts: int, top_k: int, capacity_factor: float,
                 min_capacity: int = 0) -> tuple[float, float]:
    """(padding, dropped) if the router shared the k*S routes out evenly: the share of the E x C
    slots left empty (computed and sent all the same), and the share of routes dropped.

    >>> even_routing(512, 4, 2, 1.25), even_routing(512, 4, 2, 0.5)
    ((0.2, 0.0), (0.0, 0.5))
    """
    slots, routes = experts * capacity(tokens, experts, top_k, capacity_factor, min_capacity), top_k * tokens
    dropped = dropped_if_even(tokens, experts, top_k, capacity_factor, min_capacity)
    return (slots - (routes - dropped)) / slots, dropped / routes


@dataclass(frozen=True)
class MoEFlops:
    """FLOPs per token of one training step (forward and backward, 3 x the forward's) of a Llama whose
    every MLP is an MoE layer: `model` counts each token's top_k experts (what MFU divides by, as
    for the dense model: the FLOPs the model needs); `hardware` counts what the experts compute, every
    one of E x C capacity slots a micro-batch, filled or empty (what HFU divides by). The router's
    h x E gate is in both; the one-hot dispatch and combine einsums are in neither (the
    implementation's, not the model's)."""
    model: float
    hardware: float


def step_flops(config: ModelConfig, experts: int, top_k: int, seq: int, slots: float) -> MoEFlops:
    """`slots`: E x C / S, the capacity slots of a micro-batch per token it routes (k x capacity_factor
    when the capacity comes out whole).

    >>> from plscale.predict.presets import flops_per_token, preset
    >>> c = preset("small")
    >>> f = step_flops(c, experts=4, top_k=1, seq=128, slots=1)   # one expert a token, no padding
    >>> f.model == f.hardware == flops_per_token(c, 128) + 6 * c.layers * c.hidden * 4   # the dense model + the gates
    True
    """
    d, mlp = config.hidden, 3 * config.hidden * config.ffn
    rest = flops_per_token(config, seq) - 6 * config.layers * mlp   # attention, head: the dense model's, less its MLPs
    gates = 6 * config.layers * d * experts
    return MoEFlops(model=rest + gates + 6 * config.layers * top_k * mlp,
                    hardware=rest + gates + 6 * config.layers * slots * mlp)
