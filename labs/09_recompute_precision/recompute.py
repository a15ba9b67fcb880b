"""Lab 09, activation recomputation: keep less in the forward, rebuild it in the backward.

A layer's backward needs what its forward computed, so autograd keeps it all from the forward
until the backward: with long sequences, the activations outgrow the model. Recomputation keeps
only a region's inputs and runs the region's forward again inside the backward, just before its
backward needs the rest (plscale/strategies/recompute/llama.py):

    none       every layer keeps everything
    selective  the attention core is rebuilt (Megatron's selective recomputation): its heads x
               s x s probabilities, large and cheap to compute, are not kept
    full       every layer is rebuilt (torch.utils.checkpoint): each keeps only its input, and
               a step pays about one more forward
    deepspeed  full recomputation through DeepSpeed's activation checkpointing API

Each strategy trains the same model from the same weights on the same batches. On one step the
allocator's history (torch.profiler, profile_memory) records every allocation and free, so the
lab sees what each strategy keeps at the end of the forward, what each layer keeps, and which
layers' forwards run again inside the backward. Beside each measurement, its prediction: what
the forward keeps, the first of the two parts `plscale estimate memory --recompute ...` adds up in
its activations row (kept at the forward's end + one rerun in the backward); and the losses,
which recomputation must not change.

    plscale lab run recompute --gpus 2     (--set recompute.layers=2: only the first 2 layers)
    deepspeed --num_gpus 2 labs/09_recompute_precision/recompute.py
        (DS_ACCELERATOR=cpu without GPUs; PLSCALE_DATA_DIR=path/to/wikitext-2 for the real data)
"""

import copy
import statistics
import time
from contextlib import contextmanager
from dataclasses import replace

import deepspeed
import torch
import torch.distributed as dist

from plscale.charts import plots
from plscale.predict import memory
from plscale.predict import recompute as predict
from plscale.predict.activations import activation_bytes, rebuilt_bytes
from plscale.predict.presets import preset
from plscale.predict.units import MiB
from plscale.rank import allocations, runtime
from plscale.rank.against_dense import follows, largest_gap
from plscale.rank.against_prediction import largest_error, mib_figure, within
from plscale.rank.distributed import gathered
from plscale.strategies.recompute import llama as recompute
from plscale.rank.data import wikitext
from plscale.rank.metrics import figure
from plscale.rank.models.llama import Llama
from plscale.rank.utilization import Utilization

ctx = runtime.start(__file__)
S, ds, dev, N = ctx.settings, ctx.ds_config, ctx.device, ctx.world_size
opts, seq, steps, seed = S["recompute"], S["model"]["seq"], S["train"]["steps"], S["seed"]
strategies, k = opts["strategies"], opts["layers"]
record_step = min(opts["record_step"], steps - 1)

# ---- Data: WikiText-2 in blocks of seq tokens; the same batches for every strategy ----------
corpus = wikitext.load_text()
tokens = wikitext.tokenize(corpus, preset(S["model"]["preset"]).vocab)
config = replace(preset(S["model"]["preset"]), attention=S["model"]["attention"]).with_vocab(tokens.vocab)
shards = wikitext.Shards(wikitext.pack(tokens.train, seq), ds["train_micro_batch_size_per_gpu"],
                         ds["gradient_accumulation_steps"], ctx.rank, N, seed)
chosen = "every layer" if not k else "the first layer" if k == 1 else f"the first {k} layers"
ctx.log(f"data: {corpus.source}\nmodel: '{S['model']['preset']}', {config.layers} layers, {config.attention} "
        f"attention core, seq {seq}; recomputing {chosen} of {config.layers}")

# ---- What each strategy should keep: the memory model, asked about this run ------------------
base = memory.setup_from_ds_config(ds, N, config, seq)
layers_of = {s: 0 if s == "none" else k for s in strategies}  # the layers each recomputes: the first k

setup_of = lambda s: replace(base, recompute=s, recompute_layers=layers_of[s])  # noqa: E731 (a memory.Setup)

# ---- Training: every strategy from the same initial weights, on the same batches -------------
torch.manual_seed(seed)
initial = copy.deepcopy(Llama(config).state_dict())
engines = {}
for strategy in strategies:
    model = Llama(config)
    model.load_state_dict(initial)
    recompute.apply(model, strategy, layers_of[strategy], ds)
    engines[strategy], *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=ds)
util = {s: Utilization(ctx, config, seq, ds["train_batch_size"] * seq, S["ds"]["precision"], s, layers_of[s]) for s in strategies}


@contextmanager
def phase(name: str, clock: dict):
    """A phase of the step, marked for the allocator's history, its seconds (on CUDA: its kernels') in `clock`."""
    t0 = time.perf_counter()
    with allocations.phase(name):
        yield
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
    clock[name] = clock.get(name, 0.0) + time.perf_counter() - t0


def train_step(engine, step: int, clock: dict) -> float:
    """One optimizer step, its phases marked and timed into `clock`; the mean loss."""
    loss_sum = torch.zeros((), device=dev)
    for block in shards.step(step):
        x, y = block[:, :-1].to(dev), block[:, 1:].to(dev)
        with phase("forward", clock):
            loss = engine(x, y)
        with phase("backward", clock):
            engine.backward(loss)
        with phase("step", clock):
            engine.step()
        loss_sum += loss.detach()
    dist.all_reduce(loss_sum)
    return loss_sum.item() / (N * ds["gradient_accumulation_steps"])


# The strategies take turns step by step, so whatever else the machine does slows them alike.
# The recorded step pays for the profiler, and the first for allocating: neither is timed.
losses, times, histories = {s: [] for s in strategies}, {s: [] for s in strategies}, {}
for step in range(steps):
    for strategy, engine in engines.items():
        t0, clock = time.perf_counter(), {}
        if step == record_step:
            with allocations.record(dev) as rec:
                losses[strategy].append(train_step(engine, step, clock))
            histories[strategy] = rec.history
        else:
            losses[strategy].append(train_step(engine, step, clock))
            times[strategy].append({"all": time.perf_counter() - t0, **clock})
        took = time.perf_counter() - t0
        ctx.metrics.step(strategy=strategy, step=step, loss=losses[strategy][-1], step_time_s=took,
                         **util[strategy].of_step(took))
    ctx.metrics.progress("training", step + 1, steps, "  ".join(f"{s} {losses[s][-1]:.4f}" for s in strategies))
timed = {s: times[s][1:] or times[s] for s in strategies}  # the first step allocates: not timed if others are
seconds = {s: {p: statistics.median(t[p] for t in timed[s]) for p in ("all", "forward", "backward", "step")}
           for s in strategies}  # each phase's median over the steps timed
runs = {s: {"losses": losses[s], "step_s": seconds[s]["all"], "phases_s": seconds[s], "timed": len(timed[s]),
            "history": histories[s], "layers": recompute.measured_layers(histories[s], config.layers)}
        for s in strategies}

# ---- 1. Activations kept at the end of the forward, per rank: measured / predicted -----------
everyone = gathered({s: r["history"].kept() for s, r in runs.items()})
figures, tol = [], S["memory"]["tolerance"]
if ctx.is_main:
    ctx.log(f"\nactivations kept for backward at the end of the forward, MiB per rank (allocator history of step "
            f"{record_step}), against the memory model: the 'kept at the end of the forward' of plscale estimate "
            f"memory --recompute ... (its activations row adds one rerun: section 2)")
    ctx.log(f"  {'strategy':11}" + "".join(f"{'rank ' + str(r):>10}" for r in range(N))
            + f"{'predicted':>11}{'error':>8}")
    for strategy in strategies:
        kept, want = [m[strategy] for m in everyone], activation_bytes(setup_of(strategy))
        error = largest_error((v, want) for v in kept)
        ctx.log(f"  {strategy:11}" + "".join(f"{v / MiB:10.2f}" for v in kept)
                + f"{want / MiB:11.2f}{100 * error:7.2f}%")
        ctx.check(*within(f"{strategy}: activations kept as predicted", [(v, want) for v in kept], tol))
        figures.append(mib_figure(f"{strategy}: activations kept per rank (max)", max(kept), want,
                                  f"error {100 * error:.2f}%"))

# ---- 2. What the backward rebuilds at once, and the step's peak ------------------------------
# A rerun's allocations still held when it ends: what its backward is about to use. The peak of
# the step adds the gradients and the head's transients to the activations: measured only.
if ctx.is_main:
    ctx.log("\nrebuilt at once in the backward (the largest rerun, rank 0), MiB, measured / predicted (the "
            "estimate's 'while one rerun runs in the backward'); the step's peak above its start")
    for strategy in strategies:
        r, setup = runs[strategy], setup_of(strategy)
        rebuilt, want = max([row["rebuilt"] for row in r["layers"]] + [0]), rebuilt_bytes(setup)
        peak = r["history"].peak()
        ctx.log(f"  {strategy:11}{rebuilt / MiB:8.2f} / {want / MiB:<8.2f}   peak {peak / MiB:8.2f}")
        figures += [mib_figure(f"{strategy}: rebuilt at once in backward", rebuilt, want,
                               "the largest rerun's allocations, held at its end; rank 0"),
                    mib_figure(f"{strategy}: peak of the step above its start", peak, None,
                               "activations, gradients and the head's transients; rank 0")]

# ---- 3. Step time: recomputation pays in forwards --------------------------------------------
# Each strategy's medians over the steps timed (neither the first nor the recorded one): with
# fewer than MIN_TIMED of them, a shared machine's noise is the ratio.
MIN_TIMED = 5
if ctx.is_main:
    ctx.log("\nstep time against no recomputation's: medians of the steps timed; predicted from FLOPs (unchecked: shared cores)")
    for strategy in strategies:
        r = runs[strategy]
        ratio = r["step_s"] / runs["none"]["step_s"] if "none" in runs else None
        want = predict.time_ratio(config, seq, strategy, layers_of[strategy])
        ctx.log(f"  {strategy:11}{r['step_s']:8.3f} s" + (f"{ratio:8.3f} x" if ratio else "")
                + f"   predicted {want:.3f} x   ({r['timed']} step{'s' * (r['timed'] != 1)} timed)")
        figures.append(figure(f"{strategy}: step time / no recomputation's", ratio and round(ratio, 3), "x",
                              round(want, 3), f"{r['step_s']:.3f} s per step, the median of {r['timed']} steps"))
        figures += util[strategy].figures([t["all"] for t in timed[strategy]], prefix=f"{strategy}: ")
    fewest = min(r["timed"] for r in runs.values())
    if fewest < MIN_TIMED:
        ctx.log(f"  only {fewest} step{'s' * (fewest != 1)} timed per strategy: at this length the ratios are noise "
                f"(--steps {steps + MIN_TIMED - fewest} or more times {MIN_TIMED})")
    ctx.log("\nthe same steps by phase, ms (medians), and the backward against the forward: measured / predicted "
            "from FLOPs, (2F + R) / F, R the rerun")
    for strategy in strategies:
        ms, flops = runs[strategy]["phases_s"], predict.step_flops(config, seq, strategy, layers_of[strategy])
        fwd, bwd, opt = (1e3 * ms[p] for p in ("forward", "backward", "step"))
        want = (flops.backward + flops.recompute) / flops.forward
        ctx.log(f"  {strategy:11}forward {fwd:7.1f}   backward {bwd:7.1f}   optimizer step {opt:6.1f}   "
                f"backward {bwd / fwd:5.2f} x the forward / {want:.2f}")
        figures.append(figure(f"{strategy}: backward / forward", round(bwd / fwd, 3), "x", round(want, 3),
                              f"forward {fwd:.1f} ms, backward {bwd:.1f} ms: medians of {runs[strategy]['timed']} "
                              f"steps, rank 0"))

# ---- 4. The losses: recomputation changes memory and time, never the numbers -----------------
# On CPU a rerun repeats the same kernels in the same order on the same inputs: the same bits
# (0.0 measured; tests/test_recompute.py holds them equal), so the tolerance is float32's epsilon,
# a hair. On CUDA the embedding's and the attention's backward add with atomics in whatever order
# the threads finish: even two runs of none differ by about 1e-7 a step, and the optimizer carries
# it on, so 1e-5, as the other labs' parity checks.
loss_tol = 1e-5 if dev.type == "cuda" else torch.finfo(torch.float32).eps
if ctx.is_main:
    reference = strategies[0]
    ctx.log(f"\nlosses, step by step, against {reference}'s (largest relative gap)")
    for strategy in strategies[1:]:
        gap = largest_gap(runs[strategy]["losses"], runs[reference]["losses"])
        ctx.log(f"  {strategy:11}{gap:10.1e}   final loss {runs[strategy]['losses'][-1]:.6f}")
        ctx.check(*follows(f"{strategy}: losses equal {reference}'s", runs[strategy]["losses"],
                           runs[reference]["losses"], loss_tol))
        figures.append(figure(f"{strategy}: largest loss gap to {reference}", gap, "relative", 0.0))
    xs, dashes = list(range(steps)), ["-", "--", "-.", ":"]  # each strategy its colour in both panels
    same = all(runs[s]["losses"] == runs[reference]["losses"] for s in strategies)
    plots.curves_and_gaps(ctx.run_dir / "loss.png", {s: (xs, r["losses"]) for s, r in runs.items()}, reference,
                          f"loss with each recomputation strategy ('{S['model']['preset']}', seq {seq})",
                          styles={s: f"C{i}{dashes[i % 4]}" for i, s in enumerate(strategies)},
                          note=f"every gap is exactly 0: each strategy's loss is {reference}'s, bit for bit, at every "
                               f"step\n(each line drawn on the floor, 1e-10, one over another)" if same else None)

# ---- 5. The pictures: memory over one step, and what each layer keeps and rebuilds -----------
if ctx.is_main:
    from plscale.charts import recompute as recompute_charts

    predicted = {s: activation_bytes(setup_of(s)) for s in strategies}
    recompute_charts.memory_over_step(ctx.run_dir / "memory_over_step.png",
                                      {s: r["history"] for s, r in runs.items()}, predicted,
                                      f"allocated during step {record_step}, rank 0 ('{S['model']['preset']}', "
                                      f"seq {seq}, {config.attention} core)")
    recompute_charts.layer_picture(ctx.run_dir / "layers.png", {s: r["history"] for s, r in runs.items()},
                                   {s: r["layers"] for s, r in runs.items()},
                                   f"kept, dropped and recomputed, layer by layer (rank 0, step {record_step})")
    figures.append(figure("final loss", round(runs[strategies[0]]["losses"][-1], 4), "nats"))
    ctx.log("\nmemory_over_step.png: allocated against time, each strategy; layers.png: what each layer kept, "
            "and what ran again in the backward; loss.png: the loss curves and their gaps")
ctx.finish(figures, data=corpus.source, real_data=corpus.real, tokenizer=tokens.tokenizer, model=config.to_dict(),
           seq=seq, strategies=strategies, recompute_layers=k, record_step=record_step,
           kept={s: [m[s] for m in everyone] for s in strategies},
           losses={s: r["losses"] for s, r in runs.items()}, step_s={s: r["step_s"] for s, r in runs.items()},
           steps_timed={s: r["timed"] for s, r in runs.items()},
           phases_s={s: {p: r["phases_s"][p] for p in ("forward", "backward", "step")} for s, r in runs.items()},
           layers={s: r["layers"] for s, r in runs.items()},
           reran={s: recompute.reran(r["history"]) for s, r in runs.items()})
