"""Lab 02: true data parallelism on IMDB: PyTorch DDP, DeepSpeed and accelerate side by side.

Every rank holds the whole model and trains on its own shard of the data; after each
backward the ranks average their gradients (all-reduce), so every replica takes the same
step. DDP does it in buckets that start while backward is still running (overlap); with
gradient accumulation, `no_sync` skips the all-reduce of the first k-1 micro-batches.
DeepSpeed does the same maths with its own engine (`gradient_accumulation_steps`,
`reduce_bucket_size`, `overlap_comm`). Hugging Face accelerate drives that same DeepSpeed
engine from a plain PyTorch loop: `prepare` builds it from the same config, `accumulate`
marks the boundary micro-batch, `backward` runs DeepSpeed's backward (and, at the
boundary, its step). Same model, seed and data: the same loss curve.

    plscale lab run imdb-ddp --gpus 2                  PyTorch DDP under torchrun
    plscale lab run imdb-deepspeed --gpus 2            DeepSpeed under its launcher
    plscale lab run imdb-accelerate --gpus 2           accelerate + DeepSpeed under accelerate launch
    torchrun --nproc_per_node 2 labs/02_imdb_ddp/train.py --variant ddp
    deepspeed --num_gpus 2 labs/02_imdb_ddp/train.py --variant deepspeed   (DS_ACCELERATOR=cpu without GPUs)
    accelerate launch --use_deepspeed --num_processes 2 labs/02_imdb_ddp/train.py --variant accelerate
"""

import copy
import gc
import time
from contextlib import contextmanager, nullcontext

import deepspeed
import torch
import torch.distributed as dist
import torch.nn.functional as F
from accelerate import Accelerator, PartialState
from accelerate.utils import DeepSpeedPlugin, DummyOptim
from deepspeed.utils import safe_get_full_grad
from torch.nn.parallel import DistributedDataParallel as DDP

from plscale.errors import UserError
from plscale.charts.plots import line_plot
from plscale.rank import comms, runtime
from plscale.strategies.data_parallel import gather
from plscale.rank.data import imdb
from plscale.rank.memory import per_rank_mib
from plscale.strategies.data_parallel.reductions import ddp_reductions, deepspeed_reductions
from plscale.rank.metrics import figure
from plscale.rank.models import encoder
from plscale.strategies.data_parallel.sampler import ShardedSampler

ctx = runtime.start(__file__)
S, ds, dev, N = ctx.settings, ctx.ds_config, ctx.device, ctx.world_size
D, M, T, engine_name = S["data"], S["model"], S["train"], S["train"]["engine"]  # check.py checked them
micro, accum = ds["train_micro_batch_size_per_gpu"], ds["gradient_accumulation_steps"]
B = micro * accum * N  # the global batch: N ranks x accum micro-batches x micro samples

# ---- Data: reviews -> token ids, truncated and padded to max_len -----------------------
data = imdb.load(S["seed"], D["train_samples"], D["test_samples"])
ctx.log(f"data: {data.source}: {len(data.train.labels)} train, {len(data.test.labels)} test reviews")
torch.manual_seed(S["seed"])  # every rank builds the same initial weights
if M["init"] == "pretrained":
    model, tok = encoder.pretrained(M["pretrained"])
    tok_name = f"{M['pretrained']}'s tokenizer"
else:
    tok, tok_name = imdb.tokenizer(data.train.texts, D["vocab"])
    model = encoder.EncoderClassifier(tok.get_vocab_size(), D["max_len"], M["dim"], M["layers"], M["heads"],
                                      M["ff"], M["dropout"])
x_train, m_train = (t.to(dev) for t in imdb.encode(tok, data.train.texts, D["max_len"]))
x_test, m_test = (t.to(dev) for t in imdb.encode(tok, data.test.texts, D["max_len"]))
y_train, y_test = torch.tensor(data.train.labels, device=dev), torch.tensor(data.test.labels, device=dev)
ctx.log(f"tokens: {tok_name}, {D['max_len']} per review ({m_train.float().mean():.0%} real, the rest padding)")

sampler = ShardedSampler(len(y_train), N, ctx.rank, seed=S["seed"])   # this rank's shard, reshuffled per epoch
steps_per_epoch = len(sampler) // (micro * accum)
if steps_per_epoch < 1:  # the host checked data.train_samples; only here is it known how many reviews the data holds
    raise UserError(f"The data holds {len(y_train)} training reviews, {len(sampler)} per rank, fewer than one step's "
                    f"ds.micro_batch x ds.grad_accum = {micro * accum}: use more data or a smaller ds.micro_batch.")
steps = T["steps"] or T["epochs"] * steps_per_epoch

# ---- The engine: DDP, DeepSpeed, or accelerate driving DeepSpeed, wrapping the same model -
model = model.to(dev)
reference = copy.deepcopy(model)  # one process, one big batch: what the gradients must equal
ddp, accel = engine_name == "ddp", engine_name == "accelerate"
adam = {k: v for k, v in ds["optimizer"]["params"].items() if k in ("lr", "betas", "eps", "weight_decay")}
clip = ds["gradient_clipping"]


if ddp:
    net = DDP(model, bucket_cap_mb=T["bucket_cap_mb"])
    optimizer = torch.optim.AdamW(model.parameters(), **adam)
elif accel:
    PartialState(backend=ctx.backend)  # adopt the process group runtime.start() opened (else: 1 process)
    accelerator = Accelerator(deepspeed_plugin=DeepSpeedPlugin(hf_ds_config=ds), gradient_accumulation_steps=accum)
    # the engine from the same config; DummyOptim: the optimizer is the config's, built by DeepSpeed
    net, optimizer = accelerator.prepare(model, DummyOptim(model.parameters()))
else:
    net, optimizer, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=ds)
reductions = ddp_reductions(net) if ddp else deepspeed_reductions  # (calls, seconds) so far: DDP's hook, DS's logger
how = (f"DDP, bucket_cap_mb={T['bucket_cap_mb']}" if ddp else ("accelerate over " if accel else "") +
       f"DeepSpeed ZeRO-{ds['zero_optimization']['stage']}" + (f", reduce_bucket_size="
       f"{ds['zero_optimization']['reduce_bucket_size']:,}, overlap_comm={ds['zero_optimization']['overlap_comm']}"
       if ds["zero_optimization"]["stage"] else ""))
ctx.log(f"model: {encoder.parameters(model):,} parameters; engine: {how}; {N} ranks over {ctx.backend}; "
        f"global batch {B} = {N} ranks x {accum} micro-batches x {micro}; {steps} steps")


def full_grads() -> list:
    """This rank's copy of every parameter's gradient, as the optimizer is about to see it."""
    return [(p.grad if ddp else safe_get_full_grad(p)).clone() for p in model.parameters()]


@contextmanager
def before_step(engine):
    """accelerator.backward() runs DeepSpeed's step at the boundary, which applies and clears the
    gradients: read them just before it (once, for the check step). Yields what was read, and how
    many reductions the reading issued (ZeRO-1/2 gather partitions: the check's, not training's)."""
    seen, step = {"grads": [], "calls": 0}, engine.step

    def read_then_step(*args, **kwargs):
        calls0 = reductions()[0]
        seen["grads"], seen["calls"] = full_grads(), reductions()[0] - calls0
        return step(*args, **kwargs)
    engine.step = read_then_step
    try:
        yield seen
    finally:
        del engine.step


def train_step(rows: torch.Tensor, check: bool):
    """One optimizer step on this rank's rows: accum micro-batches, one gradient average.
    Returns (loss summed over micro-batches, reductions per micro-batch, their seconds, gradients at step 0, else [])."""
    loss_sum, calls, comm_s, grads = torch.zeros((), device=dev), [], 0.0, []
    for i, mb in enumerate(rows.chunk(accum)):
        (calls0, seconds0), last, seen = reductions(), i == accum - 1, {"grads": [], "calls": 0}
        x, mask, y = x_train[mb], m_train[mb], y_train[mb]
        if ddp:
            with nullcontext() if last else net.no_sync():   # no_sync: keep local grads, no all-reduce
                loss = F.cross_entropy(net(x, mask), y)
                (loss / accum).backward()
        elif accel:
            with accelerator.accumulate(net):   # counts micro-batches: sync_gradients only on the accum-th
                loss = F.cross_entropy(net(x, mask), y)
                with before_step(net) if last and check else nullcontext(seen) as seen:
                    accelerator.backward(loss)   # DeepSpeed's backward (divides by accum); at the boundary its step
        else:
            loss = F.cross_entropy(net(x, mask), y)
            net.backward(loss)   # divides by accum; reduces only at the accumulation boundary
        calls.append(reductions()[0] - calls0 - seen["calls"])
        comm_s += reductions()[1] - seconds0
        loss_sum += loss.detach()
        if last and check:
            grads = seen["grads"] if accel else full_grads()
        if engine_name == "deepspeed":
            net.step()           # a real step only at the boundary; counts micro-batches before it
    if ddp:
        if clip:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return loss_sum, calls, comm_s, grads


def evaluate(limit: int = 0) -> tuple[float, int]:
    """Accuracy on the first `limit` test reviews (0 = all): each rank scores its shard, the
    predictions are gathered by sample index so the sampler's padding repeats count once."""
    n = min(limit, len(y_test)) if limit else len(y_test)
    rows = ShardedSampler(n, N, ctx.rank, shuffle=False).indices().to(dev)
    model.eval()
    with torch.no_grad():
        preds = torch.cat([model(x_test[c], m_test[c]).argmax(1) for c in rows.split(T["eval_batch"])])
    model.train()
    return gather.accuracy(rows, preds, y_test[:n]), len(rows) * N - n


# ---- Training: step 0 checks the gradients, then the clock runs ------------------------
losses, times, evals, per_step_calls, comm_times, gap, calls0 = [], [], [], [], [], float("nan"), []
torch.manual_seed(S["seed"] + ctx.rank)  # the same dropout stream per rank for both engines
train_clock, target_time = 0.0, None
for step in range(steps):
    epoch, k = divmod(step, steps_per_epoch)
    sampler.set_epoch(epoch)
    rows = sampler.indices()[k * micro * accum:(k + 1) * micro * accum].to(dev)
    check = step == 0
    model.train(not check)   # the check step runs without dropout, so the reference can match exactly
    t0 = time.perf_counter()
    loss_sum, calls, comm_s, grads = train_step(rows, check)
    dist.all_reduce(loss_sum)
    elapsed = time.perf_counter() - t0
    losses.append(loss_sum.item() / (N * accum))
    if check:  # the same global batch, all of it, through the single-process copy
        everyone = [torch.empty_like(rows) for _ in range(N)]
        dist.all_gather(everyone, rows)
        batch = torch.cat(everyone)
        reference.eval()
        full = F.cross_entropy(reference(x_train[batch], m_train[batch]), y_train[batch])
        ref_grads = torch.autograd.grad(full, list(reference.parameters()))
        gap, calls0 = max((a - b).abs().max().item() for a, b in zip(grads, ref_grads)), calls
        model.train()
    else:
        train_clock += elapsed
        times.append(elapsed)
        per_step_calls.append(sum(calls))
        comm_times.append(comm_s)
    ctx.metrics.step(phase="train", step=step, epoch=epoch, loss=losses[-1], step_time_s=elapsed,
                     samples_per_s=B / elapsed, reductions=sum(calls), reduction_s=comm_s)
    ctx.metrics.progress(f"{engine_name} DP", step + 1, steps, f"loss {losses[-1]:.4f}")
    if T["eval_every"] and (step + 1) % T["eval_every"] == 0:
        acc, _ = evaluate(D["eval_samples"])
        evals.append((step + 1, train_clock, acc))
        ctx.metrics.step(phase="eval", step=step + 1, train_time_s=train_clock, accuracy=acc)
        ctx.log(f"  step {step + 1}: quick eval on {D['eval_samples']} test reviews: {acc:.1%}")
        if target_time is None and acc >= T["target_accuracy"]:
            target_time = train_clock

test_acc, repeats = evaluate()
memory = per_rank_mib(dev)

# ---- What the run shows ----------------------------------------------------------------
tol = T["grad_tolerance"]
ctx.check("all-reduced gradient == one big batch", gap < tol,
          f"max |grad gap| {gap:.2e} < {tol:g} (global batch {B}, {accum} micro-batches x {N} ranks)")
ctx.check("no all-reduce before the accumulation boundary", sum(calls0[:-1]) == 0 and calls0[-1] > 0,
          f"reductions per micro-batch at step 0: {calls0}")
figures = []
if ctx.is_main:
    warm = times[len(times) // 5:] or times or [float("nan")]
    step_s = sum(warm) / len(warm)
    line_plot(ctx.run_dir / "loss.png", {f"{engine_name}, {N} ranks": (range(steps), losses)},
              f"IMDB, {how}: training loss, global batch {B}")
    figures = [
        figure("grad gap vs one big batch", gap, "max abs", 0.0, f"{accum} micro-batches x {N} ranks"),
        figure("reductions in no_sync micro-batches", sum(calls0[:-1]), "calls", 0, f"first {accum - 1} of {accum}"),
        figure("reductions per step", sum(per_step_calls) / max(1, len(per_step_calls)), "calls", None,
               "DDP: one per bucket; DeepSpeed: per reduce bucket"),
        figure("reduction time per step", 1000 * sum(comm_times) / max(1, len(comm_times)), "ms", None,
               "issue to completion, overlaps backward" if ddp else "DeepSpeed comms logger"),
        figure("step time", 1000 * step_s, "ms", None, "mean after the first 20% of steps"),
        figure("throughput", B / step_s, "samples/s", None, f"global batch {B}"),
        figure("final loss", losses[-1], "nats"),
        figure("test accuracy", 100 * test_acc, "%", None,
               f"{len(y_test)} reviews gathered by index: {repeats} padding repeats counted once"),
        figure("time to target accuracy", target_time, "s", None,
               f"training time to {T['target_accuracy']:.0%} on {D['eval_samples']} test reviews"
               + ("" if T["eval_every"] else " (set train.eval_every)")),
        figure("memory per rank (max)", max(memory), "MiB", None, "RSS on CPU, allocator peak on GPU"),
    ]
if ddp:  # free DDP's reducer (it holds the hook's futures) while Python is alive: a rare abort at exit otherwise
    del net
    gc.collect()
engine_info = ({"accelerate": {"distributed_type": accelerator.distributed_type.value,
                               "num_processes": accelerator.num_processes}} if accel else {})
ctx.finish(figures, data=data.source, real_data=data.real, engine=engine_name, plots=["loss.png"],
           comms={} if ddp else comms.calls_by_size(), **engine_info,   # DeepSpeed's calls per message size
           evals=evals, losses=losses, memory_mib_per_rank=memory, parameters=encoder.parameters(model))
