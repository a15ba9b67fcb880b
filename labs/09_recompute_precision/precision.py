"""Lab 09, mixed precision: fp32, bf16 and fp16 side by side through DeepSpeed's config.

Training in 16 bits halves the bytes of each weight, gradient and activation (p = 2, not 4),
while the optimizer keeps an fp32 master copy of the weights (4 bytes) and Adam's moments (8),
because a 16-bit weight cannot take an update 1000 times smaller than itself. The two 16-bit
formats split their bits differently (plscale estimate precision):

    bf16  8 exponent bits, 7 mantissa   fp32's range, 2-3 significant digits: no loss scaling
    fp16  5 exponent bits, 10 mantissa  3 digits, but nothing below 2^-24 or above 65504: small
                                        gradients underflow to 0, so the loss is scaled up by S
                                        before backward; an inf means S was too large: skip
                                        the step, halve S; after a window of clean steps, double S

Each run trains the same model from the same weights on the same batches: fp32, bf16 (DeepSpeed's
bf16 section), fp16 with dynamic loss scaling started high enough to overflow (the scaler's
sawtooth), and fp16 with none. Memory per rank is counted by role (the tensor census) beside
the memory model; the median step time and MFU of each (printed, never checked); the loss curves,
the scaler's log, and where fp16 puts real gradients, scaled and not (flushed to 0, subnormal,
overflowed), beside where formats.py says they fall, with the weights' gradients the scaler
checks for inf. Where DeepSpeed refuses fp16 (a CPU without fp16 kernels), fp16 runs as
DeepSpeed's torch_autocast: fp32 weights, fp16 ops, torch's GradScaler; so it does at ZeRO 0,
where DeepSpeed 0.19's fp16 section does not scale the loss (plscale/dsconfig/valid.py's
fp16_path says which path runs, and why).

    plscale lab run precision --gpus 2          (the fp16 variant: the scaler's run alone)
    deepspeed --num_gpus 2 labs/09_recompute_precision/precision.py --variant precision
        (DS_ACCELERATOR=cpu without GPUs; PLSCALE_DATA_DIR=path/to/wikitext-2 for the real data)
"""

import contextlib
import copy
import math
import statistics
import time
from dataclasses import asdict, replace

import torch
import torch.distributed as dist

from plscale.charts import plots, precision as charts
from plscale.dsconfig.spec import DSSpec, build
from plscale.dsconfig.valid import LOSS_SCALING, fp16_path
from plscale.files import write_json
from plscale.predict import memory
from plscale.predict.formats import FORMATS
from plscale.predict.memory import LABELS, MODEL_STATES
from plscale.predict.presets import param_count, preset
from plscale.predict.units import MiB
from plscale.rank import distributed, runtime
from plscale.rank.against_prediction import in_mib, mib_figure, within
from plscale.rank.census import census, saved_activations, zero_states
from plscale.rank.data import wikitext
from plscale.rank.metrics import figure
from plscale.rank.models.llama import Llama
from plscale.rank.utilization import Utilization
from plscale.strategies.precision import engine as precision_engine, explain, loss_scaling
from plscale.strategies.precision.explain import FP16, power as p2

ctx = runtime.start(__file__)
S, dev, N, tol = ctx.settings, ctx.device, ctx.world_size, ctx.settings["memory"]["tolerance"]
runs, steps, seq, seed = S["precision"]["runs"], S["train"]["steps"], S["model"]["seq"], S["seed"]

# ---- The formats, from their bits (plscale/predict/formats.py) -------------------------------
ctx.log("\n".join(explain.formats(FORMATS[name] for name in ("fp32", "bf16", "fp16"))))
native, why = fp16_path(S["ds"]["stage"], dev.type)
if any(run.startswith("fp16") for run in runs):
    ctx.log(f"fp16 here: {why}")

# ---- Data and model: the same batches and the same initial weights for every run -------------
corpus = wikitext.load_text()
tokens = wikitext.tokenize(corpus, preset(S["model"]["preset"]).vocab)
config = replace(preset(S["model"]["preset"]), attention=S["model"]["attention"]).with_vocab(tokens.vocab)
micro, accum = S["ds"]["micro_batch"], S["ds"]["grad_accum"]
shards = wikitext.Shards(wikitext.pack(tokens.train, seq), micro, accum, ctx.rank, N, seed)
torch.manual_seed(seed)
initial = copy.deepcopy(Llama(config).state_dict())
ctx.log(f"data: {corpus.source}\nmodel: '{S['model']['preset']}', Ψ = {param_count(config):,} parameters, seq {seq}, "
        f"micro batch {micro} on {N} ranks, ZeRO-{S['ds']['stage']}")


def spec_of(run: str) -> DSSpec:
    """The run's DeepSpeed settings: the lab's ds section, its precision, fp16's loss scaling."""
    precision = run.removesuffix("-unscaled")  # no scaling: no starting scale either (only dynamic scaling has one)
    unscaled = {"loss_scale": 1, "initial_scale_power": LOSS_SCALING["initial_scale_power"]}
    scaling = {**S["fp16"], **(unscaled if run == "fp16-unscaled" else {})} if precision == "fp16" else {}
    return DSSpec.from_dict({**S["ds"], "precision": precision, "autocast": precision == "fp16" and not native,
                             **scaling, "world_size": N})


# ---- Training, one precision after another ---------------------------------------------------
results = {}
for run in runs:
    spec = spec_of(run)
    ds = build(spec)
    if ctx.is_main:
        write_json(ctx.run_dir / f"ds_config.{run}.json", ds)
    model = Llama(config)
    model.load_state_dict(initial)
    engine, log, scaler = precision_engine.initialize(model, spec, ds)  # scaler: torch's GradScaler's settings
    losses, times = [], []
    for step in range(steps):
        t0 = time.perf_counter()
        total = torch.zeros((), dtype=torch.float64, device=dev)
        for i, block in enumerate(shards.step(step)):
            block, counting = block.to(dev), step == steps - 1 and i == 0  # the census: the last step
            with saved_activations() if counting else contextlib.nullcontext() as acts:
                loss = engine(block[:, :-1], block[:, 1:])
            engine.backward(loss)
            if counting:  # gradients live; the optimizer's states exist once it has stepped
                measured = census(zero_states(engine)) | {"activations": acts.bytes}
                stepped = log.updates > 0
            with log.step(step):
                engine.step()
            total += loss.detach().double()
        dist.all_reduce(total)
        losses.append(total.item() / (N * accum))
        times.append(time.perf_counter() - t0)
        ctx.metrics.step(run=run, step=step, loss=losses[-1], loss_scale=log.rows[-1].scale_before,
                         step_time_s=times[-1])
        ctx.metrics.progress(run, step + 1, steps, f"loss {losses[-1]:.4f}, scale {log.rows[-1].scale_before:g}")
    results[run] = {"spec": spec, "losses": losses, "log": log, "measured": distributed.gathered(measured), "stepped": stepped,
                    "scaler": scaler, "timed": times[1:-1] or times,  # the first allocates, the last counts memory
                    "prediction": memory.estimate(memory.setup_from_ds_config(ds, N, config, seq))}
    del engine, model

# ---- Memory per rank by role, against the memory model ----------------------------------------
figures, memory_rows = [], {}
SHORT = {"parameters": "params", "gradients": "grads", "master": "master", "moments": "moments", "activations": "acts"}
ctx.log("\nmemory per rank, MiB (census after the last step's backward), measured (largest rank) / predicted")
ctx.log(f"  {'':15}" + "".join(f"{LABELS[t]:>24}" for t in SHORT))
for run, r in results.items():
    autocast = r["spec"].autocast  # 16-bit ops on fp32 weights: activations of mixed widths, not predicted
    predicted = {t.name: t.total for t in r["prediction"].terms} | ({"activations": None} if autocast else {})
    got = {t: max(m[t] for m in r["measured"]) for t in SHORT}
    ctx.log(f"  {run:15}" + "".join(f"{got[t] / MiB:.2f} / {'-' if predicted[t] is None else f'{predicted[t] / MiB:.2f}'}"
                                    .rjust(24) for t in got))
    states, want = sum(got[t] for t in MODEL_STATES), sum(predicted[t] for t in MODEL_STATES)
    if r["stepped"]:
        ctx.check(*within(f"{run}: model states match the memory model", [(states, want)], tol,
                          f"{r['prediction'].setup.precision} weights"))
    else:
        ctx.log(f"  [--] {run}: every step so far overflowed and was skipped: Adam's moments do not exist yet")
    if not autocast:
        ctx.check(*within(f"{run}: activations match the memory model", [(got["activations"], predicted["activations"])],
                          tol, "activations"))
    figures += [mib_figure(f"{run}: model states per rank", states, want,
                           "" if r["stepped"] else "no optimizer step yet: moments absent"),
                mib_figure(f"{run}: activations per rank", got["activations"], predicted["activations"],
                           "autocast: fp32 activations beside fp16 copies, not predicted" if autocast else "")]
    memory_rows[run] = {t: {"measured_bytes": got[t], "predicted_bytes": predicted[t]} for t in got}
if any(r["spec"].autocast for r in results.values()):
    ctx.log("  " + explain.AUTOCAST_ACTIVATIONS)

# ---- Time per step and MFU: measured, never checked -------------------------------------------
if dev.type == "cpu" and any(run.startswith("fp16") for run in runs):
    ctx.log("\n" + explain.CPU_FP16)
for run, r in results.items():  # MFU against the matmul peak of the run's own precision
    util = Utilization(ctx, config, seq, ds["train_batch_size"] * seq, r["spec"].precision)
    figures += [figure(f"{run}: step time (median)", round(statistics.median(r["timed"]), 4), "s", None,
                       "the first and last step left out"), *util.figures(r["timed"], prefix=f"{run}: ")]

# ---- fp16's loss scaler: overflow, back-off, growth --------------------------------------------
window, logs = S["fp16"]["loss_scale_window"], {}
for run, r in results.items():
    if r["spec"].precision != "fp16" or r["spec"].loss_scale == 1:
        continue
    log, summary = r["log"], r["log"].summary()
    logs[run] = log.to_list()
    ctx.log(f"\n{run}: the loss scaler's log ({'DeepSpeed fp16 optimizer' if native else 'torch GradScaler'}, "
            f"window {window})")
    for line in loss_scaling.describe(log.rows):
        ctx.log("  " + line)
    for line in explain.scaler(summary, window):
        ctx.log("  " + line)
    broken = log.broken_rule(window, S["fp16"]["hysteresis"])
    ctx.check(f"{run}: the scale follows dynamic loss scaling", not broken, explain.scaler_check(summary, broken, window))
    figures += [figure(f"{run}: overflows (steps skipped)", summary["overflows"], "steps", None,
                       f"skipped {summary['skipped']} of {summary['steps']}"),
                figure(f"{run}: loss scale, final", summary["final_scale"], "", None,
                       "2^{:g}; between 2^{:g} and 2^{:g}".format(*(math.log2(summary[k]) for k in
                                                                   ("final_scale", "smallest_scale", "largest_scale"))))]

# ---- Where fp16 puts real gradients: one batch, the initial weights ----------------------------
# The gradients at every linear's output (dL/dy) in fp32, then under fp16 autocast unscaled and,
# where a run scaled the loss, scaled by the largest scale it stepped with cleanly. Predicted: each
# fp32 gradient x S against fp16's range (plscale/strategies/precision/loss_scaling.py: probe).
clean = [row["scale_before"] for rows in logs.values() for row in rows if not row["overflow"]]
first = [rows[0]["scale_before"] for rows in logs.values() if rows]
scale = max(clean) if clean else first[0] if first else None  # None: no run scaled the loss
labels = ["no scaling, S = 1"] + ([f"scaled, S = {p2(scale)}"] if scale else [])
underflow, COLUMNS = {}, ("flushed", "subnormal", "overflowed")
if ctx.is_main and any(r.startswith("fp16") for r in runs):
    model = Llama(config).to(dev)
    model.load_state_dict(initial)
    block = shards.step(0)[0].to(dev)
    grads32, probes = loss_scaling.probe(model, block[:, :-1], block[:, 1:], [1.0, scale][:len(labels)])
    ctx.log("\nfp16 and the gradients at the linears' outputs (rank 0, step 0's batch, the initial weights), as "
            "fractions of those non-zero in fp32: measured in fp16 / predicted from fp32 x S and fp16's range")
    if scale and not clean:
        ctx.log(f"  no step of {', '.join(logs)} ran clean (every one overflowed and was skipped): the probe uses the "
                f"scale it started at, S = {p2(scale)}")
    ctx.log("\n".join("  " + line for line in explain.probe_rows(labels, probes, COLUMNS)))
    for label, pr in zip(labels, probes):
        underflow[label] = asdict(pr)
        figures += explain.probe_figures(label, pr)
    for pr in probes:  # why each overflowed where it did, or did not where a run's scaler did
        over = sorted({row["scale_before"] for rows in logs.values() for row in rows
                       if row["overflow"] and row["scale_before"] <= pr.scale})
        for line in explain.probe(pr, over, block[:, :-1].numel()):
            ctx.log("  " + line)
    if len(probes) == 2 and probes[1].carried:
        ctx.log(f"  [--] loss scaling keeps small gradients in fp16's range: not checked, at S = {p2(scale)} this "
                f"batch's gradients overflow")
    elif len(probes) == 2:
        lost = [pr.measured.flushed + pr.measured.subnormal for pr in probes]
        ctx.check("loss scaling keeps small gradients in fp16's range", lost[0] > lost[1],
                  f"flushed or subnormal: {100 * lost[0]:.2f}% unscaled, {100 * lost[1]:.2f}% at S = {p2(scale)}")
    worst, where, column = explain.widest_gap(labels, probes, COLUMNS)
    tol16 = S["precision"]["underflow_tolerance"]
    ctx.check("fp16's range predicts where the gradients fall (flushed, subnormal, overflowed)", worst <= tol16,
              f"largest gap {100 * worst:.3f} points, {column} at {where.split(', ')[-1]} (tolerance {100 * tol16:g} "
              f"point{'s' * (tol16 != 0.01)}; the fp16 forward moves the gradients a little)")
    charts.gradient_ranges(ctx.run_dir / "underflow.png", grads32, scale, [FP16, FORMATS["bf16"]])

# ---- The loss curves, side by side -------------------------------------------------------------
if ctx.is_main:
    skipped = {run: r["log"].summary()["skipped"] for run, r in results.items()}
    unscaled = [run for run, r in results.items() if r["spec"].precision == "fp16" and r["spec"].loss_scale == 1]
    ctx.log("\nloss, first -> last step: " + "; ".join(
        f"{run} {r['losses'][0]:.4f} -> {r['losses'][-1]:.4f}" + (f" ({skipped[run]} steps skipped)" if skipped[run]
                                                                  else "") for run, r in results.items()))
    for line in explain.losses(skipped, unscaled):
        ctx.log("  " + line)
    charts.loss_curves(ctx.run_dir / "losses.png", {run: (list(range(steps)), r["losses"]) for run, r in results.items()},
                       f"loss by precision, the same weights and batches ('{S['model']['preset']}', seq {seq})",
                       logs)
    if logs:
        charts.scaler_chart(ctx.run_dir / "loss_scale.png", logs, "fp16's dynamic loss scale")
    written = ["losses.png: the curves", "memory.png: memory by role"] + ["loss_scale.png: fp16's scale"] * bool(logs) \
        + ["underflow.png: gradients against fp16's range"] * bool(underflow)
    plots.measured_vs_predicted(ctx.run_dir / "memory.png", {run: in_mib(rows, SHORT) for run, rows in memory_rows.items()},
                                f"memory per rank by role ({N} ranks, ZeRO-{S['ds']['stage']})")
    figures += [figure(f"{run}: final loss", round(r["losses"][-1], 4), "nats") for run, r in results.items()]
    ctx.log("; ".join(written))
ctx.finish(figures, data=corpus.source, real_data=corpus.real, tokenizer=tokens.tokenizer, runs=runs,
           fp16_path="deepspeed fp16" if native else "torch_autocast", memory=memory_rows,
           grad_scaler={run: r["scaler"] for run, r in results.items() if r["spec"].autocast},
           step_s={run: statistics.median(r["timed"]) for run, r in results.items()},
           losses={run: r["losses"] for run, r in results.items()}, scaler=logs, underflow=underflow,
           params=param_count(config))
