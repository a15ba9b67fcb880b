"""Reference solution of the zero1 exercise (the task: skeleton.py). Not copied by
`plscale exercise start`; DeepSpeed's stage_1_and_2.py and torch's ZeroRedundancyOptimizer
are production versions."""

import math

import torch
import torch.distributed as dist


def flatten(tensors) -> torch.Tensor:
    """One 1-D fp32 copy of all the tensors, one after another."""
    return torch.cat([t.detach().reshape(-1).float() for t in tensors])


@torch.no_grad()
def unflatten_into(flat: torch.Tensor, params) -> None:
    """Copy the first elements of `flat` back into the parameters, in order."""
    offset = 0
    for p in params:
        p.copy_(flat[offset:offset + p.numel()].view_as(p))
        offset += p.numel()


class Zero1:
    def __init__(self, params, optimizer_class=torch.optim.Adam, **kwargs):
        self.params = [p for p in params if p.requires_grad]
        self.world, rank = dist.get_world_size(), dist.get_rank()
        self.numel = sum(p.numel() for p in self.params)
        self.k = math.ceil(self.numel / self.world)
        self.start, self.end = rank * self.k, (rank + 1) * self.k
        self.shard = self._mine(self.params).clone().requires_grad_()
        self.optimizer = optimizer_class([self.shard], **kwargs)

    def _mine(self, tensors) -> torch.Tensor:
        """This rank's slice of the padded flat vector of `tensors`, on the parameters' device."""
        flat = flatten(tensors).to(self.params[0].device)
        padded = torch.cat([flat, flat.new_zeros(self.k * self.world - self.numel)])
        return padded[self.start:self.end]

    @torch.no_grad()
    def step(self) -> None:
        self.shard.grad = self._mine([p.grad for p in self.params])
        self.optimizer.step()
        slices = [torch.empty_like(self.shard) for _ in range(self.world)]
        dist.all_gather(slices, self.shard)
        unflatten_into(torch.cat(slices), self.params)

    def zero_grad(self) -> None:
        self.optimizer.zero_grad()
        for p in self.params:
            p.grad = None
