"""Lab 05: pipeline parallelism. GPipe and 1F1B by hand, DeepSpeed's and PyTorch's engines, the bubble.

The Llama-shaped model is cut into p stages, one per rank (two per rank when interleaved),
and each step's batch into m micro-batches that flow through them. Three engines run the
same cut of the same model: plscale's own schedules (plscale/strategies/pipeline/schedules.py),
DeepSpeed's PipelineModule, and torch.distributed.pipelining. Every one must give the loss
the unpipelined model gives on the same data. Then the lab times every forward, backward
and transfer, draws the timeline beside the planned schedule, measures the bubble against
(p-1)/(m+p-1) for several m, and counts the activations each stage holds in flight.

    plscale lab run pipeline --gpus 2              (1f1b; gpipe, deepspeed, torch-1f1b, torch-interleaved, ...)
    plscale lab run pp-dp                          (DeepSpeed, 2 stages x 2 replicas on 4 ranks)
    deepspeed --num_gpus 2 labs/05_pipeline/train.py --variant gpipe   (DS_ACCELERATOR=cpu without GPUs)
    torchrun --nproc_per_node 2 labs/05_pipeline/train.py --variant torch-1f1b
"""

import contextlib
import statistics
import time

import torch
import torch.distributed as dist

from plscale.charts import timeline
from plscale.predict import memory, pipeline as plan
from plscale.predict.activations import activation_bytes
from plscale.predict.presets import preset
from plscale.predict.units import MiB
from plscale.rank import runtime
from plscale.rank.against_dense import follows, reference_losses, step_by_step
from plscale.rank.census import activations_in_flight
from plscale.rank.data import wikitext
from plscale.rank.mesh import Mesh
from plscale.rank.metrics import figure
from plscale.rank.models.llama import Llama
from plscale.rank.models.llama_pieces import piece_names
from plscale.rank.utilization import Utilization

ctx = runtime.start(__file__)
S, ds, dev = ctx.settings, ctx.ds_config, ctx.device
P, seq, seed = S["parallel"]["pp"], S["model"]["seq"], S["seed"]
micro, m = ds["train_micro_batch_size_per_gpu"], ds["gradient_accumulation_steps"]
engine_name, schedule = S["pipeline"]["engine"], S["pipeline"]["schedule"]
v = S["pipeline"]["virtual"] if schedule == "interleaved" else 1

# ---- The process groups: each pipeline's stages, each stage's replicas (the mesh) --------
mesh = Mesh.build(pp=P, dims=("pp", "dp"))
dp, replica, stage = mesh.size("dp"), mesh.rank_in("dp"), mesh.rank_in("pp")
ctx.log(f"mesh: {mesh.layout}; pipelines (pp groups) {mesh.layout.groups('pp')}, "
        f"replicas (dp groups) {mesh.layout.groups('dp')}")

# ---- Data: WikiText-2 blocks; every stage of a pipeline reads its replica's batch ----------
config = preset(S["model"]["preset"])
corpus = wikitext.load_text()
tokens = wikitext.tokenize(corpus, config.vocab)
config = config.with_vocab(tokens.vocab)
blocks = wikitext.pack(tokens.train, seq)


def batch(step: int, count: int, of_replica: int = replica) -> list:
    """Replica `of_replica`'s `count` micro-batches of step `step`, as (tokens, targets)."""
    shards = wikitext.Shards(blocks, micro, count, of_replica, dp, seed)
    return [(b[:, :-1], b[:, 1:]) for b in shards.step(step)]


ctx.log(f"data: {corpus.source}; {len(blocks):,} blocks of {seq} tokens, tokenizer {tokens.tokenizer}")

# ---- The model, built whole on every rank with the seed, then cut by the engine ----------
torch.manual_seed(seed)
reference = Llama(config).to(dev)
if engine_name == "deepspeed":
    from plscale.strategies.pipeline.deepspeed_engine import DeepSpeedPipeline
    engine = DeepSpeedPipeline(reference, mesh, ds, partition=S["pipeline"]["partition"])
elif engine_name == "torch":
    from plscale.strategies.pipeline.torch_engine import TorchPipeline
    engine = TorchPipeline(reference, mesh, ds, schedule=schedule, virtual=v)
else:
    from plscale.strategies.pipeline.plscale_engine import PlscalePipeline
    engine = PlscalePipeline(reference, mesh, ds, schedule=schedule)
names = piece_names(config)
ctx.log(f"\n{engine_name} engine, {schedule}, p={P} stages{f' x {v} per rank' if v > 1 else ''}, "
        f"m={m} micro-batches of {micro} x {seq} tokens; the partition:")
for s, (a, b) in enumerate(engine.parts):
    ctx.log(f"  stage {s} (rank {s % P} of the pipeline): {names[a]} .. {names[b - 1]}")
if engine_name == "deepspeed":  # DeepSpeed builds its own groups: they must be the mesh's
    same = torch.tensor([engine.groups == {"pp": mesh.ranks("pp"), "dp": mesh.ranks("dp")}], dtype=torch.int)
    dist.all_reduce(same, op=dist.ReduceOp.MIN)
    ctx.log(f"  DeepSpeed's grid on rank 0: pipeline {engine.groups['pp']}, replicas {engine.groups['dp']}")
    ctx.check("DeepSpeed's groups are the mesh's", bool(same.item()), "pp and dp ranks equal on every rank")

# ---- Training; activations in flight counted during one step ------------------------------
steps, util = S["train"]["steps"], Utilization(ctx, config, seq, micro * m * dp * seq, S["ds"]["precision"])
census_step = min(S["memory"]["census_step"], steps - 1)
losses, times, peak = [], [], 0
for step in range(steps):
    t0 = time.perf_counter()
    with activations_in_flight() if step == census_step else contextlib.nullcontext() as acts:
        losses.append(engine.step(batch(step, m)))
    times.append(time.perf_counter() - t0)
    peak = acts.peak if step == census_step else peak
    ctx.metrics.step(step=step, loss=losses[-1], step_time_s=times[-1], **util.of_step(times[-1]))
    ctx.metrics.progress(f"{engine_name} {schedule}", step + 1, steps, f"loss {losses[-1]:.4f}")
last_ops = engine.ops


# ---- Parity: the unpipelined model, trained on the same batches (rank 0) ------------------
def every_replica(step: int) -> list:
    return [(x.to(dev), y.to(dev)) for r in range(dp) for x, y in batch(step, m, r)]


parity = min(S["train"]["parity_steps"], steps)
if ctx.is_main and parity:
    torch.manual_seed(seed)
    want = reference_losses(Llama(config).to(dev), ds, every_replica, parity)
    ctx.log("\nloss, pipelined vs unpipelined: " + step_by_step(losses, want))
    ctx.check(*follows("pipelined loss equals the unpipelined model's", losses, want))


# ---- The timeline: one step, measured, beside the plan --------------------------------------
def pipeline_ops(ops) -> list:
    """Every rank's ops of the first pipeline (replica 0), gathered on rank 0, as plan.Op."""
    everyone = [None] * ctx.world_size
    dist.all_gather_object(everyone, [o.to_dict() for o in ops] if replica == 0 else [])
    return [plan.Op(**o) for ranks in everyone for o in ranks]


plan_schedule = "1f1b" if engine_name == "deepspeed" else schedule
measured_ops = pipeline_ops(last_ops)
if ctx.is_main:
    planned = plan.simulate(plan_schedule, P, m, v)
    timeline.draw_pair(ctx.run_dir / "timeline.png", measured_ops, planned,
                       f"measured: {engine_name} {schedule}, p={P}, m={m}, step {steps - 1}: "
                       f"bubble {100 * plan.bubble_of(measured_ops):.1f}%",
                       f"planned: {plan_schedule}, forward 1, backward 2: bubble {100 * plan.bubble_of(planned):.1f}%")

# ---- The bubble against m: a few steps at each m, the median of all but the first ----------
# Theory assumes equal stages; the plan redone with this run's forward and backward times per
# stage (medians of the step above) shows what uneven stages alone would cost.
durations = {k: [statistics.median([o.end - o.start for o in measured_ops if o.kind == k and o.stage == s] or [0])
                 for s in range(P * v)] for k in "FB"}
rows = []
for count in S["bubble"]["micro_batches"]:
    engine.set_micro_batches(count)
    fractions = []
    for k in range(S["bubble"]["steps"]):
        engine.step(batch(steps + k, count))
        ops = pipeline_ops(engine.ops)
        fractions.append(plan.bubble_of(ops) if ctx.is_main else 0.0)
    uneven = plan.simulate(plan_schedule, P, count, v, f=durations["F"], b=durations["B"])
    rows.append({"m": count, "theory": plan.bubble_fraction(P, count, v),
                 "planned with measured stage times": plan.bubble_of(uneven),
                 "measured": statistics.median(fractions[1:])})
    ctx.metrics.progress("bubble against m", len(rows), len(S["bubble"]["micro_batches"]), f"m={count}")
engine.set_micro_batches(m)

# ---- Activations in flight per stage, against the memory model -----------------------------
peaks = [None] * ctx.world_size
dist.all_gather_object(peaks, peak)
setup = memory.setup_from_ds_config(ds, dp, config, seq)


def stage_bytes(s: int) -> float:
    """One micro-batch's saved activations on (virtual) stage s: its layers, and the head on the last."""
    a, b = engine.parts[s]
    layers = sum(1 for i in range(a, b) if 1 <= i <= config.layers)
    return activation_bytes(setup, layers=layers, head=b == config.layers + 3)


def held(order) -> str:
    n = plan.peak_in_flight(order)
    return f"{n} (micro-batch, chunk) pairs" if v > 1 else f"{n} micro-batch{'es' * (n != 1)}"


row_name = "rank" if v > 1 else "stage"  # interleaved: a rank runs v stages
figures, memory_rows = [], []
if ctx.is_main:
    ctx.log(f"\nactivations in flight at their peak (step {census_step}), MiB; prediction: micro-batches in "
            f"flight x one micro-batch's activations (plscale estimate memory)")
    first_pipeline = mesh.layout.groups("pp")[0]  # the global ranks of replica 0's stages
    for r, rank in enumerate(first_pipeline):
        order = plan.order(plan_schedule, P, m, r, v)
        predicted = plan.peak_bytes(order, {c: stage_bytes(c * P + r) for c in range(v)})
        error = abs(peaks[rank] - predicted) / predicted
        ctx.log(f"  {row_name} {r}: measured {peaks[rank] / MiB:8.2f}   predicted {predicted / MiB:8.2f}   "
                f"({held(order)} in flight)   error {100 * error:.1f}%")
        memory_rows.append({"stage": r, "measured_bytes": peaks[rank], "predicted_bytes": predicted})
        figures.append(figure(f"activations in flight, {row_name} {r}", round(peaks[rank] / MiB, 3), "MiB",
                              round(predicted / MiB, 3), f"error {100 * error:.1f}%"))
    worst = max(abs(x["measured_bytes"] - x["predicted_bytes"]) / x["predicted_bytes"] for x in memory_rows)
    ctx.check("activations in flight match the model", worst <= S["memory"]["tolerance"],
              f"worst {row_name} off by {100 * worst:.1f}% (tolerance {100 * S['memory']['tolerance']:g}%)")

    formula = "(p-1)/(v m+p-1)" if v > 1 else "(p-1)/(m+p-1)"
    ctx.log(f"\nthe bubble: idle share of each stage's step time, measured and {formula}")
    ctx.log(f"  {'m':>4}{'measured':>11}{'theory':>9}{'planned with measured stage times':>36}")
    for row in rows:
        ctx.log(f"  {row['m']:>4}{100 * row['measured']:10.1f}%{100 * row['theory']:8.1f}%"
                f"{100 * row['planned with measured stage times']:35.1f}%")
    ctx.log("  stage times, forward / backward, ms: " + ", ".join(
        f"{s}: {1e3 * f:.1f} / {1e3 * b:.1f}" for s, (f, b) in enumerate(zip(durations["F"], durations["B"]))))
    timeline.bubble_chart(ctx.run_dir / "bubble.png", rows, f"{engine_name} {schedule}, p={P}: the bubble against m")
    warm = [t for i, t in enumerate(times) if i >= len(times) // 4 and i != census_step] or times  # census: untimed
    step_s = statistics.median(warm)
    at_m = next((r for r in rows if r["m"] == m), None)
    figures += [figure("final loss", round(losses[-1], 4), "nats"),
                figure("step time", round(step_s, 4), "s", None,
                       f"median after the first quarter, the census step left out; m={m}"),
                *util.figures(warm, "all replicas")]
    if at_m:
        figures.append(figure(f"bubble at m={m}", round(100 * at_m["measured"], 1), "%", round(100 * at_m["theory"], 1),
                              "idle share of step time, mean over stages"))
    ctx.log("\ntimeline.png: the measured step above the planned one; bubble.png: the bubble against m")
ctx.finish(figures, data=corpus.source, real_data=corpus.real, tokenizer=tokens.tokenizer, engine=engine_name,
           schedule=schedule, stages=P, virtual=v, micro_batches=m, micro_batch=micro, seq=seq, replicas=dp,
           parts=engine.parts, losses=losses, bubble=rows, activations=memory_rows,
           timeline=[o.to_dict() for o in measured_ops])
