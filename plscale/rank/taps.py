"""Real tensors at a model's linear layers, for one forward and backward: what a number format
must hold.

    acts, grads = capture(model, tokens, targets)                      # fp32
    acts, grads = capture(model, tokens, targets, torch.float16, 1024)  # under autocast, loss x 1024

    activations  the input of every nn.Linear (what an fp8 matmul would cast: x in x W^T)
    gradients    the gradient at every nn.Linear's output, dL/dy, the one backward carries down
                 (under autocast: a 16-bit tensor, scaled as the loss was)

Both are dicts name -> tensor (detached, as they were: dtype and scale unchanged), in the
order the layers ran. The model's own gradients are cleared afterwards.
"""

import contextlib

import torch
from torch import nn


def capture(model: nn.Module, tokens: torch.Tensor, targets: torch.Tensor, autocast: torch.dtype | None = None,
            scale: float = 1.0) -> tuple[dict, dict]:
    """One forward and backward of `model` (loss x `scale`), the linears' inputs and output gradients."""
    acts, grads, handles = {}, {}, []
    for name, module in model.named_modules():
        if isinstance(module, nn.Linear):
            handles.append(module.register_forward_pre_hook(
                lambda m, args, name=name: acts.__setitem__(name, args[0].detach())))
            handles.append(module.register_full_backward_hook(
                lambda m, grad_in, grad_out, name=name: grads.__setitem__(name, grad_out[0].detach())))
    low = torch.autocast(tokens.device.type, dtype=autocast) if autocast else contextlib.nullcontext()
    try:
        with low:
            loss = model(tokens, targets)
        (loss * scale).backward()
    finally:
        for handle in handles:
            handle.remove()
        model.zero_grad(set_to_none=True)
    return acts, grads


def log2_histogram(tensors, lo: int = -48, hi: int = 24, per_binade: int = 2) -> dict:
    """Counts of log2|x| over all entries of `tensors` (zeros apart), in bins of 1/per_binade
    binade from 2^lo to 2^hi (values beyond fall in the end bins): {edges, counts, zeros}."""
    bins = (hi - lo) * per_binade
    counts, zeros = torch.zeros(bins, dtype=torch.float64), 0
    for t in tensors:
        t = t.detach().float().abs().flatten()
        nonzero = t[t > 0]
        zeros += t.numel() - nonzero.numel()
        logs = nonzero.log2().clamp(lo, hi - 1e-6)
        counts += torch.histc(logs.double(), bins=bins, min=lo, max=hi).cpu()
    edges = [lo + i / per_binade for i in range(bins + 1)]
    return {"edges": edges, "counts": counts.tolist(), "zeros": int(zeros)}
