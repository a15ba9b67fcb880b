"""Lab 09, fp8 by measurement: real activations and gradients cast to e4m3 and e5m2.

Eight bits leave a float about 18 binades (powers of two) between its smallest and largest
value with 3 bits of mantissa (e4m3), or 32 with 2 (e5m2) (plscale estimate precision):

    e4m3  largest 448,   smallest 2^-9,  rounding error at most 2^-4: for activations, weights
    e5m2  largest 57344, smallest 2^-16, rounding error at most 2^-3: for gradients (range)

A model's tensors spread over more binades than that, and gradients sit far below 1. So fp8
training scales each tensor before the cast: s = format max / amax(x), q = fp8(x s), read back
as q / s (per-tensor scaling; the scale is kept in fp32 beside the tensor). The lab trains the
Llama a few steps through DeepSpeed, takes one batch's real tensors at every linear layer (its
input, and the gradient at its output: what an fp8 matmul would cast), casts each to every
format with and without scaling, and puts what was lost beside what the formats predict: which
entries round to 0 or pass the largest value, and the worst rounding error, 2^-(m+1); the error
column is each tensor's ||q/s - x|| / ||x||, averaged over the tensors.

    plscale lab run fp8 --gpus 2
    deepspeed --num_gpus 2 labs/09_recompute_precision/fp8.py
        (DS_ACCELERATOR=cpu without GPUs; PLSCALE_DATA_DIR=path/to/wikitext-2 for the real data)
"""

import math
import time
from dataclasses import replace

import deepspeed
import torch
import torch.distributed as dist

from plscale.charts import precision as charts
from plscale.predict.formats import number_format
from plscale.predict.presets import preset
from plscale.strategies.precision import fp8
from plscale.rank import runtime, taps
from plscale.rank.data import wikitext
from plscale.rank.metrics import figure
from plscale.rank.models.llama import Llama
from plscale.rank.utilization import Utilization

ctx = runtime.start(__file__)
S, ds, dev, N = ctx.settings, ctx.ds_config, ctx.device, ctx.world_size
steps, seq, accum = S["train"]["steps"], S["model"]["seq"], ds["gradient_accumulation_steps"]
formats = [number_format(name) for name in S["fp8"]["formats"]]

# ---- The formats, from their bits (plscale/predict/formats.py) -------------------------------
ctx.log(f"{'format':8}{'largest':>10}{'smallest normal':>17}{'smallest':>11}{'rounding error':>16}{'binades':>9}")
for f in formats:
    ctx.log(f"{f.name:8}{f.max:10g}{f.min_normal:17.3g}{f.min_subnormal:11.3g}{f.rounding_error:16.3g}{f.binades:9.0f}")

# ---- A few steps of ordinary training, so the tensors are those of a model that learns --------
corpus = wikitext.load_text()
tokens = wikitext.tokenize(corpus, preset(S["model"]["preset"]).vocab)
config = replace(preset(S["model"]["preset"]), attention=S["model"]["attention"]).with_vocab(tokens.vocab)
shards = wikitext.Shards(wikitext.pack(tokens.train, seq), ds["train_micro_batch_size_per_gpu"], accum, ctx.rank, N,
                         S["seed"])
torch.manual_seed(S["seed"])
model = Llama(config)
engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=ds)
precision = "bf16" if engine.bfloat16_enabled() else "fp16" if engine.fp16_enabled() else "fp32"
ctx.log(f"\ndata: {corpus.source}\ntraining '{S['model']['preset']}' {steps} steps in {precision}, then one "
        f"batch's tensors at its {sum(isinstance(m, torch.nn.Linear) for m in model.modules())} linear layers")
util, times = Utilization(ctx, config, seq, ds["train_micro_batch_size_per_gpu"] * accum * N * seq, precision), []
for step in range(steps):
    total = torch.zeros((), dtype=torch.float64, device=dev)
    t0 = time.perf_counter()
    for block in shards.step(step):
        block = block.to(dev)
        loss = engine(block[:, :-1], block[:, 1:])
        engine.backward(loss)
        engine.step()
        total += loss.detach().double()
    dist.all_reduce(total)  # the loss read back (.item) ends the step: a training loop's own log does the same
    times.append(time.perf_counter() - t0)
    ctx.metrics.step(step=step, loss=total.item() / (N * accum), step_time_s=times[-1], **util.of_step(times[-1]))
    ctx.metrics.progress("training", step + 1, steps, f"loss {total.item() / (N * accum):.4f}")

# ---- One batch's real tensors, in fp32, cast to each format with and without scaling ----------
figures, results = util.figures(times[1:] or times), {}  # the first step warms up: untimed
pair = lambda got, want, width, digits: f"{100 * got:.{digits}f}% / {100 * want:.{digits}f}%".rjust(width)
if ctx.is_main:
    probe = Llama(config).to(dev)                 # the trained weights, in fp32, outside the engine
    probe.load_state_dict(engine.module.state_dict())
    block = shards.step(steps)[0].to(dev)
    acts, grads = taps.capture(probe, block[:, :-1], block[:, 1:])
    exact, bounded, rescued = True, True, True
    for kind, tensors in (("activations", acts), ("gradients", grads)):
        values = list(tensors.values())
        amax = [t.abs().max().item() for t in values]
        ctx.log(f"\n{kind} ({'inputs of' if kind == 'activations' else 'gradients at the outputs of'} the "
                f"{len(values)} linears, {sum(t.numel() for t in values):,} values, rank 0): largest |x| per tensor "
                f"2^{math.log2(min(amax)):.1f} to 2^{math.log2(max(amax)):.1f}")
        ctx.log(f"  each entry measured / predicted; the last column measured only\n"
                f"  {'':6}{'scaling':12}{'flushed to 0':>22}{'past the largest':>22}{'worst error (normal)':>26}"
                f"{'mean over tensors of ||q/s-x||/||x||':>40}")
        for f in formats:
            for scaled in (False, True):
                c = fp8.cast_all(values, f, scaled)
                got = c.fractions()
                label, name = ("per-tensor", "per-tensor scaling") if scaled else ("unscaled", "unscaled")
                worst = pair(got["worst_error"], f.rounding_error, 26, 2) if c.normal else "n/a (no normal entry)".rjust(26)
                ctx.log(f"  {f.name:6}{label:12}" + pair(got["flushed"], got["flushed_predicted"], 22, 3)
                        + pair(got["clipped"], got["clipped_predicted"], 22, 3)
                        + worst + f"{100 * got['error']:.2f}%".rjust(40)
                        + (f" ({got['infinite']:.2%} inf)" if got["infinite"] else ""))
                exact &= c.flushed == c.flushed_predicted and c.clipped == c.clipped_predicted
                bounded &= c.worst_error <= f.rounding_error * (1 + 1e-6)
                results[f"{kind}, {f.name}, {label}"] = got
                figures += [figure(f"{kind} in {f.name}, {name}: flushed to 0", round(100 * got["flushed"], 4),
                                   "%", round(100 * got["flushed_predicted"], 4)),
                            figure(f"{kind} in {f.name}, {name}: error (mean over tensors)",
                                   round(100 * got["error"], 3), "%", None,
                                   f"worst normal-range entry {100 * got['worst_error']:.2f}% (at most "
                                   f"{100 * f.rounding_error:g}%)" if c.normal else "no entry in the normal range")]
            rescued &= results[f"{kind}, {f.name}, per-tensor"]["error"] <= f.rounding_error
    ctx.log("\nwithout scaling the gradients sit below fp8's smallest values and flush to 0; per-tensor scaling moves "
            "each tensor's largest entry onto the format's largest,\nso nothing overflows and the rest keeps the "
            "format's 2-3 bits, down to what falls below its range (fp8.png)")
    ctx.check("the casts flush and clip as the formats' ranges predict", exact,
              "entries cast to 0, and to inf or saturated from beyond the largest, counted in q exactly where "
              "|x s| <= smallest / 2 and |x s| > largest predict")
    ctx.check("rounding error within 2^-(m+1) in the normal range", bounded,
              ", ".join(f"{f.name} at most {100 * f.rounding_error:g}%" for f in formats))
    ctx.check("with per-tensor scaling, the error stays within the format's rounding error", rescued,
              ", ".join(f"{k}: {100 * v['error']:.2f}%" for k, v in results.items() if k.endswith("per-tensor")))
    panels = {}
    for kind, tensors in (("activations (inputs of the linears)", acts), ("gradients at the linears' outputs", grads)):
        panels[kind] = {"as they are": taps.log2_histogram(tensors.values())} | {
            f"scaled for {f.name}": taps.log2_histogram(fp8.scaled(tensors.values(), f)) for f in formats}
    charts.range_histograms(ctx.run_dir / "fp8.png", panels, formats,
                            "real tensors against fp8's ranges, with and without per-tensor scaling",
                            colors={f"scaled for {f.name}": charts.COLORS.get(f.name) for f in formats})
ctx.finish(figures, data=corpus.source, real_data=corpus.real, tokenizer=tokens.tokenizer, precision=precision,
           formats=[f.name for f in formats], casts=results)
