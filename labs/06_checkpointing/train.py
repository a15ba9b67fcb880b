"""Lab 06: checkpoints and fault tolerance, measured; kill a rank and resume bit-exactly.

The ZeRO lab's Llama-shaped model (or model.hf's) trains on WikiText-2 with DeepSpeed (dropout on, so
every random stream matters) and checkpoints with one of four strategies. Each
checkpoint's cost is measured: how long training stalls, how long until it is durable,
how many bytes it writes. Every checkpoint is sealed with a manifest of checksums and
`latest` moves last, so a crash never leaves half a checkpoint to load. A restarted run
loads the newest checkpoint every rank finds whole, with model, optimizer, scheduler,
data position and every RNG, and trains on exactly as if nothing had happened.

    plscale lab run ckpt --gpus 2                 (basic; incremental, async, multilevel)
    plscale lab run ckpt-fault                    (rank 1 dies at step 17; torchrun restarts the group)
    plscale lab run ckpt --sweep                  (the four strategies, their table and the interval plot)
    plscale ckpt ls runs/<run>/checkpoints        (what was written; verify, convert)
    torchrun --nproc_per_node 2 labs/06_checkpointing/train.py --variant async
"""

import json
import math
import shutil
import time
from pathlib import Path

import deepspeed
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

from plscale.ckpt import store
from plscale.charts.plots import interval_chart
from plscale.predict import checkpoint as predict
from plscale.predict.units import MiB
from plscale.rank import distributed, runtime
from plscale.strategies.checkpoint import fault
from plscale.strategies.checkpoint import dcp, sealed, strategies
from plscale.rank.data import wikitext
from plscale.rank.metrics import figure
from plscale.rank.models import chosen
from plscale.rank.utilization import Utilization
from plscale.lab.rundir import node_scratch


ctx = runtime.start(__file__)
S, ds, N = ctx.settings, ctx.ds_config, ctx.world_size
C, steps, seq = S["ckpt"], S["train"]["steps"], S["model"]["seq"]
micro, accum = ds["train_micro_batch_size_per_gpu"], ds["gradient_accumulation_steps"]
stage = ds["zero_optimization"]["stage"]
attempt = distributed.restart_count()

# ---- Data and model, as in the ZeRO lab; the batch of step t depends on (seed, t) only -----
corpus = wikitext.load_text()
tokens, config, make, about = chosen.model(S, corpus)   # plscale's Llama, or model.hf: a Hugging Face model
shards = wikitext.Shards(wikitext.pack(tokens.train, seq), micro, accum, ctx.rank, N, S["seed"])
model = make()
psi = sum(p.numel() for p in model.parameters())
if S["engine"] == "fsdp2":   # PyTorch's way: FSDP2 shards the model, DCP checkpoints it (strategies/checkpoint/dcp.py)
    engine = dcp.Engine(model, ds, init_device_mesh(ctx.device.type, (N,)))
else:
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=ds)
ctx.log(f"data: {corpus.source}; model: {about}, Ψ = {psi:,}, dropout "
        f"{S['model']['dropout']}; {'FSDP2 and DCP' if S['engine'] == 'fsdp2' else f'ZeRO-{stage}'} on {N} ranks")

# ---- Where checkpoints go, and what a checkpoint must match to be resumed here ------------
root = Path(C["dir"] or ctx.run_dir / "checkpoints")
fingerprint = {"preset": "hf" if S["model"]["hf"] else S["model"]["preset"], "params": psi, "hidden": config.hidden,
               "layers": config.layers}   # of the model, wherever its folder is
meta = {"lab": ctx.lab, "engine": S["engine"], "world_size": N, "stage": stage, "precision": S["ds"]["precision"],
        "model": fingerprint}
local = node_scratch(ctx.run_dir)  # memory on this node, for this run only
saver = strategies.make(engine, C, root, local, meta)
ctx.log(f"checkpoints: {saver.name}, every {C['every']} steps, into {root}"
        + (f" (fast tier {saver.fast_root})" if saver.name == "multilevel" else ""))

# ---- Resume: the newest checkpoint that every rank finds whole (this run's own, after a
# restart, or ckpt.resume's) --------------------------------------------------------------
roots = saver.roots + ([Path(C["resume"])] if C["resume"] else [])
got = sealed.restore(engine, roots, local, expect={"model": fingerprint, "engine": S["engine"]})
for tag, problems in got.skipped:
    ctx.log(f"  skipped {tag}: {'; '.join(problems)}")
crash = fault.last(ctx.run_dir) if attempt else None
if got.tag:
    ctx.log(f"resumed from {got.root}/{got.tag} at step {got.step} (attempt {attempt}); random streams "
            + ("restored" if got.rng else "fresh: the checkpoint is of another world size"))
if crash:
    ctx.log(f"recovering from the failure of rank {crash['rank']} at step {crash['step']}: "
            f"{crash['step'] - got.step} steps lost")
if got.step >= steps:
    ctx.log(f"nothing to train: the checkpoint is at step {got.step} and the run has {steps} (raise --steps)")

# ---- Training, checkpointing after every optimizer step that asks for one -----------------
recovery_s, losses = None, {}
util = Utilization(ctx, config, seq, micro * accum * N * seq, S["ds"]["precision"])
for step in range(got.step, steps):
    fault.maybe_inject(ctx.run_dir, step, S["fault"], ctx.rank)
    t0 = time.perf_counter()
    loss_sum = torch.zeros((), device=ctx.device)
    for block in shards.step(step):
        loss = engine(block[:, :-1].to(ctx.device), block[:, 1:].to(ctx.device))
        engine.backward(loss)
        engine.step()
        loss_sum += loss.detach().float()
    dist.all_reduce(loss_sum)
    losses[step] = loss_sum.item() / (N * accum)
    took = time.perf_counter() - t0
    saved = saver.after_step(step + 1)
    if crash and recovery_s is None:
        recovery_s = time.time() - crash["time"]
    ctx.metrics.step(step=step, loss=losses[step], step_time_s=took, attempt=attempt,
                     ckpt_stall_s=saved.stall_s if saved else 0.0, **util.of_step(took))
    ctx.metrics.progress(f"train ({saver.name})", step + 1, steps, f"loss {losses[step]:.4f}")
records = saver.finish()
sealed.on_main(shutil.rmtree, local, True)  # under `plscale lab run` the host clears it even after a crash
train_s = [json.loads(line)["step_time_s"] for line in (ctx.run_dir / "metrics.jsonl").read_text().splitlines()]

# ---- What each checkpoint cost, and what the models predict ------------------------------
figures, lag = [], 0
if ctx.is_main and records:
    ctx.log(f"\ncheckpoints written ({saver.name}):")
    ctx.log(f"  {'tag':12}{'tier':>9}{'kind':>7}{'stall ms':>10}{'durable ms':>12}{'MiB':>9}")
    for r in records:
        ctx.log(f"  {r.tag:12}{r.tier:>9}{r.kind:>7}{1e3 * r.stall_s:10.0f}{1e3 * r.durable_s:12.0f}"
                f"{r.bytes / MiB:9.1f}")
    step_s = sorted(train_s)[len(train_s) // 2]
    stall = sum(r.stall_s for r in records) / len(records)
    durable = sum(r.durable_s for r in records) / len(records)
    lag = math.ceil(max(0.0, durable - stall) / step_s)  # steps trained while a write is in flight
    wholes = [r.bytes for r in records if r.kind == "full"]
    writer = "DCP" if S["engine"] == "fsdp2" else "DeepSpeed"
    predicted_bytes = predict.dcp_bytes(config) if S["engine"] == "fsdp2" else \
        predict.checkpoint_bytes(psi, stage, N, S["ds"]["precision"], config).total
    mtbf_s = C["mtbf_hours"] * 3600
    young = predict.young_interval(stall, mtbf_s)
    lost, worst = predict.expected_steps_lost(C["every"], lag), predict.worst_steps_lost(C["every"], lag)
    ctx.log(f"\n  a training step takes {1e3 * step_s:.0f} ms (median); a checkpoint stalls it {1e3 * stall:.0f} ms "
            f"and is durable after {1e3 * durable:.0f} ms")
    ctx.log(f"  a crashed process loses {lost:g} steps on average, {worst:g} at worst (every {C['every']}"
            f"{f', and {lag} trained while a write is in flight' if lag else ''})")
    if saver.name == "multilevel":
        ctx.log(f"  a lost node takes the fast tier with it: "
                f"{predict.expected_steps_lost(C['durable_every']):g} steps on average, {C['durable_every']} at worst")
    ctx.log(f"  Young, for one failure every {C['mtbf_hours']:g} h: checkpoint every {young:.0f} s = "
            f"{young / step_s:.0f} steps (Daly: {predict.daly_interval(stall, mtbf_s):.0f} s); every "
            f"{C['every']} steps wastes {100 * predict.waste_fraction(C['every'] * step_s, stall, mtbf_s):.2f}% "
            f"of the time, the optimum {100 * predict.waste_fraction(young, stall, mtbf_s):.2f}%")
    interval_chart([(saver.name, stall, step_s)], mtbf_s, ctx.run_dir / "interval.png",
                   title="checkpoint interval", every=C["every"])
    figures += [figure("stall per checkpoint", round(1e3 * stall, 1), "ms", None, "mean; training blocked"),
                figure("time to durable", round(1e3 * durable, 1), "ms", None, "mean; from the save to `latest`"),
                figure("bytes per full checkpoint", round(sum(wholes) / max(1, len(wholes)) / MiB, 2), "MiB",
                       round(predicted_bytes / MiB, 2), f"measured: all files; predicted: {writer}'s"),
                figure("bytes per checkpoint", round(sum(r.bytes for r in records) / len(records) / MiB, 2),
                       "MiB", None, f"mean over {len(records)} checkpoints"),
                figure("steps lost on a crash, predicted mean", lost, "steps", None, "every / 2 + steps in flight"),
                figure("Young interval, predicted", round(young / step_s), "steps", None,
                       f"MTBF {C['mtbf_hours']:g} h, this run's stall and step"),
                figure("training step", round(1e3 * step_s, 1), "ms", None, "median, without checkpoints"),
                *util.figures(train_s, "all ranks; every attempt's steps")]
elif ctx.is_main:
    ctx.log(f"\nno checkpoint in this run: it trained {max(0, steps - got.step)} steps, and checkpoints every "
            f"{C['every']}")
if ctx.is_main:
    if crash:
        first = {}
        for line in (ctx.run_dir / "metrics.jsonl").read_text().splitlines():
            row = json.loads(line)
            if row["attempt"] == 0:
                first[row["step"]] = row["loss"]
        again = [s for s in losses if s in first]
        ctx.check("the steps trained again after the restart give the same losses, bit for bit",
                  all(first[s] == losses[s] for s in again),
                  f"steps {again[0]}-{again[-1]} before and after the crash" if again else "no step was repeated")
        worst = predict.worst_steps_lost(C["every"], lag)
        ctx.check("the crash cost no more steps than the strategy promises", crash["step"] - got.step <= worst,
                  f"{crash['step'] - got.step} lost, at worst {worst:g}")
        figures += [figure("time to recover", round(recovery_s, 2), "s", None, "from the kill to the first step done"),
                    figure("steps lost", crash["step"] - got.step, "steps", worst, "measured beside the worst case")]
    kept = store.entries(root)
    ctx.check("every checkpoint kept is whole, and `latest` names the newest",
              not records or (bool(kept) and all(e.valid for e in kept) and store.latest_tag(root) == kept[0].tag),
              f"{len(kept)} kept in {root.name}/ ({', '.join(e.tag for e in kept)}), checksums verified")
ctx.finish(figures, strategy=saver.name, every=C["every"], mtbf_hours=C["mtbf_hours"], stage=stage, params=psi,
           losses=losses, checkpoints=[r.__dict__ for r in records], resumed_from=got.tag, resumed_step=got.step,
           skipped=got.skipped, attempt=attempt, fault=crash, recovery_s=recovery_s, data=corpus.source,
           real_data=corpus.real)
