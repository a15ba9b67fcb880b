"""FSDP2 x tensor parallel x pipeline on DTensor, composed in torchtitan's order.

Lab 11's train.py composes the four splits by hand (its own layers, 1F1B and ZeRO-1). PyTorch
has a library piece for each, and torchtitan stacks them on one DeviceMesh, pp x dp x tp,
tp fastest (neighbouring ranks) and pp slowest, in this order:

    1. pipeline   cut the model into stages; rank (p, d, t) keeps stage p's pieces
    2. tensor     parallelize_module over mesh["tp"]: each Linear's weight a DTensor Shard(0)
                  (q, k, v, gate, up) or Shard(1) (o, down); 2 all-reduces a layer each way
    3. FSDP2      fully_shard over mesh["dp"], each layer one group, then the stage: every
                  (already tp-sharded) weight split again on dim 0, gathered before its use
    4. schedule   torch.distributed.pipelining's PipelineStage over mesh["pp"] and its 1F1B

A weight ends as a DTensor on the 2D (dp, tp) mesh: q_proj's placements (_StridedShard(0),
Shard(0)), rank (d, t) holding rows [d k, (d + 1) k) of the t-th tp slice. With a pipeline
torch's stage runs the m micro-batches' backward without FSDP's gradient sync and without
resharding after backward: the stage's gathered parameters and its unsharded gradients stay
for the step, and each group reduce-scatters once, after the last micro-batch (the stage's
perform_reduce_grad). The tied embedding and head live on the first and last stage; their
gradients, sharded alike, are summed between the two (Megatron's embedding group).

    mesh = device_mesh("cpu", pp=2, dp=2, tp=2)
    train = Composed(dense, mesh, ds_config, device)   # this rank's stage, sharded; its optimizer
    loss = train.backward(micro_batches)               # m (tokens, targets) of this replica
    train.update()                                     # AdamW on the shards
"""

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.pipelining import PipelineStage, Schedule1F1B
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.parallel import parallelize_module

from plscale.rank.models import llama_pieces
from plscale.rank.models.llama import Llama
from plscale.rank.optim import optimizer
from plscale.strategies.pipeline.stages import split
from plscale.strategies.tensor_parallel.dtensor_path import layer_plan

DIMS = ("pp", "dp", "tp")   # slowest to fastest: rank = t + tp (d + dp p), Megatron's order


def device_mesh(device_type: str, pp: int, dp: int, tp: int) -> DeviceMesh:
    return init_device_mesh(device_type, (pp, dp, tp), mesh_dim_names=DIMS)


def shard_stage(stage: torch.nn.Module, mesh: DeviceMesh) -> torch.nn.Module:
    """Tensor parallel inside every layer, then FSDP2: each layer a group, then the stage."""
    layers = [piece for piece in stage if isinstance(piece, llama_pieces.Layer)]
    if mesh["tp"].size() > 1:
        for layer in layers:
            parallelize_module(layer, mesh["tp"], layer_plan(sequence_parallel=False))
    for layer in layers:
        fully_shard(layer, mesh=mesh["dp"])
    fully_shard(stage, mesh=mesh["dp"])
    return stage


def tied_group(mesh: DeviceMesh):
    """The group of this rank's first and last stage at its (dp, tp) place; None on one stage
    and in between. Every rank builds every group (new_group is collective)."""
    grid, mine = mesh.mesh.tolist(), None
    for d in range(mesh["dp"].size()):
        for t in range(mesh["tp"].size()):
            ends = sorted({grid[0][d][t], grid[-1][d][t]})
            group = dist.new_group(ends) if len(ends) > 1 else None
            if dist.get_rank() in ends:
                mine = group
    return mine


class Composed:
    def __init__(self, dense: Llama, mesh: DeviceMesh, ds_config: dict, device: torch.device):
        pp, me = mesh["pp"].size(), mesh.get_local_rank("pp")
        self.mesh, self.first, self.last = mesh, me == 0, me == pp - 1
        start, stop = split(dense.config, pp)[me]
        self.stage = shard_stage(llama_pieces.build_pieces(dense, start, stop).to(device), mesh)
        self.pipe = PipelineStage(self.stage, me, pp, device, group=mesh["pp"].get_group())
        self.tied = tied_group(mesh) if dense.config.tie_embeddings else None
        self.optimizer = optimizer(self.stage.parameters(), ds_config)   # torch's AdamW on the shards
        self.schedule, self.device = None, device

    def backward(self, micro_batches) -> torch.Tensor:
        """The step's forwards and backwards over this replica's micro-batches, gradients reduced
        and summed where tied; the mean loss on the last stage, else 0."""
        if self.schedule is None:   # torch's 1F1B; it takes the whole batch and cuts it into m itself
            self.schedule = Schedule1F1B(self.pipe, n_microbatches=len(micro_batches), loss_fn=llama_pieces.loss_fn)
        tokens = torch.cat([x for x, _ in micro_batches]).to(self.device)
        targets = torch.cat([y for _, y in micro_batches]).to(self.device)
        losses = []
        inputs = (tokens,) if self.first else ()
        outputs = {"target": targets, "losses": losses} if self.last else {}
        self.schedule.step(*inputs, **outputs)
        if self.tied is not None:   # the tied embedding's and head's gradients: each rank's dp shard, summed
            dist.all_reduce(local(llama_pieces.tied_weight(self.stage).grad), group=self.tied)
        return torch.stack(losses).mean().detach() if losses else torch.zeros((), device=self.device)

    def update(self) -> None:
        self.optimizer.step()
        self.optimizer.zero_grad()


def local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if isinstance(t, DTensor) else t
