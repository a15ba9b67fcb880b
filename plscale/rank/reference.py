"""The reference a parallel run must follow: the unsplit model, trained on the batches every
replica saw. A lab trains its split model (pipelined, tensor-parallel, ...) and, on one rank,
the dense model from the same weights; the losses must agree step by step.

    want = reference_losses(Llama(config).to(dev), ds, lambda step: all_micro_batches(step), 3)
    ctx.check("...", largest_gap(losses, want) <= 1e-5, ...)
"""

from plscale.rank.optim import optimizer


def reference_losses(model, ds_config: dict, batches_of_step, steps: int) -> list[float]:
    """Train `model` (at the run's initial weights) for `steps` optimizer steps with the run's
    optimizer, each on every micro-batch `batches_of_step(step)` gives: the mean loss of each
    step, which is what data parallelism averages too."""
    opt, out = optimizer(model.parameters(), ds_config), []
    for step in range(steps):
        batches = batches_of_step(step)
        loss = sum(model(x, y) for x, y in batches) / len(batches)
        loss.backward()
        opt.step()
        opt.zero_grad()
        out.append(loss.item())
    return out


def largest_gap(losses: list[float], want: list[float]) -> float:
    """The largest relative gap between two loss curves, step by step."""
    return max(abs(a - b) / abs(b) for a, b in zip(losses, want))
