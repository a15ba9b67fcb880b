"""Lab 10: the same strategies in JAX. Annotate how each array is split over a mesh; XLA writes the collectives.

PyTorch's labs split the work by hand: DeepSpeed's ZeRO-3 gathers each layer's weights before
it runs, Megatron's f and g all-reduce the activations, the pipeline engine sends them to the
next stage. JAX asks only where each array lives: a `Mesh` of devices with named axes, and a
`PartitionSpec` per array saying which of its dimensions is split over which axis. The
compiler (GSPMD) then partitions the program and inserts the collectives itself. This lab
trains the same Llama-shaped mini-GPT four ways on one mesh:

    dp         data n                 batch split; weights, gradients, Adam moments replicated  (ZeRO-0)
    fsdp       data n                 ... and every tensor split over data too                   (ZeRO-3)
    fsdp_tp    data n/2 x model 2     ... and heads, MLP, vocabulary over model                  (ZeRO-3 x TP)
    pipeline   stage 2 x data n/2     layers split over stage, GPipe by hand with shard_map      (lab 05)

from the weights of the PyTorch model, on the same WikiText-2 batches, and checks that every
layout follows one loss curve, that the first loss is the PyTorch model's, that each device
holds what the memory model predicts, and lists the collectives XLA compiled beside those the
PyTorch twins issue by hand (plscale/predict/sharding.py).

    plscale lab run jax --gpus 4        (4 simulated CPU devices in one process without GPUs)
    XLA_FLAGS=--xla_force_host_platform_device_count=4 python labs/10_jax_gspmd/gspmd.py
"""

import time

import numpy as np
import torch

from plscale.jaxlab import runtime

ctx = runtime.start(__file__)  # before jax picks its devices

import jax  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402

from plscale.charts import plots  # noqa: E402
from plscale.jaxlab import hlo, layouts, placement, weights  # noqa: E402
from plscale.jaxlab.adam import Adam  # noqa: E402
from plscale.jaxlab.peak import matmul_peak, shares  # noqa: E402
from plscale.predict import recompute, sharding  # noqa: E402
from plscale.predict.presets import param_count, preset  # noqa: E402
from plscale.predict.tensor_parallel import megatron_paper_count  # noqa: E402
from plscale.rank.data import wikitext  # noqa: E402
from plscale.rank.metrics import figure  # noqa: E402
from plscale.rank.models.llama import Llama  # noqa: E402
from plscale.predict.units import MiB  # noqa: E402
from plscale.rank.against_dense import largest_gap, reference_losses  # noqa: E402

S, ds, n = ctx.settings, ctx.ds_config, ctx.world_size
seq, seed, steps = S["model"]["seq"], S["seed"], S["train"]["steps"]
batch_size, micro_batches = ds["train_micro_batch_size_per_gpu"] * n, S["pipeline"]["micro_batches"]
ctx.log(f"devices: {n} x {ctx.devices[0].device_kind} ({ctx.platform}), one process")

# ---- Data: WikiText-2 blocks; one global batch per step, split over the data axis by its spec ----
corpus = wikitext.load_text()
tokens = wikitext.tokenize(corpus, preset(S["model"]["preset"]).vocab)
vocab = -(-tokens.vocab // n) * n  # a vocabulary every axis divides (Megatron pads it to tp likewise)
config = preset(S["model"]["preset"]).with_vocab(vocab)
shards = wikitext.Shards(wikitext.pack(tokens.train, seq), batch_size, 1, 0, 1, seed)
batches = [shards.step(t)[0] for t in range(steps)]  # (batch, seq + 1) int64 tensors
ctx.log(f"data: {corpus.source}; global batch {batch_size} x {seq} tokens, vocabulary {vocab}")

# ---- The PyTorch model: its weights start every layout; its loss curve is the reference -------
torch.manual_seed(seed)
dense = Llama(config)
start = weights.from_torch(dense)
want = reference_losses(dense, ds, lambda t: [(batches[t][:, :-1], batches[t][:, 1:])], steps)
ctx.log(f"model: Llama-shaped {S['model']['preset']!r}, Ψ = {param_count(config):,} parameters; "
        f"PyTorch (one process, torch Adam) trained {steps} steps: loss {want[0]:.4f} -> {want[-1]:.4f}")

# ---- The four layouts: one mesh each, the same weights and batches --------------------------
opt, results = Adam(ds), {}
peak, step_flops = matmul_peak(ctx.devices), recompute.step_flops(config, seq).step * batch_size * seq
mfu = lambda step_s: step_flops / step_s / (peak.flops * shares(ctx.devices))  # noqa: E731  (per device on GPUs)
ctx.log(f"peak: {peak.describe()}" + (", shared by the simulated devices: MFU is the process's" if
                                      shares(ctx.devices) == 1 else ", a device's"))
for name in S["layouts"]:
    plan = sharding.mesh(name, n, S["mesh"]["tp"], S["mesh"]["stages"])
    mesh = layouts.device_mesh(plan, ctx.devices)
    params, state = layouts.place(name, mesh, start, opt.init(start))
    on_data = NamedSharding(mesh, layouts.BATCH)  # tokens and targets: the batch over "data"

    def put(b):
        return jax.device_put(np.asarray(b[:, :-1]), on_data), jax.device_put(np.asarray(b[:, 1:]), on_data)

    step_fn = layouts.train_step(name, mesh, config, opt, micro_batches)
    compiled = step_fn.lower(params, state, *put(batches[0])).compile()
    held = {"parameters": placement.largest(placement.bytes_per_device(params)),
            "moments": placement.largest(placement.bytes_per_device((state["m"], state["v"])))}
    losses, times = [], []
    for t, b in enumerate(batches):
        x, y = put(b)
        t0 = time.perf_counter()
        params, state, loss = step_fn(params, state, x, y)
        losses.append(float(loss))
        times.append(time.perf_counter() - t0)
        ctx.metrics.step(layout=name, step=t, loss=losses[-1], step_time_s=times[-1],
                         tokens_per_s=batch_size * seq / times[-1], mfu=round(mfu(times[-1]), 6))
        ctx.metrics.progress(name, t + 1, steps, f"loss {losses[-1]:.4f}")
    ops = hlo.collectives(compiled.as_text())
    results[name] = {"mesh": plan, "losses": losses, "held": held, "predicted": sharding.states_per_device(config, plan),
                     "xla": hlo.tally(ops, tuple(mesh.shape.items())), "ops": ops, "axes": tuple(mesh.shape.items()),
                     "analysis": placement.memory_analysis(compiled),
                     "by_hand": sharding.by_hand(config, plan, seq, batch_size, micro_batches),
                     "step_s": float(np.median(times[1:]))}
    ctx.log(f"\n{name} on mesh {plan}: loss {losses[0]:.6f} -> {losses[-1]:.6f}, {results[name]['step_s']:.3f} s/step")

# ---- Parity: one loss curve, and the PyTorch model's first loss -----------------------------
tolerance, first = S["parity"]["tolerance"], S["layouts"][0]
ctx.log("\nloss curves (first, last step):")
for name, r in results.items():
    ctx.log(f"  {name:9s} {r['losses'][0]:.6f} {r['losses'][-1]:.6f}   largest gap to PyTorch "
            f"{largest_gap(r['losses'], want):.1e}")
ctx.check("the first loss is the PyTorch model's on the same weights and batch",
          abs(results[first]["losses"][0] - want[0]) <= S["parity"]["first_loss"] * abs(want[0]),
          f"JAX {results[first]['losses'][0]:.7f}, PyTorch {want[0]:.7f} (tolerance {S['parity']['first_loss']:g}, "
          f"relative: one forward pass, reductions in another order)")
gaps = {name: largest_gap(r["losses"], results[first]["losses"]) for name, r in results.items() if name != first}
if gaps:
    ctx.check(f"every layout follows {first}'s loss curve", max(gaps.values()) <= tolerance,
              ", ".join(f"{k} {v:.1e}" for k, v in gaps.items()) + f" (largest relative gap; tolerance {tolerance:g})")

# ---- Memory: what each device holds, against the memory model -------------------------------
ctx.log("\nper device, MiB        parameters (measured / predicted)   Adam moments (measured / predicted)")
for name, r in results.items():
    got, pred = r["held"], r["predicted"]
    ctx.log(f"  {name:9s} {str(r['mesh']):18s} {got['parameters'] / MiB:8.3f} / {pred['parameters'] / MiB:8.3f}"
            f"            {got['moments'] / MiB:8.3f} / {pred['moments'] / MiB:8.3f}")
    ctx.check(f"{name}: bytes per device as the memory model predicts", got == pred,
              f"parameters {got['parameters']:,} vs {pred['parameters']:,.0f}, moments {got['moments']:,} vs "
              f"{pred['moments']:,.0f} ({' and '.join(sharding.formulas(config, r['mesh']).values())})")

ctx.log("\nXLA's own accounting per device (compiled.memory_analysis()), MiB: arguments (what the step is given: "
        "parameters, moments, the batch) and temporaries (activations, gradients, gathered weights)")
for name, r in results.items():
    a = r["analysis"]
    if a["argument"] is not None:
        ctx.log(f"  {name:9s} arguments {a['argument'] / MiB:8.3f} (parameters + moments: "
                f"{(r['held']['parameters'] + r['held']['moments']) / MiB:8.3f})   temporaries {a['temp'] / MiB:8.3f}")

# ---- Collectives: what XLA compiled into one step, beside what the PyTorch twin does by hand ----
# Each by-hand row (plscale/predict/sharding.py) beside the bytes of XLA's ops doing that work along
# the same mesh axis in the same pass (on CPU a reduce-scatter is compiled as all-reduce + slice).
def xla(name, op, phase, axis):
    return hlo.carried(results[name]["xla"], op, phase, axis)


for name, r in results.items():
    ctx.log(f"\n{name} ({r['mesh']}): one step's collectives, by hand in {sharding.TWINS[name]} | compiled by XLA")
    shown = set()
    for c in r["by_hand"]:  # XLA's figure once per kind (op, pass, axis): rows of one kind share it
        count, nbytes = xla(name, c.op, c.phase, c.axis)
        theirs = "" if (c.op, c.phase, c.axis) in shown else f"x{count:<3d} {nbytes / MiB:8.3f} MiB"
        shown.add((c.op, c.phase, c.axis))
        ctx.log(f"  {c.phase:8s} {c.op:14s} over {c.axis:5s} x{c.calls:<3d} {c.total / MiB:8.3f} MiB  {c.where:54s}"
                f" | {theirs}")
    ctx.log("  all of XLA's: " + ", ".join(f"{op} {phase} over {'+'.join(axes) or '-'} x{n} {b / MiB:.3f} MiB"
                                          for (op, phase, axes), (n, b) in r["xla"].items()))
    low, high = sharding.gradient_bytes(config, r["mesh"])
    reduced = sum(b for (op, phase, axes), (_, b) in r["xla"].items()
                  if op in ("all-reduce", "reduce-scatter") and phase == "backward" and axes == ("data",))
    ctx.check(f"{name}: XLA reduces each gradient once over data", low <= reduced <= high,
              f"{reduced:,} bytes reduced; {low:,} of gradients, at most {high:,} with the tied embedding's "
              f"second part and the loss")
    if name in ("fsdp", "fsdp_tp") and r["mesh"].size("data") > 1:
        forward, backward = (xla(name, "all_gather", phase, "data")[0] for phase in ("forward", "backward"))
        ctx.check(f"{name}: XLA gathers the weights before the forward uses them and again in the backward, as "
                  f"ZeRO-3 does", forward > 0 and backward > 0, f"{forward} all-gathers forward, {backward} backward")
    if name == "fsdp_tp":
        count, paper = xla(name, "all_reduce", "forward", "model")[0], megatron_paper_count(config.layers)["forward"]
        ctx.check("fsdp_tp: Megatron's g, an all-reduce over model after attention and after the MLP",
                  count >= paper, f"{count} forward all-reduces over model; Megatron's count: {paper} "
                                  f"(2 per layer, {config.layers} layers)")
    if name == "pipeline":
        ticks = sharding.gpipe_ticks(r["mesh"].size("stage"), micro_batches)
        act = next(c.bytes for c in r["by_hand"] if c.op == "send_recv")
        for phase in ("forward", "backward"):  # the permutes inside the tick loop, one micro-batch each
            looped = [c for c in r["ops"] if c.op == "collective-permute" and c.phase == phase and c.runs == ticks
                      and hlo.axes_of(c, r["axes"]) == ("stage",)]
            ctx.check(f"pipeline: each of the m + p - 1 = {ticks} ticks passes one micro-batch on ({phase})",
                      len(looped) == 1 and looped[0].bytes == act,
                      ", ".join(f"{c.runs} runs of {c.bytes:,} bytes" for c in looped) + f" in the loop; {act:,} "
                      f"bytes a micro-batch")

# ---- Plots and figures ----------------------------------------------------------------------
curves = {name: (list(range(steps)), r["losses"]) for name, r in results.items()}
curves["PyTorch"] = (list(range(steps)), want)
plots.curves_and_gaps(ctx.run_dir / "loss_curves.png", curves, first, f"one loss curve, {n} devices",
                      note=f"check: relative gap <= {tolerance:g} ({tolerance * want[-1]:.1e} nats here)")
plots.measured_vs_predicted(ctx.run_dir / "memory.png",
                            {k: {name: (r["held"][k] / MiB, r["predicted"][k] / MiB) for name, r in results.items()}
                             for k in ("parameters", "moments")}, "bytes per device: measured vs memory model")
figures = [figure("largest gap to PyTorch's curve", max(largest_gap(r["losses"], want) for r in results.values()), "")]
for name, r in results.items():
    figures += [figure(f"{name}: parameters per device", r["held"]["parameters"] / MiB, "MiB",
                       r["predicted"]["parameters"] / MiB, str(r["mesh"])),
                figure(f"{name}: throughput", batch_size * seq / r["step_s"], "tokens/s",
                       note=f"median step {r['step_s'] * 1e3:.0f} ms"),
                figure(f"{name}: MFU", round(100 * mfu(r["step_s"]), 2), "%", None, f"vs {peak.describe()}")]
ctx.finish(figures, plots=["loss_curves.png", "memory.png"], data=corpus.source, real_data=corpus.real,
           vocab=vocab, pytorch_losses=want,
           losses={name: r["losses"] for name, r in results.items()},
           held={name: r["held"] for name, r in results.items()})
