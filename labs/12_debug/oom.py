"""Lab 12, out of memory on purpose: the memory model says a step will not fit, the allocator agrees, and the fixes.

Each rank may allocate oom.limit_mib MiB once its data is loaded (plscale/rank/memory_limit.py: a
GPU's memory, made small on purpose; on CPU the process's data limit). The run trains plscale's
Llama on WikiText-2 with data parallelism by hand, a whole replica on each rank, its gradients
all-reduced tensor by tensor. Before the model is built, the memory model
(plscale/predict/step_memory.py) gives the step's peak on each rank, term by term, for this run and
for each of the usual fixes:

    oom               micro-batch 6, every activation kept: more than the limit; the first step
                      passes, the second fails (Adam's moments arrive at the first step)
    oom-micro-batch   micro-batch 1, six accumulated: the same global batch, a sixth of the activations
    oom-recompute     full recomputation: each layer keeps its input only, and runs again in the backward
    oom-fsdp2         the states sharded over the ranks (FSDP2, ZeRO-3's memory)
    oom-offload       the optimizer (its fp32 copy of the weights, its moments) in host memory: a
                      CPU rank's host is an anonymous shared mapping, which the limit does not count

A run that fits records its last step with the allocator's history (plscale/rank/allocations.py),
the limit lifted for the profiler's own buffers, and checks the step's peak against the model's.

    plscale lab run oom --gpus 2            (oom-micro-batch, oom-recompute, oom-fsdp2, oom-offload)
    torchrun --nproc_per_node 2 labs/12_debug/oom.py --variant oom-fsdp2
"""

import time

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

from plscale.charts.step_memory import fixes_chart
from plscale.predict import step_memory
from plscale.predict.presets import preset
from plscale.predict.units import MiB
from plscale.rank import allocations, memory_limit, runtime
from plscale.rank.against_prediction import mib_figure, within
from plscale.rank.data import wikitext
from plscale.rank.distributed import gathered
from plscale.rank.metrics import figure
from plscale.rank.models.llama import Llama
from plscale.rank.utilization import Utilization
from plscale.strategies.fsdp import fully_shard
from plscale.strategies.recompute import llama as recompute

ctx = runtime.start(__file__)
S, dev, N = ctx.settings, ctx.device, ctx.world_size
O, steps = S["oom"], S["train"]["steps"]
micro, accum, limit = O["micro_batch"], O["grad_accum"], O["limit_mib"]

# ---- Data: WikiText-2 in blocks of seq tokens, each rank its own micro-batches ------------------
corpus = wikitext.load_text()
tokens = wikitext.tokenize(corpus, preset(O["model"]).vocab)
config = preset(O["model"]).with_vocab(tokens.vocab)
shards = wikitext.Shards(wikitext.pack(tokens.train, O["seq"]), micro, accum, ctx.rank, N, S["seed"])
ctx.log(f"data: {corpus.source}")

# ---- The memory model first: this step's peak on each rank, and each fix's ---------------------
step = step_memory.Step(config, O["seq"], micro, N, accum, O["recompute"], O["fsdp2"], O["offload"])
want = step_memory.peak(step)
ctx.log(f"model: Llama-shaped {O['model']!r}, {config.layers} layers, seq {O['seq']}; micro-batch {micro} x {accum} "
        f"accumulated on each of {N} ranks; recomputation {O['recompute']}; "
        f"{'states sharded by FSDP2' if O['fsdp2'] else 'a whole replica on each rank'}"
        f"{', its optimizer on the host' if O['offload'] else ''}\n"
        f"the memory model's peak per rank, MiB (plscale/predict/step_memory.py), against the limit of {limit:g} MiB:")
rows = {}
for name, s in {"this run": step, **step_memory.fixes(step)}.items():
    if s == step and name != "this run":
        continue   # a fix this run has already
    p = step_memory.peak(s)
    rows[name] = ({k: v / MiB for k, v in p.terms.items()}, p.host / MiB)
    terms = " + ".join(f"{k} {v / MiB:.1f}" for k, v in p.terms.items())
    verdict = "fits" if p.fits(limit) else "does NOT fit"
    if p.host:   # offload: the device's part against the limit, the states beside it
        verdict = f"{verdict} on the device, + {p.host / MiB:.1f} on the host"
        verdict += " (a CPU rank's host: shared memory, outside the limit)" if dev.type == "cpu" else ""
    ctx.log(f"  {name:34} {p.device / MiB:7.1f} = {terms}   {verdict}")
if ctx.is_main:
    fixes_chart(ctx.run_dir / "memory_fixes.png", rows, limit, f"{ctx.variant}: the step's peak per rank, "
                f"predicted, and each fix's ({N} ranks)")
if not want.fits(limit):
    ctx.log(f"the model says this run will not fit ({want.device / MiB:.1f} > {limit:g} MiB): running it anyway, "
            f"to see how it fails")

# ---- The limit, then the model and its optimizer under it -----------------------------------------
mesh = init_device_mesh(dev.type, (N,)) if O["fsdp2"] else None
util = Utilization(ctx, config, O["seq"], micro * accum * N * O["seq"], "fp32", O["recompute"])  # its peak: before
budget = memory_limit.impose(dev, limit)
torch.manual_seed(S["seed"])
if O["fsdp2"]:  # shards only: built on the meta device, then each rank's shards initialised
    with torch.device("meta"):
        model = recompute.apply(Llama(config), O["recompute"])
    model = fully_shard.shard(model, mesh, reshard=True).to_empty(device=dev)
    model.reset_parameters()
else:
    model = recompute.apply(Llama(config).to(dev), O["recompute"])
params = stepped = list(model.parameters())
if O["offload"]:   # ZeRO-Offload by hand: the optimizer's fp32 copy of the weights and its moments on the host
    stepped = [budget.host_zeros(p).copy_(p.detach()) for p in params]
    for h in stepped:
        h.grad = budget.host_zeros(h)
# foreach=False: torch's multi-tensor AdamW allocates temporaries of a whole group of tensors at once
opt = torch.optim.AdamW(stepped, lr=O["lr"], foreach=False)
if O["offload"]:   # the moments made on the host now (AdamW would make them in private memory at its first step)
    opt.state.update({h: {"step": torch.tensor(0.0), "exp_avg": budget.host_zeros(h),
                          "exp_avg_sq": budget.host_zeros(h)} for h in stepped})


def local(t: torch.Tensor) -> int:
    t = t.to_local() if hasattr(t, "to_local") else t   # FSDP2's DTensor: this rank's shard
    return t.numel() * t.element_size()


def held() -> float:
    """The states this rank's device holds: parameters, gradients and, unless offloaded, Adam's moments."""
    moments = [] if O["offload"] else [v for state in opt.state.values() for v in state.values() if v.dim()]
    return sum(local(p) + (local(p.grad) if p.grad is not None else 0) for p in params) + sum(map(local, moments))


# ---- Training under the limit; the last step recorded by the allocator ---------------------------
def train(t: int, limit_on: bool = True) -> tuple[float, float | None]:
    """One step: (its loss, the most data the rank held above the limit's level, sampled after each
    forward and the step; None when the limit was off)."""
    loss_sum, used = torch.zeros((), device=dev), 0.0
    for block in shards.step(t):
        block = block.to(dev)
        with allocations.phase("forward"):
            loss = model(block[:, :-1], block[:, 1:])
        used = max(used, budget.used_mib())
        with allocations.phase("backward"):
            (loss / accum).backward()
        loss_sum += loss.detach()
    if not O["fsdp2"]:  # data parallelism by hand: the replicas' gradients averaged, tensor by tensor
        for p in params:
            dist.all_reduce(p.grad)
            p.grad /= N
    with allocations.phase("step"):
        if O["offload"]:   # the gradients to the host, which steps ...
            for p, h in zip(params, stepped):
                h.grad.copy_(p.grad)
        opt.step()
        if O["offload"]:   # ... and the new weights back
            for p, h in zip(params, stepped):
                p.detach().copy_(h)
    for p in params:
        p.grad.zero_()   # zeroed, not freed: the gradients are held at their peak all along
    used = max(used, budget.used_mib())
    dist.all_reduce(loss_sum)
    return loss_sum.item() / (N * accum), used if limit_on else None


recorded, uses, times = steps - 1, [], []   # the last step: the steps before it ran under the limit, moments and all
for t in range(steps):
    start = time.perf_counter()
    if t == recorded:    # the limit lifted: the profiler's own buffers are not the model's
        level = held()   # the states; the history counts from here
        with budget.lifted(), allocations.record(dev) as rec:
            loss, used = train(t, limit_on=False)
    else:
        loss, used = train(t)
        uses.append(used)
    times.append(time.perf_counter() - start)
    ctx.metrics.step(step=t, loss=loss, data_mib=None if used is None else round(used, 1), step_time_s=times[-1],
                     **util.of_step(times[-1]))
    ctx.metrics.progress("train", t + 1, steps, f"loss {loss:.3f}" + (f", {used:.0f} of {limit:g} MiB sampled"
                                                                         if used is not None else ", the limit lifted"))
budget.release()

# ---- It fitted: what each rank measured against the model -----------------------------------------
everyone = gathered({"peak": level + rec.history.peak(), "used": max(uses)})
peaks, uses = [r["peak"] for r in everyone], [r["used"] for r in everyone]
ctx.log(f"\nstep {recorded}'s peak per rank, MiB (states {level / MiB:.1f} + the allocator's history's highest), and the "
        f"most data the rank held above the limit's level in the steps before (sampled after each forward and step):")
for r in range(N):
    ctx.log(f"  rank {r}: tensors {peaks[r] / MiB:7.1f} (model {want.device / MiB:.1f})   data {uses[r]:7.1f} of {limit:g}")
ctx.check("the memory model said it would fit", want.fits(limit),
          f"predicted {want.device / MiB:.1f} MiB against {limit:g}")
ctx.check(*within("the step's peak matches the memory model, every rank", [(p, want.device) for p in peaks], 0.02))
ctx.finish([mib_figure("step's peak per rank", max(peaks), want.device, "tensors: states + the allocator's history"),
            figure("data used per rank", round(max(uses), 1), "MiB", None, f"of the {limit:g} MiB limit"),
            figure("final loss", round(loss, 4), "nats"),
            *util.figures(times[1:recorded] or times)],   # neither the first step nor the recorded one
           data=corpus.source, real_data=corpus.real, tokenizer=tokens.tokenizer, model=config.to_dict(),
           limit_mib=limit, predicted_terms={k: v / MiB for k, v in want.terms.items()}, plots=["memory_fixes.png"])
