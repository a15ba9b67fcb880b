"""plscale's Llama with a mixture of experts in every layer, and how DeepSpeed trains it.

The dense Llama (plscale/rank/models/llama.py) with each layer's MLP replaced by an MoE
layer (plscale/strategies/experts/layer.py), written by hand (impl "hand") or DeepSpeed's
(impl "deepspeed"). The router's load-balancing loss joins the language-model loss:

    loss = cross-entropy + aux_weight * sum over layers of l_aux

    model = MoELlama(config, experts=4, top_k=2, capacity_factor=1.0, ep_group=mesh.group("ep"))
    model.load_unsharded(reference.state_dict())   # reference: ep_group None, every expert
    engine = initialize(model, ds_config, mesh)
    loss = engine(tokens, targets); backward(engine, loss, mesh); engine.step()
    model.routing                                  # per layer: Stats of the last forward

Gradients. Each rank runs its own micro-batch; the all-to-all's backward already brings every
token that visited an expert, from every rank of the ep group, into that expert's gradient.
The reference (one rank, every micro-batch, losses averaged) divides by the number of
data-parallel ranks, dp. So, as DeepSpeed's engine does (measured in tests/test_experts.py):

    dense weights (the same on all dp ranks)     all-reduce over dp,  divide by dp
    expert weights (the same on the edp ranks)   all-reduce over edp, divide by dp  (not by edp)

At ep = dp there is nothing to all-reduce for an expert: its gradient is divided by dp only.
The engine knows DeepSpeed's MoE layers and does this itself; it does not know MoEMLP, so
`backward` holds the engine's reduction back (engine.no_sync) and `reduce_gradients` does it.
"""

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from plscale.predict.presets import ModelConfig
from plscale.strategies.experts.dispatch import group_size
from plscale.strategies.experts.layer import MoEMLP, deepspeed_moe
from plscale.rank.models.llama import Attention, Llama, RMSNorm, rope_tables


class MoEDecoderLayer(nn.Module):
    """The dense DecoderLayer with an MoE MLP: also returns l_aux and routing stats."""

    def __init__(self, c: ModelConfig, mlp: nn.Module):
        super().__init__()
        self.input_layernorm = RMSNorm(c.hidden, c.norm_eps)
        self.self_attn = Attention(c)
        self.post_attention_layernorm = RMSNorm(c.hidden, c.norm_eps)
        self.mlp = mlp
        self.dropout = c.dropout

    def forward(self, x, cos, sin):
        x = x + F.dropout(self.self_attn(self.input_layernorm(x), cos, sin), self.dropout, self.training)
        out, l_aux, stats = self.mlp(self.post_attention_layernorm(x))
        return x + F.dropout(out, self.dropout, self.training), l_aux, stats


class MoELlama(nn.Module):
    """Llama with MoE MLPs; ep_group None (or of one rank) holds every expert: the reference."""

    def __init__(self, config: ModelConfig, experts: int, top_k: int, capacity_factor: float, ep_group=None,
                 impl: str = "hand", aux_weight: float = 0.01, min_capacity: int = 4):
        super().__init__()
        if impl not in ("hand", "deepspeed"):
            raise ValueError(f"impl {impl!r}: use 'hand' or 'deepspeed'")
        self.config, self.impl, self.aux_weight = config, impl, aux_weight
        self.ep = group_size(ep_group)

        def mlp():
            if impl == "hand":
                return MoEMLP(config, experts, top_k, capacity_factor, ep_group, min_capacity)
            return deepspeed_moe(config, experts, top_k, capacity_factor, self.ep, min_capacity)

        self.embed_tokens = nn.Embedding(config.vocab, config.hidden)
        self.layers = nn.ModuleList(MoEDecoderLayer(config, mlp()) for _ in range(config.layers))
        self.norm = RMSNorm(config.hidden, config.norm_eps)
        self.lm_head = nn.Linear(config.hidden, config.vocab, bias=False)
        if config.tie_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        self.routing = []  # Stats per layer, of the last forward
        self.reset_parameters()

    reset_parameters = Llama.reset_parameters  # the dense model's initialisation; experts as MLPs

    def forward(self, tokens, targets=None):
        cos, sin = rope_tables(self.config.head_dim, tokens.shape[1], self.config.rope_theta, tokens.device)
        x, aux, self.routing = self.embed_tokens(tokens), 0.0, []
        for layer in self.layers:
            x, l_aux, stats = layer(x, cos, sin)
            aux = aux + l_aux
            self.routing.append(stats)
        logits = self.lm_head(self.norm(x))
        if targets is None:
            return logits
        logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
        return F.cross_entropy(logits.flatten(0, 1), targets.flatten()) + self.aux_weight * aux

    @torch.no_grad()
    def load_unsharded(self, state: dict) -> None:
        """Weights of an unsharded MoELlama (impl "hand", ep_group None); this rank's experts only."""
        for name, p in self.named_parameters():
            if ".mlp." not in name:
                p.copy_(state[name])
        for i, layer in enumerate(self.layers):
            head = f"layers.{i}.mlp."
            layer.mlp.load_unsharded({k[len(head):]: v for k, v in state.items() if k.startswith(head)})


def is_expert(p: torch.Tensor) -> bool:
    """DeepSpeed's test (deepspeed.moe.utils.is_moe_param): an expert weight is not all-reduced."""
    return not getattr(p, "allreduce", True)


def reduce_gradients(model: nn.Module, mesh) -> None:
    """What DeepSpeed's engine does to an MoE model's gradients (its _reduce_non_expert_gradients
    and _reduce_expert_gradients, ZeRO 0), by hand: sum over the ranks that hold the weight,
    divide by dp. `mesh` needs the "dp" and "edp" groups."""
    dp = mesh.size("dp")
    for p in model.parameters():
        if p.grad is not None:
            p.grad.div_(dp)
            dist.all_reduce(p.grad, group=mesh.group("edp" if is_expert(p) else "dp"))


def _expert_groups(ep: int, mesh) -> None:
    """DeepSpeed's registry of expert groups must know "ep_size_<ep>" before deepspeed.initialize
    broadcasts the weights (expert weights only within their edp group): build it as DeepSpeed's
    MoE layer does, and check that its groups are the mesh's."""
    from deepspeed.utils import groups

    name = f"ep_size_{ep}"
    if name not in groups._get_expert_parallel_group_dict():
        groups._create_expert_and_data_parallel(ep)
    for dim, group in (("ep", groups._get_expert_parallel_group(name)),
                       ("edp", groups._get_expert_data_parallel_group(name))):
        if dist.get_process_group_ranks(group) != mesh.ranks(dim):
            raise ValueError(f"rank {mesh.rank}: DeepSpeed's {dim} group is {dist.get_process_group_ranks(group)}, "
                             f"the mesh's {mesh.ranks(dim)}")


def initialize(model: MoELlama, ds_config: dict, mesh):
    """A DeepSpeed engine for `model`, its expert weights in optimizer groups of their own.
    The hand-written layers train at ZeRO 0 only: ZeRO 1 and 2 reduce gradients inside their
    optimizer, which knows DeepSpeed's MoE layers only (with engine.no_sync it finds none)."""
    import deepspeed
    from deepspeed.moe.utils import split_params_into_different_moe_groups_for_optimizer

    if model.impl == "hand":
        stage = ds_config.get("zero_optimization", {}).get("stage", 0)
        if stage:
            raise ValueError(f"hand-written MoE layers train at ZeRO 0, not {stage}: use impl 'deepspeed'")
        _expert_groups(model.ep, mesh)
    params = split_params_into_different_moe_groups_for_optimizer({"params": list(model.parameters()),
                                                                    "name": "parameters"})
    engine, *_ = deepspeed.initialize(model=model, model_parameters=params, config=ds_config)
    if model.impl == "deepspeed":  # its layers placed experts by rank % ep: are its groups the mesh's?
        _expert_groups(model.ep, mesh)
    return engine


def backward(engine, loss, mesh) -> None:
    """engine.backward(loss); for hand-written MoE layers the engine's gradient all-reduce is
    held back and `reduce_gradients` does it, at the accumulation boundary."""
    if engine.module.impl == "deepspeed":
        engine.backward(loss)
        return
    with engine.no_sync():
        engine.backward(loss)
    if engine.is_gradient_accumulation_boundary():
        reduce_gradients(engine.module, mesh)
