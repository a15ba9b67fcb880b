"""The mixture-of-experts MLP two ways: written by hand, and DeepSpeed's `MoE` layer.

One dense SwiGLU MLP becomes E of them (the experts) and a router. Each token goes through its
top-k experts only, so the layer holds E times the MLP's weights but spends about k times
its FLOPs. With expert parallelism the E experts are split over the ep ranks of a group and
tokens travel to them by all-to-all (plscale/strategies/experts/dispatch.py):

    x [b, s, h] -> router -> dispatch -> all-to-all -> local experts -> all-to-all -> combine -> [b, s, h]

Both layers take and give the same things, so a model or a lab can swap one for the other:

    moe = MoEMLP(config, experts=4, top_k=2, capacity_factor=1.0, ep_group=mesh.group("ep"))
    moe = deepspeed_moe(config, experts=4, top_k=2, capacity_factor=1.0, ep_size=2)
    out, l_aux, stats = moe(x)          # stats: routes per expert, dropped, capacity
    moe.load_unsharded(full.state_dict())

`load_unsharded` takes the weights of an unsharded MoEMLP (ep_group None: one rank, every
expert): expert e lives on ep rank e // (E/ep), as local expert e % (E/ep).

Expert weights differ from rank to rank, so whoever trains them must not average them with
the other ranks' like the dense weights. DeepSpeed marks them on the tensor itself, and both
layers here carry its marks (`allreduce = False`, `group_name = "ep_size_<ep>"`): DeepSpeed's
engine then broadcasts them at start only within the expert-data-parallel group, and
`split_params_into_different_moe_groups_for_optimizer` puts them in their own optimizer groups.
"""

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from plscale.predict.experts import check_capacity, check_experts, check_top_k
from plscale.predict.presets import ModelConfig
from plscale.strategies.experts.dispatch import (
    combine,
    dispatch,
    from_experts,
    group_size,
    to_experts,
)
from plscale.strategies.experts.router import Router
from plscale.rank.models.llama import MLP


@dataclass
class Stats:
    """This rank's routing in one forward of one layer."""
    counts: list[int]  # routes sent to each expert, before capacity drops
    dropped: int       # routes that found their expert full
    capacity: int      # C, slots per expert


def mark_experts(experts: nn.Module, ep: int) -> None:
    """DeepSpeed's marks on expert parameters (as deepspeed.moe.experts.Experts sets them)."""
    for p in experts.parameters():
        p.allreduce = False
        p.group_name = f"ep_size_{ep}"


def _expert_weights(state: dict, expert: int) -> dict:
    """One expert's SwiGLU weights out of an unsharded MoEMLP's state dict."""
    head = f"experts.{expert}."
    return {name[len(head):]: value for name, value in state.items() if name.startswith(head)}


class MoEMLP(nn.Module):
    """Router + the local experts (SwiGLU, as the dense MLP) + the all-to-all dispatch."""

    def __init__(self, config: ModelConfig, experts: int, top_k: int, capacity_factor: float,
                 ep_group=None, min_capacity: int = 4):
        super().__init__()
        ep = group_size(ep_group)
        check_experts(experts, ep)
        self.group, self.ep, self.num_experts = ep_group, ep, experts
        self.first = (0 if ep_group is None else dist.get_rank(ep_group)) * (experts // ep)  # my first expert
        self.gate = Router(config.hidden, experts, top_k, capacity_factor, min_capacity)
        self.experts = nn.ModuleList(MLP(config) for _ in range(experts // ep))
        mark_experts(self.experts, ep)

    def forward(self, x: torch.Tensor):
        tokens = x.reshape(-1, x.shape[-1])                              # [S, h]
        routing = self.gate(tokens)
        inbox = to_experts(dispatch(tokens, routing), self.group)         # [E/ep, ep*C, h]
        outbox = torch.stack([expert(rows) for expert, rows in zip(self.experts, inbox)])
        out = combine(from_experts(outbox, self.group), routing)
        return out.view(x.shape), routing.l_aux, Stats(routing.counts.tolist(), routing.dropped, routing.capacity)

    def set_capacity_factor(self, factor: float) -> None:
        self.gate.capacity_factor = factor

    @torch.no_grad()
    def load_unsharded(self, state: dict) -> None:
        self.gate.wg.weight.copy_(state["gate.wg.weight"])
        for i, expert in enumerate(self.experts):
            expert.load_state_dict(_expert_weights(state, self.first + i))


class DeepSpeedMoEMLP(nn.Module):
    """deepspeed.moe.layer.MoE behind MoEMLP's interface. DeepSpeed builds its own expert
    groups, blocks of ep_size consecutive ranks (as plscale's Mesh does with tp 1), when
    deepspeed.initialize calls `set_deepspeed_parallelism` on the inner `moe`; without an
    engine, call `layer.moe.set_deepspeed_parallelism()` on every rank before the forward."""

    def __init__(self, config: ModelConfig, experts: int, top_k: int, capacity_factor: float, ep_size: int,
                 min_capacity: int = 4):
        super().__init__()
        from deepspeed.moe.layer import MoE

        check_experts(experts, ep_size)
        check_top_k(top_k, experts)
        check_capacity(capacity_factor)
        self.ep, self.num_experts, self.top_k = ep_size, experts, top_k
        self.capacity_factor, self.min_capacity = capacity_factor, min_capacity
        self.moe = MoE(config.hidden, expert=MLP(config), num_experts=experts, ep_size=ep_size, k=top_k,
                       capacity_factor=capacity_factor, eval_capacity_factor=capacity_factor,
                       min_capacity=min_capacity, use_residual=False, noisy_gate_policy=None, drop_tokens=True,
                       use_rts=False, top2_2nd_expert_sampling=False)
        self._gate = None
        self.moe.deepspeed_moe.gate.register_forward_hook(self._read_gate)

    def forward(self, x: torch.Tensor):
        out, l_aux, counts = self.moe(x)
        slots, kept = self._gate  # as DeepSpeed's gate decided them, read by the hook below
        return out, l_aux, Stats(counts.tolist(), int(counts.sum()) - kept, slots)

    def _read_gate(self, gate, inputs, output) -> None:
        """DeepSpeed's gate returns (l_aux, C, E, indices [k, S], ...), a dropped route's expert
        index set to -1: its capacity and the routes it kept, measured rather than predicted."""
        self._gate = (int(output[1]), int((output[3] >= 0).sum()))

    def set_capacity_factor(self, factor: float) -> None:
        gate = self.moe.deepspeed_moe.gate
        self.capacity_factor = gate.capacity_factor = gate.eval_capacity_factor = factor

    @torch.no_grad()
    def load_unsharded(self, state: dict) -> None:
        layer = self.moe.deepspeed_moe
        layer.gate.wg.weight.copy_(state["gate.wg.weight"])
        first = (dist.get_rank() % self.ep if self.ep > 1 else 0) * (self.num_experts // self.ep)
        for i, expert in enumerate(layer.experts.deepspeed_experts):
            expert.load_state_dict(_expert_weights(state, first + i))


def deepspeed_moe(config: ModelConfig, experts: int, top_k: int, capacity_factor: float, ep_size: int,
                  min_capacity: int = 4) -> DeepSpeedMoEMLP:
    """DeepSpeed's MoE with routing as the hand-written router's: no noise, no random token
    selection (use_rts), no sampled second expert, the same capacity at evaluation."""
    return DeepSpeedMoEMLP(config, experts, top_k, capacity_factor, ep_size, min_capacity)
