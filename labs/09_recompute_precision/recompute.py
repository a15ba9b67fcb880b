"""Lab 09, activation recomputation: keep less in the forward, rebuild it in the backward.

A layer's backward needs what its forward computed, so autograd keeps it all from the forward
until the backward: with long sequences, the activations outgrow the model. Recomputation keeps
only a region's inputs and runs the region's forward again inside the backward, just before its
backward needs the rest (plscale/rank/recompute.py):

    none       every layer keeps everything
    selective  the attention core is rebuilt (Megatron's selective recomputation): its heads x
               s x s probabilities, large and cheap to compute, are not kept
    full       every layer is rebuilt (torch.utils.checkpoint): each keeps only its input, and
               a step pays about one more forward
    deepspeed  full recomputation through DeepSpeed's activation checkpointing API

Each strategy trains the same model from the same weights on the same batches. On one step the
allocator's history (torch.profiler, profile_memory) records every allocation and free, so the
lab sees what each strategy keeps at the end of the forward, what each layer keeps, and which
layers' forwards run again inside the backward. Beside each measurement, its prediction
(plscale estimate memory --recompute), and the losses, which recomputation must not change.

    plscale lab run recompute --gpus 2     (--set recompute.layers=2: only the first 2 layers)
    deepspeed --num_gpus 2 labs/09_recompute_precision/recompute.py
        (DS_ACCELERATOR=cpu without GPUs; PLSCALE_DATA_DIR=path/to/wikitext-2 for the real data)
"""

import copy
import statistics
import time
from dataclasses import replace

import deepspeed
import torch
import torch.distributed as dist

from plscale import plots
from plscale.predict import memory
from plscale.predict import recompute as predict
from plscale.predict.presets import preset
from plscale.rank import allocations, recompute, runtime
from plscale.rank.data import wikitext
from plscale.rank.metrics import figure
from plscale.rank.models.llama import Llama
from plscale.rank.reference import largest_gap

MiB = 2**20
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
ctx.log(f"data: {corpus.source}\nmodel: '{S['model']['preset']}', {config.layers} layers, {config.attention} "
        f"attention core, seq {seq}; recomputing {f'the first {k}' if k else 'every'} layer of {config.layers}")

# ---- What each strategy should keep: the memory model, asked about this run ------------------
base = memory.setup_from_ds_config(ds, N, config, seq)


def layers_of(strategy: str) -> int:
    """The layers a strategy is asked to recompute: the first k, none without recomputation."""
    return 0 if strategy == "none" else k


def setup_of(strategy: str) -> memory.Setup:
    return replace(base, recompute=strategy, recompute_layers=layers_of(strategy))


# ---- Training: every strategy from the same initial weights, on the same batches -------------
torch.manual_seed(seed)
initial = copy.deepcopy(Llama(config).state_dict())
engines = {}
for strategy in strategies:
    model = Llama(config)
    model.load_state_dict(initial)
    recompute.apply(model, strategy, layers_of(strategy), ds)
    engines[strategy], *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=ds)


def train_step(engine, step: int) -> float:
    """One optimizer step, its phases marked for the allocator's history; the mean loss."""
    loss_sum = torch.zeros((), device=dev)
    for block in shards.step(step):
        x, y = block[:, :-1].to(dev), block[:, 1:].to(dev)
        with allocations.phase("forward"):
            loss = engine(x, y)
        with allocations.phase("backward"):
            engine.backward(loss)
        with allocations.phase("step"):
            engine.step()
        loss_sum += loss.detach()
    dist.all_reduce(loss_sum)
    return loss_sum.item() / (N * ds["gradient_accumulation_steps"])


# The strategies take turns step by step, so whatever else the machine does slows them alike.
# The recorded step pays for the profiler, and the first for allocating: neither is timed.
losses, times, histories = {s: [] for s in strategies}, {s: [] for s in strategies}, {}
for step in range(steps):
    for strategy, engine in engines.items():
        t0 = time.perf_counter()
        if step == record_step:
            with allocations.record(dev) as rec:
                losses[strategy].append(train_step(engine, step))
            histories[strategy] = rec.history
        else:
            losses[strategy].append(train_step(engine, step))
            times[strategy].append(time.perf_counter() - t0)
        ctx.metrics.step(strategy=strategy, step=step, loss=losses[strategy][-1], step_time_s=time.perf_counter() - t0)
    ctx.metrics.progress("training", step + 1, steps, "  ".join(f"{s} {losses[s][-1]:.4f}" for s in strategies))
runs = {s: {"losses": losses[s], "step_s": statistics.median(times[s][1:] or times[s]), "history": histories[s],
            "layers": recompute.measured_layers(histories[s], config.layers)} for s in strategies}

# ---- 1. Activations kept at the end of the forward, per rank: measured / predicted -----------
mine = {s: r["history"].kept() for s, r in runs.items()}
everyone = [None] * N
dist.all_gather_object(everyone, mine)
figures, tol = [], S["memory"]["tolerance"]
if ctx.is_main:
    ctx.log(f"\nactivations kept for backward at the end of the forward, MiB per rank (allocator history of step "
            f"{record_step}), against the memory model (plscale estimate memory --recompute ...)")
    ctx.log(f"  {'strategy':11}" + "".join(f"{'rank ' + str(r):>10}" for r in range(N))
            + f"{'predicted':>11}{'error':>8}")
    for strategy in strategies:
        kept, want = [m[strategy] for m in everyone], memory.activation_bytes(setup_of(strategy))
        error = max(abs(v - want) for v in kept) / want
        ctx.log(f"  {strategy:11}" + "".join(f"{v / MiB:10.2f}" for v in kept)
                + f"{want / MiB:11.2f}{100 * error:7.2f}%")
        ctx.check(f"{strategy}: activations kept as predicted", error <= tol,
                  f"worst rank off by {100 * error:.2f}% (tolerance {100 * tol:g}%)")
        figures.append(figure(f"{strategy}: activations kept per rank (max)", round(max(kept) / MiB, 3), "MiB",
                              round(want / MiB, 3), f"error {100 * error:.2f}%"))

# ---- 2. What the backward rebuilds at once, and the step's peak ------------------------------
# A rerun's allocations still held when it ends: what its backward is about to use. The peak of
# the step adds the gradients and the head's transients to the activations: measured only.
if ctx.is_main:
    ctx.log("\nrebuilt at once in the backward (the largest rerun, rank 0), MiB, measured / predicted; "
            "the step's peak above its start")
    for strategy in strategies:
        r, setup = runs[strategy], setup_of(strategy)
        rebuilt, want = max([row["rebuilt"] for row in r["layers"]] + [0]), memory.rebuilt_bytes(setup)
        peak = r["history"].peak()
        ctx.log(f"  {strategy:11}{rebuilt / MiB:8.2f} / {want / MiB:<8.2f}   peak {peak / MiB:8.2f}")
        figures += [figure(f"{strategy}: rebuilt at once in backward", round(rebuilt / MiB, 3), "MiB",
                           round(want / MiB, 3), "the largest rerun's allocations, held at its end; rank 0"),
                    figure(f"{strategy}: peak of the step above its start", round(peak / MiB, 3), "MiB", None,
                           "activations, gradients and the head's transients; rank 0")]

# ---- 3. Step time: recomputation pays in forwards --------------------------------------------
if ctx.is_main:
    ctx.log("\nstep time against no recomputation's (measured; predicted from FLOPs; printed, not checked: "
            "the cores are shared)")
    for strategy in strategies:
        ratio = runs[strategy]["step_s"] / runs["none"]["step_s"] if "none" in runs else None
        want = predict.time_ratio(config, seq, strategy, layers_of(strategy))
        ctx.log(f"  {strategy:11}{runs[strategy]['step_s']:8.3f} s" + (f"{ratio:8.3f} x" if ratio else "")
                + f"   predicted {want:.3f} x")
        figures.append(figure(f"{strategy}: step time / no recomputation's", ratio and round(ratio, 3), "x",
                              round(want, 3), f"{runs[strategy]['step_s']:.3f} s per step"))

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
        ctx.check(f"{strategy}: losses equal {reference}'s", gap <= loss_tol,
                  f"largest relative gap over {steps} steps {gap:.1e} (tolerance {loss_tol:.1e})")
        figures.append(figure(f"{strategy}: largest loss gap to {reference}", gap, "relative", 0.0))
    xs = list(range(steps))
    plots.curves_and_gaps(ctx.run_dir / "loss.png", {s: (xs, r["losses"]) for s, r in runs.items()}, reference,
                          f"loss with each recomputation strategy ('{S['model']['preset']}', seq {seq})")

# ---- 5. The pictures: memory over one step, and what each layer keeps and rebuilds -----------
if ctx.is_main:
    from plscale import recompute_charts

    predicted = {s: memory.activation_bytes(setup_of(s)) for s in strategies}
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
           layers={s: r["layers"] for s, r in runs.items()},
           reran={s: recompute.reran(r["history"]) for s, r in runs.items()})
