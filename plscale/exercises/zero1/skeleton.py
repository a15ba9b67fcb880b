"""Exercise zero1: ZeRO stage 1, Adam's states sharded over the data-parallel ranks.

Lab 04 (labs/04_zero) measures what each ZeRO stage saves. Check with

    plscale exercise check zero1

N data-parallel ranks hold the same model. Plain Adam keeps two fp32 moments per parameter
(exp_avg and exp_avg_sq) on every rank, N copies of the same numbers. ZeRO-1 (Rajbhandari et
al., 2020) gives each rank one N-th of them:

1. Flatten all parameters into one vector of P elements (`flatten`, given) and pad it with
   zeros to N·k elements, k = ceil(P / N). Rank r owns elements r·k .. (r+1)·k - 1 of it.
2. Each rank keeps exp_avg and exp_avg_sq for its own k elements only.
3. step(): the gradients are already averaged over the ranks (as after data parallelism's
   all-reduce: p.grad is the same on every rank). Each rank runs Adam on its own k elements,
   then one all-gather of the updated slices gives every rank the whole updated vector;
   write it back into the parameters (`unflatten_into`, given).

Adam as torch.optim.Adam does it (Kingma and Ba, 2015; weight decay 0), at step t = 1, 2, ...:
    exp_avg    = β1·exp_avg + (1 - β1)·g
    exp_avg_sq = β2·exp_avg_sq + (1 - β2)·g²
    param     -= lr · (exp_avg / (1 - β1^t)) / (sqrt(exp_avg_sq / (1 - β2^t)) + eps)

What the checks test, on 2 and 4 ranks, with P not a multiple of N: self.start and
self.end (the slice of the padded vector this rank owns); self.exp_avg and self.exp_avg_sq
(1-D fp32 tensors of k elements each, equal to torch's Adam state for those elements);
parameters equal to torch.optim.Adam's on the whole model after 1 and 5 steps, the same on
every rank; one all-gather per step (dist.all_gather or dist.all_gather_into_tensor) and no
other collective. Use torch.distributed's default group.
"""

import torch
import torch.distributed as dist  # noqa: F401  (you will need it)


def flatten(tensors) -> torch.Tensor:
    """One 1-D fp32 copy of all the tensors, one after another (given)."""
    return torch.cat([t.detach().reshape(-1).float() for t in tensors])


@torch.no_grad()
def unflatten_into(flat: torch.Tensor, params) -> None:
    """Copy the first elements of `flat` back into the parameters, in order (given)."""
    offset = 0
    for p in params:
        p.copy_(flat[offset:offset + p.numel()].view_as(p))
        offset += p.numel()


class Zero1Adam:
    def __init__(self, params, lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-8):
        self.params = list(params)
        self.lr, self.betas, self.eps = lr, betas, eps
        self.t = 0
        # TODO: self.start, self.end: this rank's slice of the padded flat vector;
        #       self.exp_avg, self.exp_avg_sq: zeros for this rank's k elements
        raise NotImplementedError("Zero1Adam.__init__")

    @torch.no_grad()
    def step(self) -> None:
        # TODO: Adam on this rank's slice, then one all-gather, then write back
        raise NotImplementedError("Zero1Adam.step")
