"""Lab 12: a distributed run broken on purpose, one way per variant, and the tools that say why.

The run is data parallelism by hand on MNIST, so that every collective is on this page: each
rank computes its shard's gradient, all-reduces it as one flat bucket and steps; each step
also all-reduces the loss for the log. One rank (debug.rank, the last by default) misbehaves:

    healthy               nothing broken: the baseline
    skip-collective-hang  at step debug.step it skips the step ("its batch was empty"). No
                          collective fails there: gloo and NCCL pair collectives by their order,
                          so from then on its all-reduces meet the others' next ones, and the run
                          hangs at the end, where the counts differ. The timeout (dist.timeout_s)
                          ends it; the Flight Recorder and every rank's stack name the rank
    mismatch              it froze its first layer: its bucket is smaller. Under
                          TORCH_DISTRIBUTED_DEBUG=DETAIL (dist.debug) torch checks each
                          collective's shapes across ranks first and names both
    straggler             it sleeps debug.slow_ms in each forward: the others wait for it in the
                          all-reduce; "ranks keep pace" names it, and --profile shows it
    nan                   its batch at step debug.step holds a corrupted image: the check before
                          the all-reduce names the rank and step, and no weight turns NaN

    plscale lab run hang --gpus 2            (and mismatch, straggler, nan, healthy)
    torchrun --nproc_per_node 2 labs/12_debug/debug.py --variant straggler
"""

import time

import torch
import torch.distributed as dist
import torch.nn.functional as F

from plscale.charts.pace import pace_chart
from plscale.rank import runtime
from plscale.rank.data import mnist
from plscale.rank.distributed import gathered
from plscale.rank.finite import nonfinite, ranks_with_nonfinite
from plscale.rank.metrics import figure
from plscale.rank.models.mlp import images_to_tensor, mlp

ctx = runtime.start(__file__)
S, dev, N, variant = ctx.settings, ctx.device, ctx.world_size, ctx.variant
T, D = S["train"], S["debug"]
guilty = D["rank"] % N            # -1: the last rank
me_guilty = ctx.rank == guilty
micro, steps = T["micro_batch"], T["steps"]

# ---- Data: each rank its own micro-batch of MNIST per step ---------------------------------
data = mnist.load()
ctx.log(f"data: {data.source}")
x_train, y_train = images_to_tensor(data.train.images, dev), torch.as_tensor(data.train.labels, device=dev)
order = torch.randperm(len(y_train), generator=torch.Generator().manual_seed(S["seed"])).to(dev)


def batch(step: int):
    """This rank's shard of step `step`'s global batch: rows rank*micro .. (rank+1)*micro."""
    start = ((step - 1) * micro * N + ctx.rank * micro) % (len(order) - micro)
    rows = order[start:start + micro]
    return x_train[rows].clone(), y_train[rows], rows


# ---- The model: the same weights on every rank -----------------------------------------------
torch.manual_seed(S["seed"])
model = mlp(**S["model"]).to(dev)
if variant == "mismatch" and me_guilty:
    model[1].weight.requires_grad_(False)  # a frozen layer on one rank only: its bucket lacks that gradient
trainable = [p for p in model.parameters() if p.requires_grad]
optimizer = torch.optim.AdamW(trainable, lr=T["lr"])
ctx.log(f"model: an MLP, {sum(p.numel() for p in model.parameters()):,} parameters; {N} ranks over {ctx.backend}, "
        f"{micro} images each per step; rank {guilty} misbehaves ({variant}); collectives time out after "
        f"{S['dist']['timeout_s']:g} s" + (f", TORCH_DISTRIBUTED_DEBUG={S['dist']['debug']}" if S["dist"]["debug"] else ""))


def all_reduce_gradients() -> None:
    """One flat bucket of every trainable gradient, summed over the ranks, then averaged."""
    flat = torch.cat([p.grad.reshape(-1) for p in trainable])
    dist.all_reduce(flat)
    flat /= N
    offset = 0
    for p in trainable:
        p.grad.copy_(flat[offset:offset + p.numel()].view_as(p))
        offset += p.numel()


# ---- The loop ------------------------------------------------------------------------------
computed, waited, caught = [], [], None
for step in range(1, steps + 1):
    x, y, rows = batch(step)
    if variant == "nan" and me_guilty and step == D["step"]:
        x[3, 10:14, 10:14] = float("nan")  # sample 3 of this batch: a corrupted image, a few pixels NaN
    if variant == "skip-collective-hang" and me_guilty and step == D["step"]:
        print(f"rank {ctx.rank}: step {step}: my batch was empty, skipping the step", flush=True)
        continue  # the bug: a rank-local reason to skip a step (and the collectives inside it)

    start = time.perf_counter()
    if variant == "straggler" and me_guilty:
        time.sleep(D["slow_ms"] / 1000)  # a slow rank: a throttled GPU, a busy host, a slow data loader
    loss = F.cross_entropy(model(x), y)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    computed.append(time.perf_counter() - start)
    start = time.perf_counter()  # from here to the averaged gradient: waiting for the others (and the wire)

    if D["check_finite"]:  # before the all-reduce: afterwards every rank's gradient holds the NaN
        bad = ranks_with_nonfinite(loss.detach(), *(p.grad for p in trainable))
        if bad:
            samples = (~torch.isfinite(x)).flatten(1).any(1).nonzero().flatten()
            found = gathered(rows[samples].tolist())  # the rank holding the bad data names its rows
            where = "; ".join(f"rank {r}: {n:,} NaN or inf values" + (f", from dataset rows {found[r]} of its batch"
                                                                      if found[r] else "") for r, n in sorted(bad.items()))
            caught = {"step": step, "ranks": sorted(bad), "detail": where}
            break  # every rank saw the same verdict: they stop together, the step not taken
    all_reduce_gradients()
    waited.append(time.perf_counter() - start)
    optimizer.step()
    mean_loss = loss.detach().clone()
    dist.all_reduce(mean_loss)
    ctx.metrics.step(step=step, loss=mean_loss.item() / N, compute_s=computed[-1], wait_s=waited[-1])
    ctx.metrics.progress("train", step, steps, f"loss {mean_loss.item() / N:.3f}")

# ---- What each rank measured, side by side ------------------------------------------------
dist.barrier()  # every rank done training; a rank that skipped collectives arrives here early, and waits
weights_finite = nonfinite(*model.parameters()) == 0
flat_weights = torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def typical(times: list) -> float:
    """The median step, step 1 (the warm-up) left out: one slow step is noise, every step slow is a straggler."""
    times = sorted(times[1:] or times)
    return times[len(times) // 2] if times else 0.0


rows_per_rank = gathered({"compute": typical(computed), "wait": typical(waited),
                          "weights": flat_weights, "finite": weights_finite})
if caught:
    ctx.check("gradients finite before the all-reduce", False,
              f"step {caught['step']}: {caught['detail']}; the step was not taken, the run stops here")
elif D["check_finite"]:
    ctx.check("gradients finite before the all-reduce", True, f"every rank, all {steps} steps")
ctx.check("weights finite on every rank", all(r["finite"] for r in rows_per_rank),
          "no NaN reached the weights" if all(r["finite"] for r in rows_per_rank) else "a NaN reached the weights")
same = all(torch.allclose(r["weights"], rows_per_rank[0]["weights"], rtol=0, atol=0, equal_nan=True)  # exact; NaN = NaN
           for r in rows_per_rank)
ctx.check("replicas identical", same, "every rank holds the same weights" if same else
          "the ranks' weights differ: they stepped with different gradients")

compute_ms = [1000 * r["compute"] for r in rows_per_rank]
wait_ms = [1000 * r["wait"] for r in rows_per_rank]
slowest = max(range(N), key=lambda r: compute_ms[r])
others = sorted(c for r, c in enumerate(compute_ms) if r != slowest) or compute_ms
median = others[len(others) // 2]  # the others' median: what the slowest is measured against
ratio = compute_ms[slowest] / median if median else 1.0
others_wait = sum(w for r, w in enumerate(wait_ms) if r != slowest) / max(1, N - 1)
ctx.log("\nper rank, per step:   compute (forward + backward)   wait for the averaged gradient")
for r in range(N):
    ctx.log(f"  rank {r}:{compute_ms[r]:16.1f} ms{wait_ms[r]:27.1f} ms" + ("   <- slowest" if r == slowest else ""))
lagging = ratio > D["pace"] and N > 1
ctx.check("ranks keep pace", not lagging,
          f"the slowest, rank {slowest}, computes {ratio:.2f}x the others' median "
          f"({compute_ms[slowest]:.1f} against {median:.1f} ms per step); the others wait {others_wait:.1f} ms per step for it "
          f"(limit {D['pace']:g}x: debug.pace)")
if ctx.is_main:
    pace_chart(ctx.run_dir / "pace.png", compute_ms, wait_ms, f"{variant}: where each rank's step goes "
               f"({N} ranks, {ctx.backend})")
figures = [figure("compute per step, slowest rank", round(compute_ms[slowest], 2), "ms"),
           figure("compute per step, the others' median", round(median, 2), "ms"),
           figure("others' wait for the averaged gradient", round(others_wait, 2), "ms")]
if lagging:  # which rank is the slowest is a figure only when one lags
    figures.insert(0, figure("slowest rank", slowest, "", note=f"computes {ratio:.2f}x the others' median"))
if caught:
    figures.append(figure("non-finite gradient", caught["ranks"][0], "rank", note=f"step {caught['step']}"))
ctx.finish(figures, data=data.source, real_data=data.real, plots=["pace.png"])
