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
the memory model; the median step time of each (printed, never checked); the loss curves,
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

import deepspeed
import torch
import torch.distributed as dist

from plscale.charts import plots
from plscale.charts import precision as charts
from plscale.dsconfig.spec import DSSpec, build
from plscale.dsconfig.valid import LOSS_SCALING, fp16_path
from plscale.files import write_json
from plscale.predict import memory
from plscale.predict.formats import FORMATS
from plscale.predict.memory import LABELS, MODEL_STATES
from plscale.predict.presets import param_count, preset
from plscale.strategies.precision import loss_scaling
from plscale.rank import runtime, taps
from plscale.rank.census import census, saved_activations, zero_states
from plscale.rank.data import wikitext
from plscale.rank.metrics import figure
from plscale.rank.models.llama import Llama

MiB = 2**20
p2 = lambda v, spec="g": f"2^{math.log2(v):{spec}}"  # a scale as a power of 2
ctx = runtime.start(__file__)
S, dev, N = ctx.settings, ctx.device, ctx.world_size
runs, steps, seq, seed, tol = S["precision"]["runs"], S["train"]["steps"], S["model"]["seq"], S["seed"], \
    S["memory"]["tolerance"]
FP16 = FORMATS["fp16"]

# ---- The formats, from their bits (plscale/predict/formats.py) -------------------------------
ctx.log(f"{'format':8}{'largest':>12}{'smallest normal':>17}{'smallest':>11}{'rounding error':>16}{'binades':>9}")
for f in (FORMATS[name] for name in ("fp32", "bf16", "fp16")):
    ctx.log(f"{f.name:8}{f.max:12.4g}{f.min_normal:17.3g}{f.min_subnormal:11.3g}{f.rounding_error:16.2g}{f.binades:9.0f}")
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
    loss_scaling.forget_autocast(ds)          # what an earlier torch_autocast run left in DeepSpeed
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=ds)
    loss_scaling.configure(engine, spec)      # the autocast path: a GradScaler as fp16's settings say
    scaler = loss_scaling.grad_scaler_settings(engine)  # what torch's GradScaler runs with (None: none)
    log = loss_scaling.ScalerLog(engine)
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
    everyone = [None] * N
    dist.all_gather_object(everyone, measured)
    results[run] = {"spec": spec, "losses": losses, "log": log, "measured": everyone, "stepped": stepped,
                    "scaler": scaler, "step_s": statistics.median(times[1:-1] or times),  # first: allocating; last: census
                    "prediction": memory.estimate(memory.setup_from_ds_config(ds, N, config, seq))}
    del engine, model

# ---- Memory per rank by role, against the memory model ----------------------------------------
figures, memory_rows = [], {}
SHORT = {"parameters": "params", "gradients": "grads", "master": "master", "moments": "moments", "activations": "acts"}
ctx.log("\nmemory per rank, MiB (census after the last step's backward), measured (largest rank) / predicted")
ctx.log(f"  {'':15}" + "".join(f"{LABELS[t]:>24}" for t in SHORT))
for run, r in results.items():
    predicted = {t.name: t.total for t in r["prediction"].terms}
    got = {t: max(m[t] for m in r["measured"]) for t in SHORT}
    autocast = r["spec"].autocast  # 16-bit ops on fp32 weights: activations of mixed widths
    if autocast:
        predicted["activations"] = None
    ctx.log(f"  {run:15}" + "".join(f"{got[t] / MiB:.2f} / {'-' if predicted[t] is None else f'{predicted[t] / MiB:.2f}'}"
                                    .rjust(24) for t in got))
    states, want = sum(got[t] for t in MODEL_STATES), sum(predicted[t] for t in MODEL_STATES)
    if r["stepped"]:
        ctx.check(f"{run}: model states match the memory model", abs(states - want) <= tol * want,
                  f"{states / MiB:.3f} MiB measured, {want / MiB:.3f} predicted ({r['prediction'].setup.precision} "
                  f"weights; tolerance {100 * tol:g}%)")
    else:
        ctx.log(f"  [--] {run}: every step so far overflowed and was skipped: Adam's moments do not exist yet")
    if predicted["activations"] is not None:
        off = abs(got["activations"] - predicted["activations"]) / predicted["activations"]
        ctx.check(f"{run}: activations match the memory model", off <= tol,
                  f"off by {100 * off:.2f}% (tolerance {100 * tol:g}%)")
    figures += [figure(f"{run}: model states per rank", round(states / MiB, 3), "MiB", round(want / MiB, 3),
                       "" if r["stepped"] else "no optimizer step yet: moments absent"),
                figure(f"{run}: activations per rank", round(got["activations"] / MiB, 3), "MiB",
                       None if autocast else round(predicted["activations"] / MiB, 3),
                       "autocast: fp32 activations beside fp16 copies, not predicted" if autocast else "")]
    memory_rows[run] = {t: {"measured_bytes": got[t], "predicted_bytes": predicted[t]} for t in got}
if any(r["spec"].autocast for r in results.values()):
    ctx.log("  under autocast the weights, gradients and optimizer stay fp32 (predicted as fp32). Its activations "
            "are not predicted:\n  the norms, softmax and loss keep fp32 tensors, each linear keeps an fp16 copy "
            "of its input, and the memory model knows one width per activation")

# ---- Time per step: measured, printed, never checked -------------------------------------------
ctx.log("\nstep time, median over steps (the first, allocating, and the last, counting memory, left out; rank 0): "
        + ", ".join(f"{run} {r['step_s']:.3f} s" for run, r in results.items()))
if dev.type == "cpu" and any(run.startswith("fp16") for run in runs):
    ctx.log("  on a CPU without fp16 kernels, fp16 autocast is the slow one: each fp16 op runs a fallback path "
            "and casts to and from fp32; on GPUs 16-bit matmuls are the fast ones")
figures += [figure(f"{run}: step time (median)", round(r["step_s"], 4), "s", None, "measured, not predicted")
            for run, r in results.items()]

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
    clean_window = f"{window} clean step{'s' * (window > 1)}"
    if summary["overflows"]:
        ctx.log(f"  an overflow: the scaled gradients passed fp16's largest, {FP16.max:g}, and became inf; the step is "
                f"skipped and the scale halves.\n  After {clean_window} it doubles to look for more room, "
                f"overflows again, halves: the sawtooth (loss_scale.png)")
    else:
        ctx.log(f"  no overflow: from {p2(summary['smallest_scale'])} the scaled gradients stayed below fp16's largest, "
                f"{FP16.max:g}, so no step was skipped and the scale only " + (
                    f"grew, doubling after each {clean_window}, to {p2(summary['final_scale'])}; a larger "
                    f"fp16.initial_scale_power, or more steps, reaches an overflow (the sawtooth)"
                    if summary["growths"] else f"stayed: fewer than {clean_window} ran before the end"))
    broken = log.broken_rule(window, S["fp16"]["hysteresis"])
    ctx.check(f"{run}: the scale follows dynamic loss scaling", not broken,
              ("; ".join(broken[:3]) if broken else
               f"{summary['overflows']} overflows, each skipped and halved; " if summary["overflows"] else
               "no overflow, nothing skipped; ") + (
                  "" if broken else f"{summary['growths']} doubling{'s' * (summary['growths'] != 1)} after {clean_window}"))
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
    ctx.log(f"  {'':22}{'flushed to 0':>20}{'subnormal (< 2^-14)':>24}{'overflowed':>20}")
    for label, pr in zip(labels, probes):
        underflow[label] = asdict(pr)
        got, want = pr.measured, pr.predicted
        ctx.log(f"  {label:22}" + "".join(f"{100 * getattr(got, k):11.3f}% / {100 * getattr(want, k):.3f}%".rjust(w)
                                          for k, w in zip(COLUMNS, (20, 24, 20))) + (" *" if pr.carried else ""))
        notes = {"flushed": ("flushed to 0", f"of {got.entries:,} non-zero in fp32, in {len(pr.layers)} layers"),
                 "subnormal": ("subnormal", "fewer significant bits"), "overflowed": ("overflowed", "inf: past 65504")}
        figures += [figure(f"gradients {name} in fp16, {label}", round(100 * getattr(got, k), 4), "%",
                           round(100 * getattr(want, k), 4), note) for k, (name, note) in notes.items()]
        figures.append(figure(f"weight-gradient entries past 65504, {label}", pr.weights.measured, "entries",
                              pr.weights.predicted, f"largest |dW| x S {pr.weights.largest:.4g} ({pr.weights.largest_in})"))
    for label, pr in zip(labels, probes):
        peak = f"the largest |dW| x S, {pr.weights.largest_in}'s, is {p2(pr.weights.largest, '.3g')}"
        over = sorted({row["scale_before"] for rows in logs.values() for row in rows
                       if row["overflow"] and row["scale_before"] <= pr.scale})
        if pr.carried:
            ctx.log(f"  * at S = {p2(pr.scale)} the gradient at {pr.layers[-1]}'s output overflowed, and the backward "
                    f"carries the inf on: each dL/dx = dL/dy W\n    sums it with the rest (inf - inf = NaN), so the "
                    f"{len(pr.carried)} layers after {pr.layers[-1]} are {100 * pr.carried_nonfinite:.1f}% inf or NaN "
                    f"and say nothing about fp16's range;\n    the row covers the {len(pr.layers)} of "
                    f"{len(pr.layers) + len(pr.carried)} layers up to the first inf (the step itself is skipped)")
        elif pr.weights.measured:
            ctx.log(f"  no gradient at a linear's output overflows at S = {p2(pr.scale)}, but the scaler checks the "
                    f"weights' gradients, dW = the sum over\n    the batch's {block[:, :-1].numel()} tokens of dL/dy x "
                    f"input, larger than any one dL/dy: on this batch {peak}, past {FP16.max:g}:\n    "
                    f"{pr.weights.measured} entries inf (predicted from fp32 dW x S: {pr.weights.predicted}): at this "
                    f"S the scaler would skip this batch's step")
        elif over:
            ctx.log(f"  the scaler overflowed at {', '.join(p2(v) for v in over)}, yet no gradient here does: it checks "
                    f"the weights' gradients, dW = the sum over\n    the batch's tokens of dL/dy x input, and on this "
                    f"batch {peak}, below {FP16.max:g} (inf: {pr.weights.measured}, predicted "
                    f"{pr.weights.predicted});\n    those overflows came on other steps: other batches (every rank's: "
                    f"the gradients are averaged before the check) and weights moved by the steps before")
    if len(probes) == 2 and probes[1].carried:
        ctx.log(f"  [--] loss scaling keeps small gradients in fp16's range: not checked, at S = {p2(scale)} this "
                f"batch's gradients overflow")
    elif len(probes) == 2:
        lost = [pr.measured.flushed + pr.measured.subnormal for pr in probes]
        ctx.check("loss scaling keeps small gradients in fp16's range", lost[0] > lost[1],
                  f"flushed or subnormal: {100 * lost[0]:.2f}% unscaled, {100 * lost[1]:.2f}% at S = {p2(scale)}")
    gaps = {(label, k): abs(getattr(pr.measured, k) - getattr(pr.predicted, k))
            for label, pr in zip(labels, probes) for k in COLUMNS}
    (where, column), worst = max(gaps.items(), key=lambda kv: kv[1])
    tol16 = S["precision"]["underflow_tolerance"]
    ctx.check("fp16's range predicts where the gradients fall (flushed, subnormal, overflowed)", worst <= tol16,
              f"largest gap {100 * worst:.3f} points, {column} at {where.split(', ')[-1]} (tolerance {100 * tol16:g} "
              f"point{'s' * (tol16 != 0.01)}; the fp16 forward moves the gradients a little)")
    curves = {"x 1": taps.log2_histogram(grads32.values())} | (
        {f"x S = {p2(scale)}": taps.log2_histogram(g * scale for g in grads32.values())} if scale else {})
    charts.range_histograms(ctx.run_dir / "underflow.png",
                            {"gradients at the linears' outputs (fp32), and times the loss scale": curves},
                            [FP16, FORMATS["bf16"]], "fp16 needs the scale; bf16 keeps fp32's range" if scale
                            else "fp16 without loss scaling; bf16 keeps fp32's range")

# ---- The loss curves, side by side -------------------------------------------------------------
if ctx.is_main:
    skipped = {run: r["log"].summary()["skipped"] for run, r in results.items()}
    unscaled = [run for run, r in results.items() if r["spec"].precision == "fp16" and r["spec"].loss_scale == 1]
    ctx.log("\nloss, first -> last step: " + "; ".join(
        f"{run} {r['losses'][0]:.4f} -> {r['losses'][-1]:.4f}" + (f" ({skipped[run]} steps skipped)" if skipped[run]
                                                                  else "") for run, r in results.items()))
    if any(skipped.values()):
        ctx.log("  a skipped step (an overflow) does not move the weights: " + ", ".join(
            f"{run} trails by its {n} skipped step{'s' * (n > 1)}" for run, n in skipped.items() if n))
    if unscaled:
        ctx.log(f"  How far fp16 without loss scaling ({', '.join(unscaled)}) falls behind depends on how many "
                f"gradients it loses (the table above): a flushed gradient teaches nothing, a subnormal one keeps "
                f"fewer bits")
    plots.line_plot(ctx.run_dir / "losses.png", {run: (list(range(steps)), r["losses"]) for run, r in results.items()},
                    f"loss by precision, the same weights and batches ('{S['model']['preset']}', seq {seq})",
                    styles={"fp32": "C0-", "bf16": "C1-", "fp16": "C2-", "fp16-unscaled": "C3--"})
    written = ["losses.png: the curves", "memory.png: memory by role"]
    if logs:
        charts.scaler_chart(ctx.run_dir / "loss_scale.png", logs, "fp16's dynamic loss scale")
        written.append("loss_scale.png: fp16's scale")
    if underflow:
        written.append("underflow.png: gradients against fp16's range")
    plots.measured_vs_predicted(ctx.run_dir / "memory.png", {
        run: {SHORT[t]: (v["measured_bytes"] / MiB, None if v["predicted_bytes"] is None
                                    else v["predicted_bytes"] / MiB) for t, v in rows.items()}
        for run, rows in memory_rows.items()}, f"memory per rank by role ({N} ranks, ZeRO-{S['ds']['stage']})")
    figures += [figure(f"{run}: final loss", round(r["losses"][-1], 4), "nats") for run, r in results.items()]
    ctx.log("; ".join(written))
ctx.finish(figures, data=corpus.source, real_data=corpus.real, tokenizer=tokens.tokenizer, runs=runs,
           fp16_path="deepspeed fp16" if native else "torch_autocast", memory=memory_rows,
           grad_scaler={run: r["scaler"] for run, r in results.items() if r["spec"].autocast},
           step_s={run: r["step_s"] for run, r in results.items()},
           losses={run: r["losses"] for run, r in results.items()}, scaler=logs, underflow=underflow,
           params=param_count(config))
