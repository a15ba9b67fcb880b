"""PyTorch's own tensor parallelism: DTensor and `parallelize_module`, on the lab's dense Llama.

Where the hand-written layers (layers.py) call f and g themselves, here each Linear is
told its *style* and DTensor inserts the collectives: a weight becomes a DTensor sharded
over the tensor-parallel mesh, and every activation carries its placement
(Replicate, Shard(dim) or Partial) so the right collective runs when the placement changes.

    per decoder layer          style                      what runs (forward | backward)
    self_attn, mlp inputs      PrepareModuleInput         Replicate DTensor | one all-reduce (f)
    q, k, v, gate, up          ColwiseParallel            weight Shard(0): my heads, my ffn slice
    o, down                    RowwiseParallel            weight Shard(1); all-reduce (g) | -
    with sequence_parallel:
    input/post_attention norm  SequenceParallel           on [b, s/t, h]; weight Replicate
    self_attn, mlp inputs      Shard(1) -> Replicate      all-gather | reduce-scatter
    o, down                    output_layouts=Shard(1)    reduce-scatter | all-gather
    layers.0 input             Replicate -> Shard(1)      keep my slice of the sequence
    final norm input           Shard(1) -> Replicate      all-gather: norm and head see every token

Per layer that is Megatron's count: 2 all-reduces forward and 2 backward (or 2 all-gathers and
2 reduce-scatters each way). Activations are [batch, seq, hidden], so the sequence is dim 1.
The embedding and the output head stay replicated: with tied weights, a vocabulary-sharded
(Rowwise) embedding and a Colwise head would be two DTensors, and the tie would break; that
plan is outside this file (the hand-written VocabParallelEmbedding shows it). Every rank holds
the same replicated parameters and computes the same, whole gradient for them. Under
sequence parallelism the norm weights see only their rank's tokens: DTensor marks their
gradients Partial (a sum still to do), and a hook sums each once in backward; left Partial,
AdamW would all-reduce them inside each of its ops, three times per weight per step.

    model = Llama(config)                                  # the same dense weights on every rank
    model = parallelize(model, mesh.group("tp"), sequence_parallel=True)
    opt = stages.optimizer(model.parameters(), ds_config)  # torch AdamW on (D)Tensors
    loss = model(tokens, targets); loss.backward()
    clip_grad_norm_(model, ds_config["gradient_clipping"]); opt.step()
    full = model.layers[0].mlp.up_proj.weight.full_tensor()  # a sharded weight, gathered
"""

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput, RowwiseParallel,
                                               SequenceParallel, parallelize_module)

from plscale.rank.models.llama import Llama

SEQ = 1  # activations are [batch, seq, hidden]


def device_mesh(group, device_type: str) -> DeviceMesh:
    """A 1-D DeviceMesh over an existing process group (the frame's tensor-parallel group)."""
    return DeviceMesh.from_group(group, device_type, mesh_dim_names=("tp",))


def layer_plan(sequence_parallel: bool) -> dict:
    """The styles of one decoder layer, by module name. The attention's and the MLP's input is
    made a DTensor once, at the block (PrepareModuleInput), so q, k and v (gate and up) share it:
    their input gradients add up as one Partial DTensor and meet one collective in backward,
    Megatron's single f per block, instead of one per projection."""
    seq = Shard(SEQ) if sequence_parallel else Replicate()   # the residual stream's layout
    plan = {"self_attn": PrepareModuleInput(input_layouts=(seq, None, None),
                                            desired_input_layouts=(Replicate(), None, None)),
            "self_attn.q_proj": ColwiseParallel(), "self_attn.k_proj": ColwiseParallel(),
            "self_attn.v_proj": ColwiseParallel(), "self_attn.o_proj": RowwiseParallel(output_layouts=seq),
            "mlp": PrepareModuleInput(input_layouts=(seq,), desired_input_layouts=(Replicate(),)),
            "mlp.gate_proj": ColwiseParallel(), "mlp.up_proj": ColwiseParallel(),
            "mlp.down_proj": RowwiseParallel(output_layouts=seq)}
    if sequence_parallel:
        plan["input_layernorm"] = SequenceParallel(sequence_dim=SEQ)
        plan["post_attention_layernorm"] = SequenceParallel(sequence_dim=SEQ)
    return plan


def parallelize(model: Llama, tp_group, sequence_parallel: bool = False) -> Llama:
    """Shard `model` in place over `tp_group` (every rank passes the same dense weights) and
    return it. Its forward is unchanged: tokens in, the mean loss out, the same on every rank."""
    c = model.config
    t = tp_group.size()
    for n, what in ((c.heads, "heads"), (c.kv_heads, "key/value heads"), (c.ffn, "ffn width")):
        if n % t:
            raise ValueError(f"{what} {n} do not split over {t} tensor-parallel ranks")
    if sequence_parallel and c.dropout:
        raise ValueError("sequence parallelism with dropout needs one random stream per slice: use dropout 0")
    mesh = device_mesh(tp_group, next(model.parameters()).device.type)
    for layer in model.layers:
        parallelize_module(layer, mesh, layer_plan(sequence_parallel))
    if sequence_parallel:
        # Into the first layer: the whole embedding output (Replicate), keep my slice of it.
        parallelize_module(model.layers[0], mesh, PrepareModuleInput(
            input_layouts=(Replicate(), None, None), desired_input_layouts=(Shard(SEQ), None, None),
            use_local_output=True))
        # Out of the last: gather the slices, so the norm and the head see the whole sequence.
        parallelize_module(model.norm, mesh, PrepareModuleInput(
            input_layouts=(Shard(SEQ),), desired_input_layouts=(Replicate(),), use_local_output=True))
        for p in model.parameters():
            if isinstance(p, DTensor) and p.placements == (Replicate(),):
                p.register_post_accumulate_grad_hook(_sum_partial_grad)
    return model


def _sum_partial_grad(p) -> None:
    """A replicated weight's gradient from sequence slices is Partial (each rank: its tokens'
    share): sum it once, when backward has made it."""
    if any(placement.is_partial() for placement in p.grad.placements):
        p.grad = p.grad.redistribute(placements=[Replicate()])


@torch.no_grad()
def clip_grad_norm_(model: nn.Module, max_norm: float) -> float:
    """torch.nn.utils.clip_grad_norm_ for a model of DTensors and plain tensors (torch's refuses
    the mix): the norm of the whole gradient, each sharded one gathered; returns it."""
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    norms = [torch.linalg.vector_norm(g) for g in grads]
    total = torch.stack([n.full_tensor() if isinstance(n, DTensor) else n for n in norms]).norm().item()
    if max_norm > 0:
        coef = min(max_norm / (total + 1e-6), 1.0)
        for g in grads:
            g.mul_(coef)
    return total


def full_grads(model: nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter's gradient as the dense model would have it (DTensors gathered)."""
    return {name: p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad
            for name, p in model.named_parameters() if p.grad is not None}


def full_weights(model: nn.Module) -> dict[str, torch.Tensor]:
    return {name: p.full_tensor() if isinstance(p, DTensor) else p for name, p in model.named_parameters()}
