"""Lab 11: 4D parallelism. One Llama split by data, tensor, pipeline and context parallelism at once.

The world's ranks form a 4D mesh in Megatron's order, tp-cp-dp-pp: tp neighbours fastest
(each layer's weights split across them), then cp (each sequence's tokens split across them),
then dp (replicas that read other batches), pp slowest (the pipeline's stages). Each rank holds
one stage's layers (pp), a t-th of each of their weight matrices (tp), and s/cp tokens of each
sequence (cp); its replica's micro-batches flow through the stages by 1F1B. After the schedule
the tied embedding and head sum their gradients over the first and last stage, and dp x cp sums
the context shares and averages the replicas: ZeRO-1 (ds.stage 1) reduce-scatters, steps AdamW
on each rank's 1/(dp cp) and all-gathers; ds.stage 0 all-reduces, then AdamW on every rank.

Every piece is one the earlier labs built and checked alone (07: tensor-parallel layers, 08:
ring attention, 05: the 1F1B schedule, 02: data parallel); here they run together, and the
lab checks the whole against the dense model on one rank: every step's loss, and every rank's
shard after the first step.

    plscale lab run 4d --gpus 8              (dp2-tp2-pp2; tp2-pp2-cp2, dp2-tp2-cp2)
    torchrun --nproc_per_node 8 labs/11_4d/train.py --variant tp2-pp2-cp2
"""

import copy
import statistics
import time
from dataclasses import replace

import torch

from plscale.charts import plots, timeline
from plscale.predict import context_parallel as cp_predict, hybrid, memory, pipeline as plan, tensor_parallel as tp_predict
from plscale.predict.activations import activation_bytes
from plscale.predict.presets import param_count, preset
from plscale.predict.step_time import LABELS, TERMS
from plscale.predict.units import MiB
from plscale.rank import runtime
from plscale.rank.against_dense import every_replica, follows, largest_gap, reference_losses, step_by_step
from plscale.rank.against_prediction import memory_table, per_rank, per_rank_counts, within
from plscale.rank.data import wikitext
from plscale.rank.distributed import gathered
from plscale.rank.mesh import Mesh
from plscale.rank.metrics import figure
from plscale.rank.models.llama import Llama
from plscale.rank.utilization import Utilization
from plscale.strategies.context_parallel import ring_attention as ring
from plscale.strategies.context_parallel.llama import split_batch
from plscale.strategies.hybrid.stage import HybridStage
from plscale.strategies.hybrid.step import HybridStep
from plscale.strategies.tensor_parallel import operators as ops

ctx = runtime.start(__file__)
S, ds, dev = ctx.settings, ctx.ds_config, ctx.device
TP, PP, CP = (S["parallel"].get(k, 1) for k in ("tp", "pp", "cp"))
seq, seed, split, SP = S["model"]["seq"], S["seed"], S["cp"]["split"], S["tp"]["sequence_parallel"]
micro, m, ZERO = ds["train_micro_batch_size_per_gpu"], ds["gradient_accumulation_steps"], S["ds"]["stage"]

# ---- The mesh: Megatron's order, tp fastest, then cp, dp, and pp slowest ---------------------
# rank = tp_i + tp (cp_i + cp (dp_i + dp pp_i)): tp's all-reduces (every layer) stay between
# neighbouring ranks, one node's fast links; pp's activations (one tensor per micro-batch and
# stage boundary) cross between the farthest, the links between nodes.
mesh = Mesh.build(tp=TP, pp=PP, cp=CP, dims=("tp", "cp", "dp", "dp-cp", "pp"))
dp, replica, stage_id, me_cp = mesh.size("dp"), mesh.rank_in("dp"), mesh.rank_in("pp"), mesh.rank_in("cp")
layout = mesh.layout
ctx.log(f"mesh: {layout} (dp {dp})\n"
        f"  tp groups {layout.groups('tp')}   each weight matrix split; all-reduce per layer\n"
        f"  cp groups {layout.groups('cp')}   each sequence split; k/v round a ring\n"
        f"  dp groups {layout.groups('dp')}   the same shards, other batches\n"
        f"  pp groups {layout.groups('pp')}   one stage each; activations forward, gradients back\n"
        f"  gradient groups (dp x cp) {layout.groups('dp-cp')}   one all-reduce: summed over cp, averaged over dp")
if ctx.is_main:
    plots.mesh_grid(layout, ctx.run_dir / "mesh.png")

# ---- Data: every rank of a replica reads its micro-batches, then keeps its cp columns --------
corpus = wikitext.load_text()
tokens = wikitext.tokenize(corpus, preset(S["model"]["preset"]).vocab)
vocab = -(-tokens.vocab // TP) * TP  # the vocabulary padded to a multiple of tp, as Megatron does
config = preset(S["model"]["preset"]).with_vocab(vocab)
blocks = wikitext.pack(tokens.train, seq)
batch = wikitext.replica_batches(blocks, micro, m, seed, dev, dp, replica)  # batch(step, replica=mine)


def my_columns(step: int) -> list:
    """This replica's m micro-batches of the step, cut to this rank's s/cp tokens (zig-zag)."""
    return [split_batch(x, y, CP, me_cp, split) for x, y in batch(step)]


ctx.log(f"data: {corpus.source}; {len(blocks):,} blocks of {seq} tokens, vocabulary {tokens.vocab}"
        f"{f' padded to {vocab}' if vocab != tokens.vocab else ''}; per step {dp} replica(s) x {m} micro-batches "
        f"of {micro} x {seq} tokens, each rank {seq // CP} of every sequence")

# ---- The model: the dense Llama, drawn alike on every rank; each keeps its stage's shards ------
torch.manual_seed(seed)
dense = Llama(config)
initial = copy.deepcopy(dense.state_dict())
if S["pipeline"]["engine"] == "deepspeed":  # the same layers in DeepSpeed's PipelineModule and schedule
    from plscale.strategies.hybrid.deepspeed_pipe import DeepSpeedHybrid
    train_step = DeepSpeedHybrid(config, mesh, ds, split)
    model, load_dense = train_step.module, train_step.load_dense
    holds = f"pieces {model._local_start} .. {model._local_stop - 1} (0 embedding, 1 .. L layers, L + 1 norm, L + 2 head)"
else:
    model = HybridStage(config, mesh, stage_id, PP, split, sequence_parallel=SP).to(dev)
    train_step, load_dense = HybridStep(model, mesh, ds, ZERO), model.load_dense
    holds = (f"layers {list(model.layer_ids)}{' + embedding' if model.first else ''}"
             f"{' + norm, tied head' if model.last else ''}")
load_dense(dense)
mine = sum(p.numel() for p in model.parameters())
held = gathered(mine)
ctx.log(f"\nmodel: Llama-shaped {S['model']['preset']!r}, {param_count(config):,} parameters; stage {stage_id} of {PP} "
        f"holds {holds}, split over tp {TP}: {mine:,} on this rank ({S['pipeline']['engine']} engine, ZeRO-{ZERO} "
        f"over dp x cp)")
if ctx.is_main:
    ctx.log("  parameters per rank: " + ", ".join(f"r{r} {n:,}" for r, n in enumerate(held)))
if S["pipeline"]["engine"] == "deepspeed":  # DeepSpeed built its own groups: they must be the mesh's
    same = all(gathered(train_step.groups == {"pp": mesh.ranks("pp"), "dp-cp": mesh.ranks("dp-cp")}))
    ctx.check("DeepSpeed's groups are the mesh's", same, "its pipe and data groups are pp and dp x cp on every rank")

# ---- Training: 1F1B over the stages; tied sum; dp x cp: ZeRO-1 (or one all-reduce); AdamW ----
steps, util = S["train"]["steps"], Utilization(ctx, config, seq, micro * m * dp * seq, S["ds"]["precision"])
census, losses, times = min(1, steps - 1), [], []  # census: the collectives of one step after the first, counted
for step in range(steps):
    ops.TALLY.reset()   # tp's collectives
    ring.TALLY.reset()  # cp's ring
    train_step.census_next = step == census   # plscale's engine: a census of the states after the backward
    t0 = time.perf_counter()
    losses.append(train_step(my_columns(step)))
    times.append(time.perf_counter() - t0)
    if step == census:
        tp_sent, ring_sent = ops.TALLY.rows(), {k: v["sent_bytes"] for k, v in ring.TALLY.rows().items()}
        rest_sent = getattr(train_step, "sent", {})
    if step == 0:  # kept for the parameter check below
        after_first = {name: p.detach().clone() for name, p in model.named_parameters()}
    ctx.metrics.step(step=step, loss=losses[-1], step_time_s=times[-1], **util.of_step(times[-1]))
    ctx.metrics.progress(f"dp {dp} x tp {TP}{' + sp' if SP else ''} x pp {PP} x cp {CP}", step + 1, steps,
                         f"loss {losses[-1]:.4f}")

# ---- Collectives per step on every rank, by dimension, against the predictions ------------------
# tp: Megatron's all-reduces for this stage's layers (and its embedding, or head and loss) at s/cp
# tokens (plscale estimate tp); cp: the k/v blocks ring attention sends, of this rank's kv_heads/t
# heads (plscale estimate cp). Every rank counts its own, rank 0 compares them all.
per_stage, first, last = config.layers // PP, stage_id == 0, stage_id == PP - 1
tp_want = tp_predict.by_op_phase(tp_predict.collectives(config, TP, seq // CP, micro, "fp32", sp=SP, micro_batches=m,
                                                        layers=per_stage, embedding=first, head=last))
block = cp_predict.ring_bytes(micro, seq, CP, config.kv_heads // TP, config.head_dim, 4)
ring_want = {"forward": block.forward * per_stage * m, "backward": block.backward * per_stage * m}
counts = gathered(((tp_sent, tp_want), (ring_sent, ring_want)))
if ctx.is_main and TP > 1:
    ctx.log(f"\ntp collectives per step (step {census}) by op and phase: calls and MiB, measured/predicted")
    ctx.check(*per_rank_counts(ctx.log, "tp collectives per step as predicted, every rank", [c[0] for c in counts]))
if ctx.is_main and CP > 1:
    ctx.log("ring attention's k/v (and dk/dv) sent per step, MiB, measured/predicted: " + ", ".join(
        f"r{r} {sum(got.values()) / MiB:.3f}/{sum(want.values()) / MiB:.3f}" for r, (_, (got, want)) in enumerate(counts)))
    ctx.check("ring attention's bytes per step as predicted, every rank", all(g == w for _, (g, w) in counts),
              f"{sum(sum(g.values()) for _, (g, _) in counts) / MiB:.2f} MiB measured on {len(counts)} ranks, "
              f"{sum(sum(w.values()) for _, (_, w) in counts) / MiB:.2f} MiB predicted")

# pp's sends, the tied all-reduce, dp x cp's reduction against predict/hybrid.py; the model states (census after
# the backward: gradients whole, as while micro-batches accumulate) against predict/memory.py's largest stage
if S["pipeline"]["engine"] == "plscale":
    rest_want = hybrid.step_collectives(config, TP, PP, stage_id, dp, CP, micro, seq, m, ZERO, SP)
    setup = replace(memory.setup_from_ds_config(ds, dp * CP, config, seq), tp=TP, pp=PP, cp=CP, sp=SP,
                    reduce_in_backward=False)   # zero1.py reduces after the schedule, from whole gradients
    predicted = {t.name: t.total for t in memory.estimate(setup).terms if t.name in memory.MODEL_STATES}
    # activations in flight at their peak: 1F1B holds pp - s micro-batches on stage s, each its layers' (and the head's)
    acts = (train_step.activations_peak, plan.in_flight("1f1b", PP, m, stage_id) * activation_bytes(setup, per_stage, last))
    predicted["model_states"], measured = sum(predicted.values()), gathered((rest_sent, rest_want, train_step.census, acts))
    if ctx.is_main:
        ctx.log("\npipeline sends, tied all-reduce, dp x cp gradients, per step: calls and MiB, measured/predicted")
        ctx.check(*per_rank_counts(ctx.log, "pp sends, tied and dp x cp collectives per step as predicted, every rank",
                                   [(got, want) for got, want, *_ in measured]))
        rows = per_rank([c for *_, c, _ in measured], (*memory.MODEL_STATES, "model_states"))
        ctx.log(f"\nmodel states per rank, MiB (census after step {census}'s backward); ZeRO-{ZERO} over dp x cp = {dp * CP}")
        figures_memory = memory_table(ctx.log, rows, predicted, width=26)[1]
        ctx.check(*within("model states per rank match the memory model, every term", [
            (v, predicted[k]) for k in rows if predicted[k] for v in rows[k]], 0.02))
        acts = [a for *_, a in measured]
        ctx.log("activations in flight at their peak, MiB, measured/predicted: "
                + ", ".join(f"r{r} {got / MiB:.3f}/{want / MiB:.3f}" for r, (got, want) in enumerate(acts)))
        ctx.check(*within("activations per rank match the memory model", acts, 0.02))

# ---- Where the last step's time went, and the bubble against (p-1)/(m+p-1) (plscale's engine) ----
# the planner's terms where they can be told apart: tp's collectives and cp's waits timed inside F and B
figures = figures_memory if S["pipeline"]["engine"] == "plscale" and ctx.is_main else []
if S["pipeline"]["engine"] == "plscale":
    parts = train_step.parts(times[-1], ops.TALLY.seconds, sum(ring.TALLY.waited.values()))
    in_first = mesh.rank in layout.groups("pp")[0]  # the pipeline of rank 0, drawn as a timeline
    timed = gathered((parts, [o.to_dict() for o in train_step.ops] if in_first else []))
    if ctx.is_main:
        ctx.log("\nthe last step's time by part, ms (on 2 shared cores the ranks take turns: read the shares)")
        ctx.log("  rank " + "".join(f"{k:>18}" for k in parts))
        for r, (split_ms, _) in enumerate(timed):
            ctx.log(f"  r{r:<4}" + "".join(f"{1e3 * v:18.1f}" for v in split_ms.values()))
        measured_ops = [plan.Op(**o) for _, ops_ in timed for o in ops_]
        bubble, theory = plan.bubble_of(measured_ops), plan.bubble_fraction(PP, m)
        timeline.draw_pair(ctx.run_dir / "timeline.png", measured_ops, plan.simulate("1f1b", PP, m),
                           f"measured: 1F1B, p={PP}, m={m}, pipeline {layout.groups('pp')[0]}, step {steps - 1}: "
                           f"bubble {100 * bubble:.1f}%", f"planned: bubble {100 * theory:.1f}% with backward = 2 forwards")
        figures.append(figure(f"bubble at m={m}", round(100 * bubble, 1), "%", round(100 * theory, 1),
                              "idle share of the last step, rank 0's pipeline; (p-1)/(m+p-1)"))

# ---- Parity 1: the loss, step by step, against the dense model on every replica's batches ------
parity = min(S["train"]["parity_steps"], steps)
loss_gap = 0.0
if ctx.is_main:
    reference = Llama(config).to(dev)
    reference.load_state_dict(initial)
    want = reference_losses(reference, ds, every_replica(batch, dp), parity)
    loss_gap = largest_gap(losses, want)
    ctx.log("\nloss, 4D vs dense: " + step_by_step(losses, want))
    ctx.check(*follows("the 4D model follows the dense model's loss", losses, want))

# ---- Parity 2: every rank's shard after the first step, against the dense model's slice -------
# Each rank trains its own dense copy one step on all the batches, loads the slice it should
# hold into its model (training is over) and compares: no gathers of weights. The gap is measured
# in units of the learning rate: AdamW's first step moves a weight by lr g/(|g| + eps), so where a
# gradient is as small as eps (1e-8) its rounding (another order of the same sums) shows.
lr = ds["optimizer"]["params"]["lr"]
reference = Llama(config).to(dev)
reference.load_state_dict(initial)
reference_losses(reference, ds, every_replica(batch, dp), 1)
load_dense(reference)
diffs = {name: (after_first[name] - p).abs() / lr for name, p in model.named_parameters()}
worst_name = max(diffs, key=lambda n: diffs[n].max())
over = sum(int((d > 1e-3).sum()) for d in diffs.values())
everyone = gathered((diffs[worst_name].max().item(), worst_name, over, mine))
param_tolerance = S["train"]["param_tolerance"]
if ctx.is_main:
    rank, (param_gap, name, _, _) = max(enumerate(everyone), key=lambda r: r[1][0])
    ctx.log(f"\nparameters after step 1, each rank's shard against the dense model's slice, in units of lr {lr:g}: "
            f"largest gap {param_gap:.2e} lr (rank {rank}, {name}); per rank: "
            + ", ".join(f"{g:.1e}" for g, *_ in everyone)
            + f"\n  weights off by more than 1e-3 lr: {sum(e[2] for e in everyone)} of {sum(e[3] for e in everyone):,}"
              f" (gradients near eps, where Adam's first step g/(|g| + eps) shows their rounding)")
    ctx.check("every rank's shard equals the dense model's slice after the first step", param_gap <= param_tolerance,
              f"largest gap {param_gap:.2e} lr on rank {rank} ({name}); tolerance {param_tolerance:g} lr")
    timed = [t for i, t in enumerate(times) if i not in (0, census)] or times   # the first and the counted left out
    step_s, planned = statistics.median(timed), S["planned"]   # planned: plscale plan --here's terms
    if planned["step_s"]:
        ctx.log(f"\nstep time, the planner's model for this layout on this machine: {planned['step_s']:.3f} s ("
                + ", ".join(f"{LABELS[t]} {planned[t]:.3f}" for t in TERMS if planned[t]) + f"); measured {step_s:.3f} s")
    figures += [figure("final loss", round(losses[-1], 4), "nats"),
                figure("step time", round(step_s, 4), "s", planned["step_s"] or None, "median, the first and the "
                       "counted step left out; predicted: plscale plan --here (--layout, --sweep)"),
                *util.figures(timed, "all replicas"),
                figure("largest loss gap", float(f"{loss_gap:.3g}"), "relative", None,
                       f"against the dense model, {parity} steps"),
                figure("largest parameter gap", float(f"{param_gap:.3g}"), "lr", None,
                       "every rank's shard after step 1, against the dense model's slice")]
    ctx.log("\nmesh.png: the ranks of this run's mesh, one panel per pipeline stage; timeline.png: one step")
ctx.finish(figures, data=corpus.source, real_data=corpus.real, tokenizer=tokens.tokenizer, dp=dp, tp=TP, pp=PP, cp=CP,
           engine=S["pipeline"]["engine"], sequence_parallel=SP, zero_stage=ZERO,
           vocab=vocab, micro_batches=m, micro_batch=micro, seq=seq, losses=losses, params_per_rank=held,
           loss_gap=loss_gap, param_gaps=[g for g, *_ in everyone])
