"""The step's peak memory (plscale.predict.step_memory) against the allocator's history of a real
step of plscale's Llama: every allocation and free, from torch's profiler (plscale.rank.allocations),
on top of the states the rank holds. Both branches of the head's backward (the two fp32 gradients
of [tokens, V], or the logits' and the head weight's), and each recomputation strategy. FSDP2's
gathered term is measured on 2 ranks by the lab (tests/test_debug_lab.py, oom-fsdp2)."""

from contextlib import nullcontext
from dataclasses import replace

import pytest
import torch

from plscale.predict import step_memory
from plscale.predict.presets import PRESETS, param_count
from plscale.rank import allocations
from plscale.rank.models.llama import Llama
from plscale.strategies.recompute import llama as recompute

CPU = torch.device("cpu")


def measured_peak(config, seq: int, micro: int, strategy: str) -> tuple[float, float]:
    """(the second step's peak, its states): parameters, gradients and moments, then the history's highest."""
    torch.manual_seed(0)
    model = recompute.apply(Llama(config), strategy)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=False)
    x = torch.randint(0, config.vocab, (micro, seq + 1), generator=torch.Generator().manual_seed(1))
    for t in range(2):   # the first step makes the moments; the second is recorded
        level = sum(4 * p.numel() * (2 if p.grad is not None else 1) for p in model.parameters()) + \
            sum(v.numel() * v.element_size() for s in opt.state.values() for v in s.values() if v.dim())
        with allocations.record(CPU) if t else nullcontext() as rec:
            with allocations.phase("forward"):
                loss = model(x[:, :-1], x[:, 1:])
            with allocations.phase("backward"):
                loss.backward()
            with allocations.phase("step"):
                opt.step()
            opt.zero_grad(set_to_none=False)
            del loss
    return level + rec.history.peak(), level


@pytest.mark.parametrize("preset, seq, micro, strategy", [
    ("tiny", 32, 1, "none"),        # little kept: the tied embedding's three gradients (3W) are the peak
    ("tiny", 32, 2, "none"),        # W (1 MiB) = 2L: the head's backward, by a hair above 3W
    ("tiny", 32, 8, "none"),        # 2L (4 MiB) > W: the log-softmax's and the logits' gradients
    ("tiny", 32, 8, "full"),        # the rerun of one layer is the backward's largest
    ("tiny", 64, 4, "selective"),
    ("deep", 64, 6, "none"),        # lab 12's oom run, one rank's replica
    ("deep", 64, 6, "full"),
])
def test_the_step_peak_is_the_allocators(preset, seq, micro, strategy):
    config = replace(PRESETS[preset], attention="math" if strategy == "selective" else "fused")
    peak, states = measured_peak(config, seq, micro, strategy)
    assert states == 16 * param_count(config)   # fp32 AdamW: parameters, gradients, two moments
    want = step_memory.peak(step_memory.Step(config, seq, micro, recompute=strategy))
    assert want.device == pytest.approx(peak, rel=0.01), (want.terms, peak - states)


def test_the_fixes_each_change_one_thing_and_offload_leaves_the_device():
    step = step_memory.Step(PRESETS["deep"], 64, 6, ranks=2)
    fixes = step_memory.fixes(step)
    base = step_memory.peak(step)
    assert fixes["micro-batch 1, accumulated"].grad_accum == 6   # the same global batch
    assert all(step_memory.peak(s).device < base.device for s in fixes.values())
    psi = param_count(PRESETS["deep"])
    offload = step_memory.peak(fixes["optimizer offloaded to host"])
    assert (offload.terms["states"], offload.host) == (8 * psi, 12 * psi)   # weights, gradients | fp32 copy, moments
    sharded = step_memory.peak(fixes["states sharded (FSDP2)"])
    # 2 ranks share each tensor's rows: half of 16 bytes a parameter (every dim 0 of deep is even)
    assert sharded.terms["states"] == 8 * psi
