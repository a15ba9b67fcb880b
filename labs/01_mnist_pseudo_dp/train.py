"""Lab 01: pseudo data parallelism on MNIST, then the real thing.

Part 1 simulates N data-parallel workers on one device: each worker computes the gradient
of its shard of the global batch on its own replica; averaging those gradients (what
all-reduce does) gives exactly the full-batch gradient, and exactly what gradient
accumulation over N micro-batches gives. Part 2 runs true data parallelism with DeepSpeed
on N ranks, same seed, same data, and lands on the same loss curve.

    plscale lab run mnist-dp --gpus 2
    deepspeed --num_gpus 2 labs/01_mnist_pseudo_dp/train.py        (add DS_ACCELERATOR=cpu without GPUs)
    torchrun --nproc_per_node 2 labs/01_mnist_pseudo_dp/train.py
"""

import copy
import time

import deepspeed
import torch
import torch.distributed as dist
import torch.nn.functional as F
from deepspeed.runtime.constants import GRADIENT_CLIPPING_DEFAULT

from plscale.charts.plots import curves_and_gaps
from plscale.rank import runtime
from plscale.rank.data import mnist
from plscale.rank.memory import per_rank_mib
from plscale.rank.metrics import figure
from plscale.rank.models.mlp import images_to_tensor, mlp

ctx = runtime.start(__file__)
S, ds, dev = ctx.settings, ctx.ds_config, ctx.device
N, steps = ctx.world_size, S["train"]["steps"]
micro, accum = ds["train_micro_batch_size_per_gpu"], ds["gradient_accumulation_steps"]
B = micro * accum * N  # the global batch: N shards of micro * accum samples
adam = {k: v for k, v in ds["optimizer"]["params"].items() if k in ("lr", "betas", "eps", "weight_decay")}
clip = ds.get("gradient_clipping", GRADIENT_CLIPPING_DEFAULT)  # DeepSpeed clips at 1.0 unless told

data = mnist.load()
ctx.log(f"data: {data.source}")
x_train, y_train = images_to_tensor(data.train.images, dev), torch.as_tensor(data.train.labels, device=dev)
x_test, y_test = images_to_tensor(data.test.images, dev), torch.as_tensor(data.test.labels, device=dev)
order = torch.randperm(len(y_train), generator=torch.Generator().manual_seed(S["seed"])).to(dev)


def global_batch(step):
    """The same B samples on every rank and in every part of the lab."""
    start = (step * B) % (len(order) - B)
    rows = order[start:start + B]
    return x_train[rows], y_train[rows]


def new_model():
    torch.manual_seed(S["seed"])  # every model in this lab starts from the same weights
    return mlp(**S["model"]).to(dev)


def max_gap(tensors_a, tensors_b):
    return max((a - b).abs().max().item() for a, b in zip(tensors_a, tensors_b))


def accuracy(model, rows):
    with torch.no_grad():
        return (model(x_test[rows]).argmax(1) == y_test[rows]).sum()


# ---- Part 1: N workers simulated on one device ---------------------------------------
pseudo_losses, curves, gaps = [], {}, {"shards": 0.0, "accum": 0.0, "replicas": 0.0}
if ctx.is_main:
    ctx.log(f"\nPart 1: {N} simulated workers, global batch {B} = {N} shards x {micro * accum}")
    reference = new_model()                                   # ordinary full-batch training
    accumulated = copy.deepcopy(reference)                    # gradient accumulation
    replicas = [copy.deepcopy(reference) for _ in range(N)]   # one replica per worker
    models = [reference, accumulated, *replicas]
    optimizers = [torch.optim.AdamW(m.parameters(), **adam) for m in models]

    # The lesson's warning first: with unequal shards, a plain average of shard means is wrong.
    x, y = global_batch(0)
    sizes = [B * 3 // 4, B - B * 3 // 4]
    shard_grads = []
    for xs, ys in zip(x.split(sizes), y.split(sizes)):
        shard_grads.append(torch.autograd.grad(F.cross_entropy(reference(xs), ys), list(reference.parameters())))
    full = torch.autograd.grad(F.cross_entropy(reference(x), y), list(reference.parameters()))
    plain = [sum(g) / 2 for g in zip(*shard_grads)]
    weighted = [sum(g * n / B for g, n in zip(gs, sizes)) for gs in zip(*shard_grads)]
    gaps["unequal_plain"], gaps["unequal_weighted"] = max_gap(plain, full), max_gap(weighted, full)

    curves = {"full": [], "accum": []}
    for step in range(steps):
        t0 = time.perf_counter()
        x, y = global_batch(step)
        # The same gradient three ways, at the same weights (replica 0's):
        weights = list(replicas[0].parameters())
        full = torch.autograd.grad(F.cross_entropy(replicas[0](x), y), weights)          # full batch
        micro_grads = [torch.autograd.grad(F.cross_entropy(replicas[0](xs), ys) / (N * accum), weights)
                       for xs, ys in zip(x.chunk(N * accum), y.chunk(N * accum))]
        accumulated_grad = [sum(g) for g in zip(*micro_grads)]                         # accumulation
        shard_losses = []
        for replica, xs, ys in zip(replicas, x.chunk(N), y.chunk(N)):   # each worker, its shard
            loss = F.cross_entropy(replica(xs), ys)
            loss.backward()
            shard_losses.append(loss.item())
        for params in zip(*(r.parameters() for r in replicas)):         # the all-reduce: average
            mean = torch.stack([p.grad for p in params]).mean(0)
            for p in params:
                p.grad = mean.clone()
        averaged = [p.grad for p in replicas[0].parameters()]
        gaps["shards"] = max(gaps["shards"], max_gap(averaged, full))
        gaps["accum"] = max(gaps["accum"], max_gap(accumulated_grad, full))

        # ...and the three ways trained side by side: full batch, accumulation, N replicas.
        loss = F.cross_entropy(reference(x), y)
        loss.backward()
        curves["full"].append(loss.item())
        accum_loss = 0.0
        for xs, ys in zip(x.chunk(N * accum), y.chunk(N * accum)):
            loss = F.cross_entropy(accumulated(xs), ys) / (N * accum)
            loss.backward()
            accum_loss += loss.item()
        curves["accum"].append(accum_loss)
        for model, optimizer in zip(models, optimizers):
            if clip:
                torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        for replica in replicas[1:]:
            gaps["replicas"] = max(gaps["replicas"], max_gap(replica.parameters(), replicas[0].parameters()))
        pseudo_losses.append(sum(shard_losses) / N)
        ctx.metrics.step(phase="pseudo", step=step, loss=pseudo_losses[-1], full_batch_loss=curves["full"][-1],
                         accum_loss=curves["accum"][-1], step_time_s=time.perf_counter() - t0)
        ctx.metrics.progress("pseudo-DP", step + 1, steps, f"loss {pseudo_losses[-1]:.4f}")
    # Different summation order leaves float-level differences that Adam amplifies over many
    # steps: separately trained curves agree early and drift slowly. Check the early part.
    early = S["train"]["early_steps"]
    for name in ("full", "accum"):
        pairs = list(zip(curves[name], pseudo_losses))
        gaps[f"curve_{name}"] = max(abs(a - b) for a, b in pairs[:early])
        gaps[f"curve_{name}_all"] = max(abs(a - b) for a, b in pairs)
    pseudo_acc = accuracy(replicas[0], slice(None)).item() / len(y_test)
    tol = S["train"]["grad_tolerance"]
    ctx.check("shard average == full batch", gaps["shards"] < tol, f"max |grad gap| {gaps['shards']:.2e} < {tol:g}")
    ctx.check("accumulation == full batch", gaps["accum"] < tol, f"max |grad gap| {gaps['accum']:.2e} < {tol:g}")
    ltol = S["train"]["loss_tolerance"]
    ctx.check("full-batch training, same curve", gaps["curve_full"] < ltol,
              f"max |loss gap| {gaps['curve_full']:.2e} < {ltol:g} over the first {early} steps "
              f"({gaps['curve_full_all']:.1e} over all {steps})")
    ctx.check("accumulation training, same curve", gaps["curve_accum"] < ltol,
              f"max |loss gap| {gaps['curve_accum']:.2e} < {ltol:g} over the first {early} steps")
    ctx.check("replicas identical", gaps["replicas"] == 0.0, f"max |param gap| {gaps['replicas']:.2e}")
    ctx.check("unequal shards: weight by size", gaps["unequal_plain"] > 100 * gaps["unequal_weighted"],
              f"plain average off by {gaps['unequal_plain']:.2e}, weighted by {gaps['unequal_weighted']:.2e}")
dist.barrier()

# ---- Part 2: true data parallelism, DeepSpeed on N ranks ------------------------------
ctx.log(f"\nPart 2: DeepSpeed ZeRO-{ds['zero_optimization']['stage']} on {N} ranks over {ctx.backend}, "
        f"micro batch {micro} x accumulation {accum} x {N} ranks = {B}")
model = new_model()
engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=ds)
ds_losses, times = [], []
for step in range(steps):
    t0 = time.perf_counter()
    x, y = global_batch(step)
    mine = slice(ctx.rank * micro * accum, (ctx.rank + 1) * micro * accum)   # this rank's shard
    loss_sum = torch.zeros((), device=dev)
    for xm, ym in zip(x[mine].chunk(accum), y[mine].chunk(accum)):
        loss = F.cross_entropy(engine(xm), ym)
        engine.backward(loss)   # gradients are all-reduced (averaged) at the accumulation boundary
        engine.step()
        loss_sum += loss.detach()
    dist.all_reduce(loss_sum)
    ds_losses.append(loss_sum.item() / (N * accum))
    times.append(time.perf_counter() - t0)
    ctx.metrics.step(phase="deepspeed", step=step, loss=ds_losses[-1], step_time_s=times[-1],
                     samples_per_s=B / times[-1], memory_mib_per_rank=per_rank_mib(dev))
    ctx.metrics.progress("DeepSpeed DP", step + 1, steps, f"loss {ds_losses[-1]:.4f}")

correct = accuracy(engine.module, slice(ctx.rank, None, N))          # each rank scores its share
dist.all_reduce(correct)
ds_acc = correct.item() / len(y_test)
memory = per_rank_mib(dev)

figures = []
if ctx.is_main:
    loss_gap = max(abs(a - b) for a, b in zip(ds_losses, pseudo_losses))
    ctx.check("DeepSpeed curve == simulated curve", loss_gap < S["train"]["loss_tolerance"],
              f"max |loss gap| {loss_gap:.2e} over {steps} steps")
    warm = times[len(times) // 5:] or times
    curves_and_gaps(ctx.run_dir / "loss.png", {"full batch (1 model)": (range(steps), curves["full"]),
                                         f"accumulation ({N * accum} micro-batches)": (range(steps), curves["accum"]),
                                         f"pseudo-DP ({N} simulated workers)": (range(steps), pseudo_losses),
                                         f"DeepSpeed DP ({N} ranks)": (range(steps), ds_losses)},
              f"pseudo-DP ({N} simulated workers)", f"MNIST: four ways to one loss curve, global batch {B}",
              styles={f"pseudo-DP ({N} simulated workers)": "--", f"DeepSpeed DP ({N} ranks)": ":"})
    figures = [
        figure("shard-average vs full-batch grad", gaps["shards"], "max abs", 0.0, "float tolerance"),
        figure("accumulated vs full-batch grad", gaps["accum"], "max abs", 0.0, "float tolerance"),
        figure(f"full-batch vs pseudo-DP loss, {early} steps", gaps["curve_full"], "max abs", 0.0, "float noise"),
        figure(f"full-batch vs pseudo-DP loss, {steps} steps", gaps["curve_full_all"], "max abs", 0.0,
               "Adam amplifies float noise over time"),
        figure(f"accumulation vs pseudo-DP loss, {steps} steps", gaps["curve_accum_all"], "max abs", 0.0),
        figure("replica divergence", gaps["replicas"], "max abs", 0.0),
        figure("unequal shards, plain average", gaps["unequal_plain"], "max abs", "> 0", "the wrong way"),
        figure("unequal shards, weighted", gaps["unequal_weighted"], "max abs", 0.0, "the right way"),
        figure("DeepSpeed vs simulated loss", loss_gap, "max abs", 0.0, f"over {steps} steps"),
        figure("final loss", ds_losses[-1], "nats"),
        figure("test accuracy (DeepSpeed)", 100 * ds_acc, "%", round(100 * pseudo_acc, 2), "predicted: simulated"),
        figure("throughput (DeepSpeed)", B / (sum(warm) / len(warm)), "samples/s", None, "mean after the first 20% of steps"),
        figure("memory per rank (max)", max(memory), "MiB", None, "RSS on CPU, allocator peak on GPU"),
    ]
ctx.finish(figures, data=data.source, real_data=data.real, plots=["loss.png"], memory_mib_per_rank=memory)
