"""Exercise zero1: ZeRO stage 1, any torch optimizer's states sharded over the data-parallel ranks.

Lab 04 (labs/04_zero) measures what each ZeRO stage saves. Check with

    plscale exercise check zero1

N data-parallel ranks hold the same model. Adam keeps two fp32 moments per parameter
(exp_avg and exp_avg_sq) on every rank: N copies of the same numbers. ZeRO-1 (Rajbhandari et
al., 2020) gives each rank one N-th of them. A real wrapper (DeepSpeed's, torch's
ZeroRedundancyOptimizer) works for any optimizer: it shards the parameters' values and lets
the optimizer itself step the shard, so the arithmetic is exactly the optimizer's own.

    opt = Zero1(model.parameters(), torch.optim.AdamW, lr=1e-3, weight_decay=0.1)
    loss.backward(); (average the gradients over the ranks); opt.step(); opt.zero_grad()

1. `__init__`: keep the parameters that require a gradient (a frozen one has nothing to
   step: leave it out of everything). Flatten them (`flatten`, given) into one vector of P
   elements and pad it with zeros to N·k, k = ceil(P / N): rank r owns elements r·k ..
   (r+1)·k - 1 (`self.start`, `self.end`). `self.shard`: this rank's k elements as a leaf
   tensor that requires a gradient, fp32, on the parameters' device. `self.optimizer`:
   `optimizer_class([self.shard], **kwargs)`, the one optimizer, holding state for k elements.
2. `step()`: the gradients are already averaged over the ranks (p.grad is the same on every
   rank). Give `self.shard` this rank's slice of the flat gradients as its `.grad`, step
   `self.optimizer`, then one all-gather of every rank's shard gives every rank the whole
   updated vector: write it into the parameters (`unflatten_into`, given).
3. `zero_grad()`: the parameters' gradients to None (and the shard's).

Why the optimizer's own arithmetic: torch's optimizers on CPU update each element alone (no
sum over elements, in AdamW: decay, moments, bias corrections), so stepping a slice gives
exactly the numbers stepping the whole would, bit for bit.

What the checks test, on 2 and 4 ranks, with P not a multiple of N: self.start and self.end;
the shard (k elements, fp32, on the parameters' device) and the optimizer's state (k elements
per tensor); parameters equal to torch's AdamW (weight decay 0.1) stepping the whole model,
bit for bit, after 1 and 5 steps, and to SGD with momentum's; a frozen parameter left as it
was and out of the shards; every rank holding the same parameters; one all-gather per step
and no other collective. Use torch.distributed's default group.
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


class Zero1:
    def __init__(self, params, optimizer_class=torch.optim.Adam, **kwargs):
        # TODO: self.params (the trainable ones), self.start, self.end, self.shard, self.optimizer
        raise NotImplementedError("Zero1.__init__")

    @torch.no_grad()
    def step(self) -> None:
        # TODO: this rank's slice of the gradients into self.shard.grad, the optimizer's step,
        #       one all-gather, write back
        raise NotImplementedError("Zero1.step")

    def zero_grad(self) -> None:
        # TODO
        raise NotImplementedError("Zero1.zero_grad")
