"""Reference solution of the zero1 exercise (the task: skeleton.py). Not copied by
`plscale exercise start`; DeepSpeed's stage_1_and_2.py is the production version."""

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


class Zero1Adam:
    def __init__(self, params, lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-8):
        self.params = list(params)
        self.lr, self.betas, self.eps = lr, betas, eps
        self.t = 0
        self.world, rank = dist.get_world_size(), dist.get_rank()
        self.numel = sum(p.numel() for p in self.params)
        self.k = math.ceil(self.numel / self.world)
        self.start, self.end = rank * self.k, (rank + 1) * self.k
        self.exp_avg = torch.zeros(self.k)
        self.exp_avg_sq = torch.zeros(self.k)

    def _mine(self, tensors) -> torch.Tensor:
        """This rank's slice of the padded flat vector of `tensors`."""
        flat = flatten(tensors)
        padded = torch.cat([flat, flat.new_zeros(self.k * self.world - self.numel)])
        return padded[self.start:self.end]

    @torch.no_grad()
    def step(self) -> None:
        self.t += 1
        (beta1, beta2), t = self.betas, self.t
        param, grad = self._mine(self.params), self._mine([p.grad for p in self.params])
        self.exp_avg.mul_(beta1).add_(grad, alpha=1 - beta1)
        self.exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
        denominator = (self.exp_avg_sq / (1 - beta2 ** t)).sqrt().add_(self.eps)
        param = param - self.lr * (self.exp_avg / (1 - beta1 ** t)) / denominator
        slices = [torch.empty(self.k) for _ in range(self.world)]
        dist.all_gather(slices, param)
        unflatten_into(torch.cat(slices), self.params)
