"""Running stage orders, on paper and for real, for the pipeline-schedule checks.

`problem(order, m)`      what makes a list not a schedule: a micro-batch missing, twice,
                         or backward before forward
`timeline(orders)`       the orders of all p stages played against their dependencies by
                         plscale.predict.pipeline.play (F takes 1, B 2; communication free),
                         as its Ops (its `bubble_of` measures them); Deadlock when the
                         stages' orders cannot all finish
`run_for_real(order, ...)`  one stage of a small model (p stages of Linear + tanh) on this rank:
                         activations and gradients cross to the neighbours point to point in
                         the stage's order (isend, and recv with a tag per message, so only
                         the dependencies order the ranks); returns this stage's gradients and
                         the whole model's, computed on this rank alone
"""

import copy

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from plscale.predict import pipeline
from plscale.predict.pipeline import Op, play

WIDTH = 8  # features of the small model


class Deadlock(Exception):
    pass


def problem(order, m: int) -> str | None:
    """None when `order` is a schedule of m micro-batches; else what is wrong."""
    try:
        items = [(str(kind), int(i)) for kind, i in order]
    except (TypeError, ValueError):
        return f"not a list of (kind, micro-batch) pairs: {str(order)[:80]}"
    want = sorted([("F", i) for i in range(m)] + [("B", i) for i in range(m)])
    if sorted(items) != want:
        extra = sorted(set(items) - set(want)) or [x for x in items if items.count(x) > 1][:1]
        missing = sorted(set(want) - set(items))
        return (f"{len(items)} items for {2 * m} pieces of work"
                + (f"; unexpected or repeated {extra[0]}" if extra else "") + (f"; missing {missing[0]}" if missing else ""))
    late = [i for i in range(m) if items.index(("B", i)) < items.index(("F", i))]
    return f"('B', {late[0]}) comes before ('F', {late[0]})" if late else None


def timeline(orders: list) -> list[Op]:
    """plscale.predict.pipeline.play on the stages' orders (F 1, B 2); Deadlock naming where."""
    try:
        return play(orders)
    except pipeline.Deadlock as exc:
        raise Deadlock("; ".join(f"stage {s} waits forever at {tuple(op)}" for s, op in exc.stuck)) from None


def _model(p: int, m: int):
    torch.manual_seed(5)  # the same layers and batch on every rank
    layers = [nn.Linear(WIDTH, WIDTH) for _ in range(p)]
    inputs, targets = torch.randn(m, 2, WIDTH), torch.randn(m, 2, WIDTH)
    return layers, inputs, targets


def _whole_model_grads(layers, inputs, targets, s: int) -> list[torch.Tensor]:
    layers = copy.deepcopy(layers)
    loss = 0.0
    for x, target in zip(inputs, targets):
        for layer in layers:
            x = torch.tanh(layer(x))
        loss = loss + F.mse_loss(x, target) / len(inputs)
    loss.backward()
    return [q.grad for q in layers[s].parameters()]


def run_for_real(order, p: int, s: int, m: int) -> tuple[list, list]:
    """(this stage's gradients after running `order`, the whole model's for the same layer)."""
    layers, inputs, targets = _model(p, m)
    expected = _whole_model_grads(layers, inputs, targets, s)
    stage, saved, sends = copy.deepcopy(layers[s]), {}, []
    for kind, i in order:
        if kind == "F":
            x = inputs[i] if s == 0 else _recv(s - 1, tag=i)
            x.requires_grad_(s > 0)
            y = torch.tanh(stage(x))
            if s == p - 1:
                y = F.mse_loss(y, targets[i]) / m
            else:
                sends.append(dist.isend(y.detach(), s + 1, tag=i))
            saved[i] = (x, y)
        else:
            x, y = saved.pop(i)
            y.backward(None if s == p - 1 else _recv(s + 1, tag=m + i))
            if s > 0:
                sends.append(dist.isend(x.grad, s - 1, tag=m + i))
    for request in sends:
        request.wait()
    return [q.grad for q in stage.parameters()], expected


def _recv(src: int, tag: int) -> torch.Tensor:
    x = torch.empty(2, WIDTH)
    dist.recv(x, src, tag=tag)
    return x
