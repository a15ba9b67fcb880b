"""ZeRO-1 over the dp x cp gradient group, by hand: each of its N = dp x cp ranks keeps Adam's
moments and an fp32 master copy of 1/N of the stage's parameters, and steps only those.

The ranks of one dp-cp group hold the same shard of the same stage (they differ in batch and
in tokens), so they can split its optimizer work. The stage's parameters, one after another,
are one flat vector of Ψ elements, padded with zeros to N k (k = ceil(Ψ / N)); rank i owns
elements [i k, (i + 1) k):

    flat gradients    | g0 | g1 | g2 | g3 |     on every rank of the group, after the schedule
        reduce-scatter (sum over the group), / dp
    my gradient       | G_i |                   summed over cp (the loss's shares), averaged over dp
        AdamW on my slice: fp32 master_i, m_i, v_i (torch's AdamW, the run's DeepSpeed values)
    my parameters     | P_i |
        all-gather
    flat parameters   | P0 | P1 | P2 | P3 |     copied back into the stage's parameters

Same bytes on the wire as the all-reduce of phase 1 (an all-reduce is a reduce-scatter then
an all-gather), but each rank keeps 12Ψ/N bytes of optimizer state instead of 8Ψ (memory.py,
stage 1: DeepSpeed keeps an fp32 master partition even of an fp32 model, so does this). The
gradients stay whole (pΨ) while the micro-batches accumulate, as ZeRO-1's do.

The update is torch's AdamW itself (plscale/rank/optim.py), run on one flat slice instead of
the parameters: decoupled weight decay, bias correction, every element computed alone, so
the result is the unsharded AdamW's, element for element (DeepSpeed's stage_1_and_2.py
wraps its base optimizer round the fp32 partition the same way).

    opt = Zero1AdamW(stage.parameters(), mesh.group("dp-cp"), mesh.size("dp"), ds_config)
    opt.reduce_gradients()    # after backward: this rank's slice of the summed gradient, / dp
    opt.step()                # AdamW on the slice, then all-gather the parameters
    opt.zero_grad()
"""

import torch
import torch.distributed as dist
from torch import nn

from plscale.rank.optim import optimizer


class Zero1AdamW:
    def __init__(self, params, group, dp: int, ds_config: dict, record=None):
        self.params, self.group, self.dp = list(params), group, dp
        self.n, self.rank = dist.get_world_size(group), dist.get_rank(group)
        self.numel = sum(p.numel() for p in self.params)
        self.k = -(-self.numel // self.n)
        self.record = record or (lambda op, nbytes: None)   # (op, bytes of the whole tensor) per collective
        self.master = nn.Parameter(torch.zeros(self.k, device=self.params[0].device))   # fp32, this rank's 1/N
        self.loaded = False   # the master is copied from the parameters at the first step: they may be
                              # loaded after the optimizer is built (lab 11 loads the dense weights then)
        self.inner = optimizer([self.master], ds_config)     # its Adam moments: k elements each
        self.param_groups = self.inner.param_groups

    def _padded(self, tensors) -> torch.Tensor:
        flat = torch.cat([t.reshape(-1) for t in tensors])
        return torch.cat([flat, flat.new_zeros(self.n * self.k - self.numel)])

    @torch.no_grad()
    def reduce_gradients(self) -> None:
        """Reduce-scatter the flat gradient over the group: this rank's slice, summed, / dp."""
        flat = self._padded([p.grad if p.grad is not None else torch.zeros_like(p) for p in self.params])
        grad = flat.new_empty(self.k)
        dist.reduce_scatter(grad, list(flat.split(self.k)), group=self.group)
        self.record("reduce_scatter", flat.numel() * flat.element_size())
        self.master.grad = grad.float().div_(self.dp)
        if not self.loaded:
            mine = self._padded([p.detach() for p in self.params])[self.rank * self.k:(self.rank + 1) * self.k]
            self.master.data.copy_(mine)
            self.loaded = True

    @torch.no_grad()
    def step(self) -> None:
        """AdamW on this rank's slice, then every rank's slice all-gathered into the parameters."""
        self.inner.step()
        self.master.grad = None
        slices = [self.master.new_empty(self.k) for _ in range(self.n)]
        dist.all_gather(slices, self.master.detach(), group=self.group)
        flat = torch.cat(slices)
        self.record("all_gather", flat.numel() * flat.element_size())
        for p, part in zip(self.params, flat[:self.numel].split([p.numel() for p in self.params])):
            p.copy_(part.view_as(p))

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.params:
            p.grad = None

    def states(self) -> dict[str, list]:
        """The optimizer's tensors by role, for plscale/rank/census.py."""
        return {"master": [self.master], "moments": [t for s in self.inner.state.values() for t in s.values()
                                                      if torch.is_tensor(t)]}
