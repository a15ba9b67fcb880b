"""Lab 04, PyTorch's way: the same model, weights and batches sharded by FSDP2 (`fully_shard`).

ZeRO-3 by another hand. Each decoder layer is one FSDP2 group, the embedding, tied head and norm
the root's; every rank keeps a 1/N slice of each tensor (a DTensor sharded on dim 0), gathers a
group's parameters just before its forward and backward, and reduce-scatters its gradients just
after. With fsdp.reshard false the gathered parameters stay until the backward (ZeRO-2's memory
in the step, half the all-gathers); with fsdp.replicate R the ranks form an R x N/R mesh: HSDP.
The model starts on the meta device (shapes, no memory) and each rank fills only its shards from
rank 0's full weights. The run checks every step's loss against the dense model on one rank,
the shards against the eager model's, each rank's model states and one step's collectives
against plscale/predict/fsdp.py. Beside it, `plscale lab run zero3` trains the same (README).

    plscale lab run fsdp2 --gpus 2          (fsdp2-no-reshard, hsdp on 4, fsdp2-bf16)
    torchrun --nproc_per_node 2 labs/04_zero/fsdp2.py --variant fsdp2
"""

import contextlib
import statistics
import time

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

from plscale.predict import fsdp as predict
from plscale.predict.memory import MODEL_STATES
from plscale.predict.presets import param_count
from plscale.predict.units import MiB
from plscale.rank import runtime
from plscale.rank.against_dense import follows, largest_gap, reference_losses, step_by_step
from plscale.rank.against_prediction import memory_table, per_rank, per_rank_counts, within
from plscale.rank.data import wikitext
from plscale.rank.dispatched import counting
from plscale.rank.distributed import gathered
from plscale.rank.metrics import figure
from plscale.rank.models import chosen
from plscale.rank.optim import optimizer
from plscale.rank.tally import Tally
from plscale.rank.utilization import Utilization
from plscale.strategies.fsdp import census, fully_shard

ctx = runtime.start(__file__)
S, ds, dev, N = ctx.settings, ctx.ds_config, ctx.device, ctx.world_size
steps, seq, seed = S["train"]["steps"], S["model"]["seq"], S["seed"]
micro, accum = ds["train_micro_batch_size_per_gpu"], ds["gradient_accumulation_steps"]
reshard, R, precision = S["fsdp"]["reshard"], S["fsdp"]["replicate"], S["ds"]["precision"]
tokens_per_step, clip = micro * accum * N * seq, ds.get("gradient_clipping", 0)

# ---- Data: WikiText-2 as lab 04's ZeRO runs read it: the same blocks, the same shards ---------
corpus = wikitext.load_text()
tokens, config, make, about = chosen.model(S, corpus)   # plscale's Llama, or model.hf: a Hugging Face model
train_blocks = wikitext.pack(tokens.train, seq)
shards = [wikitext.Shards(train_blocks, micro, accum, r, N, seed) for r in range(N)]  # every rank's, for the parity
ctx.log(f"data: {corpus.source}\n      {len(train_blocks):,} blocks of {seq} tokens; tokenizer: {tokens.tokenizer}")

# ---- The mesh, and the model built on the meta device, then filled shard by shard --------------
mesh = init_device_mesh(dev.type, (R, N // R), mesh_dim_names=("replicate", "shard")) if R > 1 \
    else init_device_mesh(dev.type, (N,), mesh_dim_names=("shard",))
eager = make()   # the weights lab 04's ZeRO runs start from (same seed); rank 0's are broadcast
model = fully_shard.on_meta(make, mesh, reshard, mixed=precision == "bf16", device=dev, compile=S["fsdp"]["compile"])
fully_shard.load_full(model, eager.state_dict(), dict(eager.named_buffers()))
same = all(torch.equal(p.full_tensor().cpu(), eager.state_dict()[name]) for name, p in model.state_dict().items())
ctx.check("the model built on meta and filled from rank 0 equals the eager model", all(gathered(same)),
          "every parameter, gathered whole, bit for bit on every rank")
psi, held = param_count(config), census.states(model)["parameters"]
compiled = ", each layer torch.compile'd (the first step compiles)" if S["fsdp"]["compile"] else ""
ctx.log(f"model: {about}, Ψ = {psi:,} parameters ({4 * psi / MiB:.2f} MiB fp32); "
        f"mesh {dict(zip(mesh.mesh_dim_names, mesh.shape))}, {config.layers + 1} FSDP2 groups, reshard after forward "
        f"{reshard}, {'bf16 compute, fp32 reduction' if precision == 'bf16' else 'fp32'}"
        f"{compiled}\n"
        f"  after to_empty this rank holds {held / MiB:.3f} MiB of parameters (the whole model: {4 * psi / MiB:.3f})")
opt = optimizer(model.parameters(), ds)   # torch's AdamW with the run's values, on the shards
util = Utilization(ctx, config, seq, tokens_per_step, precision)   # MFU's peak, measured once a machine

# ---- Training; one step's collectives counted as torch dispatches them, and two censuses -------
census_step = min(S["memory"]["census_step"], steps - 1)
losses, times, tally, measured = [], [], Tally(), {}
for step in range(steps):
    t0, loss_sum, counted = time.perf_counter(), torch.zeros((), device=dev), step == census_step
    for i, block in enumerate(shards[ctx.rank].step(step)):
        block = block.to(dev)
        with counting(tally, "forward") if counted else contextlib.nullcontext():
            loss = model(block[:, :-1], block[:, 1:])
        if counted and i == 0:   # between forward and backward: the gathered parameters, where kept
            measured["forward"] = census.states(model, opt)["parameters"]
        with counting(tally, "backward") if counted else contextlib.nullcontext():
            (loss / accum).backward()
        if counted and i == 0:   # after the backward: lab 04's census point, gradients accumulating
            measured |= census.states(model, opt)
        loss_sum += loss.detach().float()
    if clip:   # DeepSpeed's clipping: the global norm over every rank's shards (one all-reduce of DTensors)
        torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
    opt.step()
    opt.zero_grad()
    dist.all_reduce(loss_sum)
    losses.append(loss_sum.item() / (N * accum))
    times.append(time.perf_counter() - t0)
    ctx.metrics.step(step=step, loss=losses[-1], step_time_s=times[-1], **util.of_step(times[-1]))
    ctx.metrics.progress(f"FSDP2{'' if reshard else ', no reshard'}{f', HSDP {R} x {N // R}' if R > 1 else ''}",
                         step + 1, steps, f"loss {losses[-1]:.4f}")

# ---- Memory per rank and the step's collectives, against plscale/predict/fsdp.py ----------------
want = predict.states(config, N, R, precision=precision)
want["model_states"] = sum(want[k] for k in MODEL_STATES)
gathered_want = predict.states(config, N, R, gathered=not reshard, precision=precision)["parameters"]
sent_want = predict.collectives(config, N, accum, reshard, R, precision)
everyone = gathered((measured, tally.rows()))
figures = []
if ctx.is_main:
    rows = per_rank([m for m, _ in everyone], (*MODEL_STATES, "model_states"))
    ctx.log(f"\nmodel states per rank, MiB (after the backward of step {census_step}'s first micro-batch)")
    by_term, figures = memory_table(ctx.log, rows, want)
    ctx.check(*within("model states match the FSDP2 model, every term, every rank",
                      [(v, want[k]) for k in rows if want[k] for v in rows[k]], S["memory"]["term_tolerance"]))
    between = [m["forward"] for m, _ in everyone]
    ctx.log("parameters between forward and backward, MiB, measured/predicted: "
            + ", ".join(f"r{r} {b / MiB:.3f}/{gathered_want / MiB:.3f}" for r, b in enumerate(between))
            + ("" if reshard else "   (the gathered whole kept for the backward)"))
    ctx.check(*within("parameters held between forward and backward as predicted", [(b, gathered_want)
                                                                                   for b in between], 0.02))
    ctx.log(f"\ncollectives of step {census_step} by op and phase: calls and MiB, measured/predicted")
    ctx.check(*per_rank_counts(ctx.log, "FSDP2's collectives per step as predicted, every rank",
                               [(got, sent_want) for _, got in everyone]))

# ---- Parity: the loss, step by step, against the dense model on every rank's batches -----------
parity = min(S["fsdp"]["parity_steps"], steps)
if ctx.is_main:
    reference = make().to(dev)
    reference.load_state_dict(eager.state_dict())
    batches = lambda step: [(b[:, :-1].to(dev), b[:, 1:].to(dev)) for s in shards for b in s.step(step)]
    dense = reference_losses(reference, ds, batches, parity, clip=True)
    gap = largest_gap(losses, dense)
    ctx.log(f"\nloss, FSDP2 vs the dense model (one rank, every rank's batches): {step_by_step(losses, dense)}")
    tolerance = 2 ** -9 if precision == "bf16" else None   # bf16 compute against fp32: within bf16's unit roundoff
    ctx.check(*(follows("FSDP2 follows the dense model's loss", losses, dense, tolerance) if tolerance
                else follows("FSDP2 follows the dense model's loss", losses, dense)))
    timed = [t for i, t in enumerate(times) if i not in (0, census_step)] or times   # the census counts calls
    figures += [figure("final loss", round(losses[-1], 4), "nats"),
                figure("largest loss gap", float(f"{gap:.3g}"), "relative", None, f"against the dense model, {parity} "
                       f"steps"),
                figure("step time", round(statistics.median(timed), 4), "s", None,
                       "median, without the first and the counted step"),
                figure("first step", round(times[0], 3), "s", None, "torch.compile's compilation included"
                       if S["fsdp"]["compile"] else "eager"),
                *util.figures(timed)]
    ctx.log("\nbeside it: plscale lab run zero3 with the same --gpus and --set: the same weights and batches")
ctx.finish(figures, data=corpus.source, real_data=corpus.real, tokenizer=tokens.tokenizer, params=psi,
           preset=S["model"]["preset"], hf=S["model"]["hf"], model=config.to_dict(),
           seq=seq, micro_batch=micro, grad_accum=accum,
           engine="fsdp2", reshard=reshard, replicate=R, precision=precision, losses=losses,
           memory=by_term if ctx.is_main else {}, tokens_per_step=tokens_per_step)
