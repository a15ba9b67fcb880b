"""The check every split model must pass: it trains as the dense model does. A lab trains its
split model (pipelined, tensor-parallel, context-parallel, experts over ranks, ...) and, on one
rank, the dense model from the same initial weights on every micro-batch every replica saw,
with the same optimizer; the losses must agree step by step.

    parity = min(S["train"]["parity_steps"], steps)
    if ctx.is_main and parity:
        dense = Llama(config).to(dev)
        dense.load_state_dict(initial)
        want = reference_losses(dense, ds, every_replica(batch, dp), parity)
        ctx.log("\\nloss, tensor-parallel vs dense: " + step_by_step(losses, want))
        ctx.check(*follows("the split model follows the dense model's loss", losses, want))

`follows` returns a Check, (name, ok, detail), which ctx.check takes as it is.
"""

import math

import torch
from typing import NamedTuple

from plscale.rank.optim import optimizer

TOLERANCE = 1e-5  # float32 through different but equivalent sums: a relative gap of 1e-7 a step, carried on


class Check(NamedTuple):
    """One check as a lab asserts it: ctx.check(*check)."""
    name: str
    ok: bool
    detail: str


def reference_losses(model, ds_config: dict, batches_of_step, steps: int, clip: bool = False) -> list[float]:
    """Train `model` (at the run's initial weights) for `steps` optimizer steps with the run's
    optimizer, each on every micro-batch `batches_of_step(step)` gives: the mean loss of each
    step, which is what data parallelism averages too. `clip`: the global gradient norm clipped
    at the config's gradient_clipping first, as DeepSpeed's engine does (max / (norm + 1e-6))."""
    opt, out = optimizer(model.parameters(), ds_config), []
    for step in range(steps):
        batches = batches_of_step(step)
        loss = sum(model(x, y) for x, y in batches) / len(batches)
        loss.backward()
        if clip and ds_config.get("gradient_clipping"):
            torch.nn.utils.clip_grad_norm_(model.parameters(), ds_config["gradient_clipping"])
        opt.step()
        opt.zero_grad()
        out.append(loss.item())
    return out


def every_replica(batch, replicas: int):
    """batches_of_step for reference_losses: every replica's micro-batches of a step, where
    `batch(step, replica)` gives one replica's."""
    return lambda step: [mb for r in range(replicas) for mb in batch(step, r)]


def largest_gap(losses: list[float], want: list[float]) -> float:
    """The largest relative gap between two loss curves, step by step (over the shorter); inf
    where either is not a finite number (max() would pass over a nan: nan > x is False)."""
    pairs = list(zip(losses, want))
    if not all(math.isfinite(a) and math.isfinite(b) for a, b in pairs):
        return math.inf
    return max(abs(a - b) / abs(b) for a, b in pairs)


def step_by_step(losses: list[float], want: list[float]) -> str:
    """The two curves, step by step: "measured/reference, ..."."""
    return ", ".join(f"{a:.6f}/{b:.6f}" for a, b in zip(losses, want))


def follows(name: str, losses: list[float], want: list[float], tolerance: float = TOLERANCE) -> Check:
    """Passes when every step's loss is within `tolerance` (relative) of the reference's."""
    gap = largest_gap(losses, want)
    return Check(name, gap <= tolerance, f"largest relative gap over {min(len(losses), len(want))} steps {gap:.2e} "
                                         f"(tolerance {f'{tolerance:.2g}'.replace('e-0', 'e-')})")
