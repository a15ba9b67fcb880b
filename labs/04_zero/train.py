"""Lab 04: ZeRO stages 0-3 (and offload) on WikiText-2, memory per rank against the model.

A Llama-shaped model trains on WikiText-2 with DeepSpeed. Once, in the middle of a step
(after a micro-batch's backward, while gradients accumulate), every rank counts its live
tensors by role: parameters, gradients, the optimizer's fp32 master copy, Adam's moments,
and the rest. The table puts that beside the ZeRO paper's prediction for this stage:
each stage partitions one more kind of state across the N ranks. The run also reports
loss, validation perplexity, tokens/s (MFU on GPUs) and the bytes each collective moves.

    plscale lab run zero2 --gpus 2                  (zero0 .. zero3, zero2-offload, zero3-offload)
    plscale lab run zero --sweep                    (stages 0-3 in turn, then the charts)
    deepspeed --num_gpus 2 labs/04_zero/train.py --variant zero3      (DS_ACCELERATOR=cpu without GPUs)
    torchrun --nproc_per_node 2 labs/04_zero/train.py --variant zero1
"""

import contextlib
import math
import time

import deepspeed
import torch
import torch.distributed as dist
from deepspeed.comm import comm as ds_comm

from plscale.predict.memory import MODEL_STATES, Setup, estimate
from plscale.predict.presets import flops_per_token, param_count, preset
from plscale.rank import runtime
from plscale.rank.census import census, saved_activations, zero_states
from plscale.rank.data import wikitext
from plscale.rank.memory import per_rank_mib
from plscale.rank.metrics import figure
from plscale.rank.models.llama import Llama

MiB = 2**20
PEAK_BF16_TFLOPS = {"H100": 989, "H200": 989, "A100": 312, "L40S": 362, "A10": 125, "L4": 121, "4090": 165}

ctx = runtime.start(__file__)
S, ds, dev, N = ctx.settings, ctx.ds_config, ctx.device, ctx.world_size
zero = ds["zero_optimization"]
stage, steps, seq = zero["stage"], S["train"]["steps"], S["model"]["seq"]
offload_opt = zero.get("offload_optimizer", {}).get("device", "none") != "none"
offload_param = zero.get("offload_param", {}).get("device", "none") != "none"
precision = "bf16" if ds.get("bf16", {}).get("enabled") else "fp16" if ds.get("fp16", {}).get("enabled") else "fp32"
micro, accum = ds["train_micro_batch_size_per_gpu"], ds["gradient_accumulation_steps"]
tokens_per_step = micro * accum * N * seq

# ---- Data: WikiText-2, tokenized, packed into blocks; each rank reads its shard ----------
corpus = wikitext.load_text()
tokens = wikitext.tokenize(corpus, preset(S["model"]["preset"]).vocab)  # a local BPE of the preset's size
train_blocks, val_blocks = wikitext.pack(tokens.train, seq), wikitext.pack(tokens.valid, seq)
shards = wikitext.Shards(train_blocks, micro, accum, ctx.rank, N, S["seed"])
ctx.log(f"data: {corpus.source}\n      {len(tokens.train):,} training tokens in {len(train_blocks):,} blocks "
        f"of {seq}; tokenizer: {tokens.tokenizer}")

# ---- Model, and what the ZeRO paper predicts it needs per rank ------------------------
config = preset(S["model"]["preset"]).with_vocab(tokens.vocab)
torch.manual_seed(S["seed"])
model = Llama(config)
psi = param_count(config)
assert psi == sum(p.numel() for p in model.parameters())
# With one micro-batch per step DeepSpeed's ZeRO-1 reduces and partitions the gradients
# inside the backward, as ZeRO-2 does; full gradients only live while they accumulate.
grad_stage = 2 if stage == 1 and accum == 1 else stage
setup = dict(params=psi, dp=N, precision=precision, offload_optimizer=offload_opt, offload_param=offload_param,
             model=config, seq=seq, micro_batch=micro)
predicted = {t.name: t.total for t in estimate(Setup(stage=stage, **setup)).terms}
predicted["gradients"] = estimate(Setup(stage=grad_stage, **setup)).term("gradients").total
if offload_opt and accum > 1:  # ZeRO-Offload accumulates micro-batches in a second fp32 partition on the host
    predicted["gradients"] += 4 * psi / N
ctx.log(f"model: Llama-shaped '{S['model']['preset']}', Ψ = {psi:,} parameters ({psi * 4 / MiB:.1f} MiB in fp32); "
        f"ZeRO-{stage}{' + optimizer offload' if offload_opt else ''}{' + parameter offload' if offload_param else ''} "
        f"on {N} ranks, {precision}")

engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=ds)


def comm_bytes() -> dict:
    """Bytes each collective has moved so far, by operation (DeepSpeed's comms logger)."""
    return {op: sum(size * record[0] for size, record in sizes.items())
            for op, sizes in ds_comm.comms_logger.comms_dict.items()}


# ---- Training; the census in the middle of step `census_step` -------------------------
census_step = min(S["memory"]["census_step"], steps - 1)
comm_before, losses, times, measured, act_bytes = comm_bytes(), [], [], {}, 0
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
                measured["allocated (CUDA)"] = torch.cuda.memory_allocated(dev)
        engine.step()
        loss_sum += loss.detach().float()
    dist.all_reduce(loss_sum)
    losses.append(loss_sum.item() / (N * accum))
    times.append(time.perf_counter() - t0)
    ctx.metrics.step(step=step, loss=losses[-1], step_time_s=times[-1], tokens_per_s=tokens_per_step / times[-1])
    ctx.metrics.progress(f"ZeRO-{stage}", step + 1, steps, f"loss {losses[-1]:.4f}")
comm_after = comm_bytes()
comm_per_step = {op: (comm_after[op] - comm_before.get(op, 0)) / steps for op in comm_after
                 if comm_after[op] - comm_before.get(op, 0) >= 1024 * steps}  # skip scalars

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
everyone = [None] * N
dist.all_gather_object(everyone, measured)
rss = per_rank_mib(dev)

figures, memory = [], {}
if ctx.is_main:
    names = {"parameters": "parameters", "gradients": "gradients", "master": "optimizer: fp32 master",
             "moments": "optimizer: Adam moments"}
    rows = {names[k]: [m[k] for m in everyone] for k in names}
    rows["model states"] = [sum(m[k] for k in names) for m in everyone]
    rows["buffers (buckets, staging)"] = [m["buffers"] for m in everyone]
    rows["other (data, tables, ...)"] = [m["other"] for m in everyone]
    rows["activations"] = [m["activations"] for m in everyone]  # saved for backward, one micro-batch
    if dev.type == "cuda":
        rows["allocated (CUDA)"] = [m["allocated (CUDA)"] for m in everyone]
    predicted["model states"] = sum(predicted[k] for k in MODEL_STATES)
    ctx.log(f"\nmemory per rank, MiB (census after the backward of step {census_step}'s first micro-batch)")
    ctx.log(f"  {'':34}" + "".join(f"{'rank ' + str(r):>10}" for r in range(N)) + f"{'predicted':>11}{'error':>9}")
    for name, values in rows.items():
        guess = predicted.get(name)
        error = max(abs(v - guess) for v in values) / guess if guess else None
        ctx.log(f"  {name:34}" + "".join(f"{v / MiB:10.2f}" for v in values)
                + (f"{guess / MiB:11.2f}{100 * error:8.1f}%" if guess else f"{'':11}"))
        memory[name] = {"measured_bytes": values, "predicted_bytes": guess}
        if guess is not None:
            figures.append(figure(f"{name} per rank (max)", round(max(values) / MiB, 3), "MiB", round(guess / MiB, 3),
                                  f"error {100 * error:.1f}%" if error is not None else ""))
    worst = max(abs(v - predicted["model states"]) for v in rows["model states"]) / predicted["model states"]
    tol = S["memory"]["tolerance"]
    ctx.check("model states match the ZeRO model", worst <= tol,
              f"worst rank off by {100 * worst:.2f}% (tolerance {100 * tol:g}%)")

    ctx.log("\nbytes per step by collective (DeepSpeed comms logger):" if comm_per_step else
            "\n(comms logger off: set ds.comms_logger=true for bytes per collective)")
    for op, nbytes in sorted(comm_per_step.items()):
        ctx.log(f"  {op:28}{nbytes / MiB:10.2f} MiB")
    warm = times[len(times) // 5:] or times
    tok_s = tokens_per_step / (sum(warm) / len(warm))
    figures += [figure("final loss", round(losses[-1], 4), "nats"),
                figure("validation perplexity", round(val_ppl, 2), "", None, f"{usable} blocks of {seq} tokens"),
                figure("throughput", round(tok_s, 1), "tokens/s", None, "mean after the first 20% of steps"),
                figure("communication per step", round(sum(comm_per_step.values()) / MiB, 3), "MiB", None,
                       "all collectives, as logged by rank 0"),
                figure("resident memory per rank (max)", max(rss), "MiB", None, "RSS on CPU, allocator peak on GPU")]
    if dev.type == "cuda":
        peak = next((v for k, v in PEAK_BF16_TFLOPS.items() if k in torch.cuda.get_device_name(dev)), None)
        if peak:
            mfu = flops_per_token(config, seq) * tok_s / (N * peak * 1e12)
            figures.append(figure("MFU", round(100 * mfu, 2), "%", None, f"vs {peak} TFLOPS bf16 dense per GPU"))
ctx.finish(figures, data=corpus.source, real_data=corpus.real, tokenizer=tokens.tokenizer, params=psi,
           model=config.to_dict(), stage=stage, offload_optimizer=offload_opt, offload_param=offload_param,
           precision=precision, memory=memory, census_step=census_step, comm_bytes_per_step=comm_per_step,
           losses=losses, val_perplexity=val_ppl, tokens_per_step=tokens_per_step)
