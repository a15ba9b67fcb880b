"""What every pipeline engine of the lab shares: where the stages cut the model and the
gradient sums a pipeline needs besides its schedule.

    parts = split(config, stages)            # [(start, stop)] piece ranges, stage 0 first
    tied = TiedGroups.build(mesh, config)    # first and last stage of each pipeline (tied models)
    ...  forward and backward by some schedule ...
    sync_grads(params, tied, mesh)           # sum the tied embedding/head, average over dp
    opt.step()
    loss = mean_loss(losses, mesh, device)   # the step's loss, the same on every rank

Pieces are those of `plscale.rank.models.llama_pieces` (embedding, layers, final norm, head).
"""

import torch
import torch.distributed as dist

from plscale.errors import UserError

from plscale.predict.presets import ModelConfig
from plscale.rank.mesh import Mesh
from plscale.rank.optim import optimizer  # noqa: F401  (the engines' optimizer, re-exported)
from plscale.rank.models.llama_pieces import tied_weight


def split(c: ModelConfig, stages: int) -> list[tuple[int, int]]:
    """Uniform over decoder layers: stage s gets layers [s L/S, (s+1) L/S); the embedding goes
    with the first stage, the final norm and the head with the last."""
    if stages > c.layers or c.layers % stages:
        raise ValueError(f"{c.layers} layers do not split evenly into {stages} stages")
    per = c.layers // stages
    cuts = [0] + [1 + s * per for s in range(1, stages)] + [c.layers + 3]
    return list(zip(cuts[:-1], cuts[1:]))


def one_shape(micro_batches, first: tuple | None, engine: str) -> tuple:
    """The (micro, seq) shape every micro-batch of a step has. A pipeline sends tensors of one
    shape, allocated before they arrive, and an engine keeps the first step's: a change hangs,
    fails far away or aborts the process, so it is refused here in one line."""
    shapes = {tuple(t.shape) for pair in micro_batches for t in pair}
    if len(shapes) != 1:
        raise UserError(f"Micro-batches of different shapes {sorted(shapes)}: give every micro-batch the same "
                        f"(micro, seq); drop a last, short one.")
    shape = shapes.pop()
    if first not in (None, shape):
        raise UserError(f"Micro-batches of {shape} after {first}: {engine} keeps the first step's activation "
                        f"shapes; keep ds.micro_batch and model.seq fixed for the run.")
    return shape


class TiedGroups:
    """The process group of each pipeline's first and last stage (Megatron's embedding group),
    where the tied embedding and head sum their gradients. Every rank builds every group; a
    model whose head has its own weight builds none (nothing to sum)."""

    def __init__(self, mine, ranks):
        self.group, self.ranks = mine, ranks

    @classmethod
    def build(cls, mesh: Mesh, config: ModelConfig) -> "TiedGroups":
        mine, my_ranks = None, []
        if not config.tie_embeddings:
            return cls(mine, my_ranks)
        for pipeline in mesh.layout.groups("pp"):
            ranks = sorted({pipeline[0], pipeline[-1]})
            group = dist.new_group(ranks) if len(ranks) > 1 else None
            if mesh.rank in ranks:
                mine, my_ranks = group, ranks
        return cls(mine, my_ranks)


@torch.no_grad()
def sync_grads(stages, tied: TiedGroups, mesh: Mesh) -> None:
    """After the last backward of a step: sum the tied weight's gradient over the first and last
    stage (each holds a copy), then average every gradient over the data-parallel replicas."""
    weights = {id(w): w for w in (tied_weight(s) for s in stages) if w is not None}
    if tied.group is not None:
        for w in weights.values():  # both sides call it, with zeros if a side made no gradient
            if w.grad is None:
                w.grad = torch.zeros_like(w)
            dist.all_reduce(w.grad, group=tied.group)
    if mesh.size("dp") > 1:
        for stage in stages:
            for p in stage.parameters():
                if p.grad is not None:
                    dist.all_reduce(p.grad, group=mesh.group("dp"))
                    p.grad /= mesh.size("dp")


def mean_loss(losses: list, mesh: Mesh, device) -> float:
    """The step's loss on every rank: the mean over micro-batches on each pipeline's last
    stage, sent to its other stages, averaged over the replicas."""
    pipeline = mesh.ranks("pp")
    loss = torch.stack([x.detach().float() for x in losses]).mean() if losses else torch.zeros((), device=device)
    dist.broadcast(loss, src=pipeline[-1], group=mesh.group("pp"))
    if mesh.size("dp") > 1:
        dist.all_reduce(loss, group=mesh.group("dp"))
        loss /= mesh.size("dp")
    return loss.item()
