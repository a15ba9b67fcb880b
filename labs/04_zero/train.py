"""Lab 04: ZeRO stages 0-3 (and offload) on WikiText-2, memory per rank against the model.

A Llama-shaped model (or your own: --set model.hf=FOLDER, a Hugging Face causal LM) trains on
WikiText-2 with DeepSpeed. Once, in the middle of a step
(after a micro-batch's backward, while gradients accumulate), every rank counts its live
tensors by role: parameters, gradients, the optimizer's fp32 master copy, Adam's moments,
and the rest. The table puts that beside the ZeRO paper's prediction for this stage:
each stage partitions one more kind of state across the N ranks. The run also reports
loss, validation perplexity, tokens/s, MFU and the bytes each collective moves.

    plscale lab run zero2 --gpus 2                  (zero0 .. zero3, zero2-offload, zero3-offload)
    plscale lab run zero --sweep                    (stages 0-3 in turn, then the charts)
    deepspeed --num_gpus 2 labs/04_zero/train.py --variant zero3      (DS_ACCELERATOR=cpu without GPUs)
    torchrun --nproc_per_node 2 labs/04_zero/train.py --variant zero1
"""

import contextlib
import math
import time
from dataclasses import asdict

import deepspeed
import torch
import torch.distributed as dist

from plscale.predict import memory
from plscale.predict.memory import LABELS, MODEL_STATES
from plscale.predict.units import MiB
from plscale.rank import comms, runtime
from plscale.rank.against_prediction import largest_error, memory_table, mib_figure, per_rank, within
from plscale.rank.distributed import gathered
from plscale.rank.census import census, saved_activations, zero_states
from plscale.rank.data import wikitext
from plscale.rank.memory import per_rank_mib
from plscale.rank.metrics import figure
from plscale.rank.models import chosen
from plscale.rank.utilization import Utilization

ctx = runtime.start(__file__)
S, ds, dev, N = ctx.settings, ctx.ds_config, ctx.device, ctx.world_size
steps, seq = S["train"]["steps"], S["model"]["seq"]
micro, accum = ds["train_micro_batch_size_per_gpu"], ds["gradient_accumulation_steps"]
tokens_per_step = micro * accum * N * seq

# ---- Data: WikiText-2, tokenized, packed into blocks; each rank reads its shard ----------
corpus = wikitext.load_text()
tokens, config, make, about = chosen.model(S, corpus)   # plscale's Llama, or model.hf: a Hugging Face model
train_blocks, val_blocks = wikitext.pack(tokens.train, seq), wikitext.pack(tokens.valid, seq)
shards = wikitext.Shards(train_blocks, micro, accum, ctx.rank, N, S["seed"])
ctx.log(f"data: {corpus.source}\n      {len(tokens.train):,} training tokens in {len(train_blocks):,} blocks "
        f"of {seq}; tokenizer: {tokens.tokenizer}")

# ---- Model, and what the memory model predicts it needs per rank ----------------------
model = make()
# The same question `plscale estimate memory` answers, read from this run's DeepSpeed config.
setup = memory.setup_from_ds_config(ds, N, config, seq)
prediction = memory.estimate(setup)
predicted = {t.name: t.total for t in prediction.terms} | {"model_states": prediction.model_states}
if S["model"]["hf"]:   # the activation count is plscale's Llama's; another model's modules keep their own
    del predicted["activations"]
psi, stage = setup.params, setup.stage
assert psi == sum(p.numel() for p in model.parameters())
ctx.log(f"model: {about}, Ψ = {psi:,} parameters ({psi * 4 / MiB:.1f} MiB in fp32); "
        f"ZeRO-{stage}{' + optimizer offload' if setup.offload_optimizer else ''}"
        f"{' + parameter offload' if setup.offload_param else ''} on {N} ranks, {setup.precision}")

engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=ds)
util = Utilization(ctx, config, seq, tokens_per_step, S["ds"]["precision"])  # the matmuls' peak, measured once

# ---- Training; the census in the middle of step `census_step` -------------------------
# The comms logger waits for every collective to finish (on GPUs too): it logs the first fifth
# of the steps only, and those and the census step are left out of the throughput.
census_step, logged = min(S["memory"]["census_step"], steps - 1), max(1, steps // 5)
comm_before, losses, times, measured, act_bytes = comms.snapshot(), [], [], {}, 0
for step in range(steps):
    t0 = time.perf_counter()
    loss_sum = torch.zeros((), device=dev)
    for i, block in enumerate(shards.step(step)):
        block, census_now = block.to(dev), step == census_step and i == 0
        with saved_activations() if census_now else contextlib.nullcontext() as acts:
            loss = engine(block[:, :-1], block[:, 1:])
        engine.backward(loss)
        if census_now:  # optimizer states exist (after step 0); gradients are live
            act_bytes, measured = acts.bytes, census(zero_states(engine))
            if dev.type == "cuda":
                measured["allocated"] = torch.cuda.memory_allocated(dev)
        engine.step()
        loss_sum += loss.detach().float()
    dist.all_reduce(loss_sum)
    losses.append(loss_sum.item() / (N * accum))
    times.append(time.perf_counter() - t0)
    ctx.metrics.step(step=step, loss=losses[-1], step_time_s=times[-1], **util.of_step(times[-1]))
    ctx.metrics.progress(f"ZeRO-{stage}", step + 1, steps, f"loss {losses[-1]:.4f}")
    if step + 1 == logged:
        comm_per_step = comms.per_step(comm_before, comms.stop(), logged)  # {op: Traffic}, scalars left out
timed = times[max(logged, census_step + 1):] or times[-1:]

# ---- Validation perplexity: every rank runs the same number of forwards (ZeRO-3 gathers) --
engine.eval()
usable = min(S["data"]["val_blocks"], len(val_blocks)) // (N * micro) * (N * micro)
val_sum = torch.zeros(2, device=dev, dtype=torch.float64)
with torch.no_grad():
    for block in wikitext.eval_shard(val_blocks, ctx.rank, N, usable).split(micro):
        block = block.to(dev)
        val_sum += torch.tensor([engine(block[:, :-1], block[:, 1:]).item() * block.numel(), block.numel()],
                                device=dev, dtype=torch.float64)
dist.all_reduce(val_sum)
val_ppl = math.exp(val_sum[0].item() / max(val_sum[1].item(), 1))

# ---- Memory per rank: measured beside predicted ---------------------------------------
measured["activations"] = act_bytes
everyone = gathered(measured)
rss = per_rank_mib(dev)

figures, by_term = [], {}
if ctx.is_main:
    # buffers, other: measured, not predicted; activations: saved for backward, one micro-batch
    rows = per_rank(everyone, (*MODEL_STATES, "model_states", "buffers", "other", "activations",
                               *(("allocated",) if dev.type == "cuda" else ())))
    # ZeRO-1/2's gradient partitions hold whole tensors, so ranks differ: each rank has its own prediction
    want = {t.name: list(t.by_rank or (t.total,) * N) for t in prediction.terms if t.name in MODEL_STATES}
    want["model_states"] = [sum(w[r] for w in want.values()) for r in range(N)]
    pairs = lambda names: [(v, w) for name in names for v, w in zip(rows[name], want[name]) if w]
    uneven = [t.name for t in prediction.terms if t.by_rank]
    uneven += ["model_states"] * bool(uneven)  # shown below the table, rank by rank
    ctx.log(f"\nmemory per rank, MiB (census after the backward of step {census_step}'s first micro-batch)")
    by_term, figures = memory_table(ctx.log, rows, {k: v for k, v in predicted.items() if k not in uneven})
    for name in uneven:
        error = largest_error(pairs([name]))
        ctx.log(f"  {LABELS[name] + ', predicted by rank':34}" + "".join(f"{w / MiB:10.2f}" for w in want[name])
                + f"{'':11}{100 * error:8.1f}%")
        by_term[name]["predicted_bytes"] = predicted[name]  # the largest rank's
        figures.append(mib_figure(f"{LABELS[name]} per rank (max)", max(rows[name]), predicted[name],
                                  f"each rank against its own: error {100 * error:.1f}%"))
    for name in want:
        by_term[name]["predicted_by_rank"] = want[name]
    ctx.check(*within("model states match the ZeRO model", pairs(["model_states"]), S["memory"]["tolerance"]))
    ctx.check(*within("each model state matches the model on each rank", pairs(MODEL_STATES),
                      S["memory"]["term_tolerance"]))

    logger_on = ds.get("comms_logger", {}).get("enabled")
    ctx.log(f"\nper step, by collective (DeepSpeed comms logger, first {logged} steps):" if logger_on else
            "\n(comms logger off: set ds.comms_logger=true for bytes per collective)")
    for op, traffic in sorted(comm_per_step.items()):
        ctx.log(f"  {op:28}{traffic.bytes / MiB:10.2f} MiB{traffic.calls:9.3g} calls")
    figures += [figure("final loss", round(losses[-1], 4), "nats"),
                figure("validation perplexity", round(val_ppl, 2), "", None, f"{usable} blocks of {seq} tokens"),
                figure("communication per step", round(sum(t.bytes for t in comm_per_step.values()) / MiB, 3), "MiB",
                       None, f"all collectives, as logged by rank 0 over the first {logged} steps"),
                figure("resident memory per rank (max)", max(rss), "MiB", None, "RSS on CPU, allocator peak on GPU"),
                *util.figures(timed)]
ctx.finish(figures, data=corpus.source, real_data=corpus.real, tokenizer=tokens.tokenizer, params=psi,
           preset=S["model"]["preset"], hf=S["model"]["hf"], model=config.to_dict(),
           seq=seq, micro_batch=micro, grad_accum=accum,
           stage=stage, offload_optimizer=setup.offload_optimizer, offload_param=setup.offload_param,
           precision=setup.precision, memory=by_term, census_step=census_step,
           comms_per_step={op: asdict(t) for op, t in comm_per_step.items()},
           losses=losses, val_perplexity=val_ppl, tokens_per_step=tokens_per_step)
