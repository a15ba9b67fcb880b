"""Lab 07: tensor and sequence parallelism. Megatron's layers by hand, and the production paths beside them.

Every weight matrix of the Llama-shaped model is split across the t ranks of a
tensor-parallel group: q, k, v and the MLP's gate and up by columns (each rank its heads,
its slice of the MLP), o and down by rows, the embedding and the tied head by vocabulary.
The operators f and g (plscale/strategies/tensor_parallel/operators.py) glue the halves: one
all-reduce forward and one backward per attention block and per MLP, two of each per layer. With sequence parallelism the norms and the
residual stream hold a t-th of the sequence, and each all-reduce becomes a reduce-scatter
and an all-gather. DeepSpeed trains the split model, told the mesh's groups (MegatronMPU),
so with data parallel too it all-reduces gradients over the data-parallel groups only.

The lab checks that the split model follows the dense model's loss, counts every
collective of a step against Megatron's count (plscale estimate tp), measures parameters,
optimizer states and activations per rank against the memory model, and trains the
production paths (DTensor, DeepSpeed AutoTP, megatron-core) from the same weights on the
same batches: their losses must agree, and their step times are compared.

    plscale lab run tp --gpus 2            (tp-sp: sequence parallel; tp-dp: tp 2 x dp 2 on 4 ranks)
    deepspeed --num_gpus 2 labs/07_tensor_parallel/train.py --variant tp-sp   (DS_ACCELERATOR=cpu without GPUs)
    torchrun --nproc_per_node 4 labs/07_tensor_parallel/train.py --variant tp-dp
"""

import copy
import statistics
import time
from dataclasses import replace

import deepspeed
import torch
import torch.distributed as dist

from plscale.charts import plots
from plscale.predict import memory, tensor_parallel as predict
from plscale.predict.activations import activation_bytes
from plscale.predict.memory import MODEL_STATES
from plscale.predict.presets import param_count, preset
from plscale.predict.units import MiB
from plscale.rank import runtime
from plscale.rank.against_dense import every_replica, follows, largest_gap, reference_losses, step_by_step
from plscale.rank.against_prediction import (collectives_table, memory_table, mib_figure, per_rank,
                                             same_collectives, within)
from plscale.rank.distributed import gathered
from plscale.rank.census import census, saved_activations, zero_states
from plscale.rank.data import wikitext
from plscale.rank.mesh import MegatronMPU, Mesh
from plscale.rank.metrics import figure
from plscale.rank.models.llama import Llama
from plscale.rank.utilization import Utilization
from plscale.strategies.tensor_parallel import operators as ops, side_by_side
from plscale.strategies.tensor_parallel.llama import TensorParallelLlama

ctx = runtime.start(__file__)
S, ds, dev = ctx.settings, ctx.ds_config, ctx.device
T, sp, seq, seed = S["parallel"]["tp"], S["tp"]["sequence_parallel"], S["model"]["seq"], S["seed"]
micro, accum = ds["train_micro_batch_size_per_gpu"], ds["gradient_accumulation_steps"]

# ---- The mesh: which ranks split each layer (tp), which hold the same shards (dp) ---------
mesh = Mesh.build(tp=T, dims=("tp", "dp", "pp"))
tp_group, dp, replica = mesh.group("tp"), mesh.size("dp"), mesh.rank_in("dp")
ctx.log(f"mesh: {mesh.layout}\n"
        f"  tensor-parallel groups (tp): {mesh.layout.groups('tp')}   each layer split across these ranks\n"
        f"  data-parallel groups (dp):   {mesh.layout.groups('dp')}   "
        + ("the same shards, other batches" if dp > 1 else "(dp 1: no data parallelism)"))
if ctx.is_main:
    plots.mesh_grid(mesh.layout, ctx.run_dir / "mesh.png")

# ---- Data: WikiText-2 blocks; every rank of a tensor-parallel group reads its replica's batch --
corpus = wikitext.load_text()
tokens = wikitext.tokenize(corpus, preset(S["model"]["preset"]).vocab)
vocab = -(-tokens.vocab // T) * T  # Megatron pads the vocabulary to a multiple of tp
config = preset(S["model"]["preset"]).with_vocab(vocab)
blocks = wikitext.pack(tokens.train, seq)
batch = wikitext.replica_batches(blocks, micro, accum, seed, dev, dp, replica)  # batch(step, replica=mine)
ctx.log(f"data: {corpus.source}; {len(blocks):,} blocks of {seq} tokens, vocabulary {tokens.vocab}"
        f"{f' padded to {vocab}' if vocab != tokens.vocab else ''}")

# ---- The model: the dense Llama, built alike on every rank; each rank keeps its shards -----
torch.manual_seed(seed)
dense = Llama(config)
initial = copy.deepcopy(dense.state_dict())
model = TensorParallelLlama(config, tp_group, sequence_parallel=sp)
model.load_dense(dense)
engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=ds, mpu=MegatronMPU(mesh))
split = predict.params_per_rank(config, T)
mine = sum(p.numel() for p in model.parameters())
ctx.log(f"\nmodel: Llama-shaped {S['model']['preset']!r}, Ψ = {param_count(config):,} parameters; split over tp {T}"
        f"{' with sequence parallelism' if sp else ''}: each rank holds {mine:,} = {split.sharded:,} sharded "
        f"((Ψ - norms) / {T}) + {split.replicated:,} replicated norm weights")
ctx.check("parameters per rank as predicted", mine == split.total,
          f"{mine:,} held, {split.total:,} predicted (plscale estimate tp)")


# ---- Training: DeepSpeed steps the shards; one step's collectives tallied, its memory counted --
def train_step(step: int, measure: bool):
    """One optimizer step on this replica's micro-batches; (loss, census) with the census taken
    after the last backward, while the gradients are live, when `measure`. DeepSpeed counts
    micro-batches: engine.step() after each, and it steps the optimizer after the last."""
    total, counted, micro_batches = 0.0, {}, batch(step)
    for i, (x, y) in enumerate(micro_batches):
        loss = engine(x, y)
        engine.backward(loss)
        total += loss.detach().float()   # read once a step, not once a micro-batch: .item() waits
        if measure and i == len(micro_batches) - 1:
            counted = census(zero_states(engine))
        engine.step()
    return total.item() / accum, counted


steps, census_step = S["train"]["steps"], S["memory"]["census_step"]
util = Utilization(ctx, config, seq, micro * accum * dp * seq, S["ds"]["precision"])
losses, times, tally, measured = [], [], {}, {}
for step in range(steps):
    ops.TALLY.reset()
    t0 = time.perf_counter()
    loss, counted = train_step(step, step == census_step)
    times.append(time.perf_counter() - t0)
    if step == census_step:
        tally, measured = ops.TALLY.rows(), counted
    mean = torch.tensor([loss], dtype=torch.float64, device=dev)  # NCCL reduces device tensors only
    dist.all_reduce(mean, group=mesh.group("dp"))
    losses.append(mean.item() / dp)
    ctx.metrics.step(step=step, loss=losses[-1], step_time_s=times[-1], **util.of_step(times[-1]))
    ctx.metrics.progress(f"tp {T}{' + sp' if sp else ''}", step + 1, steps, f"loss {losses[-1]:.4f}")


# ---- Parity: the dense model trained on the same batches (rank 0) --------------------------
parity = min(S["train"]["parity_steps"], steps)
if ctx.is_main and parity:
    reference = Llama(config).to(dev)
    reference.load_state_dict(initial)
    want = reference_losses(reference, ds, every_replica(batch, dp), parity)
    ctx.log("\nloss, tensor-parallel vs dense: " + step_by_step(losses, want))
    ctx.check(*follows("the split model follows the dense model's loss", losses, want))

# ---- Collectives of one step in the tensor-parallel group, against the prediction ----------
figures = []
rows = predict.collectives(config, T, seq, micro, "fp32", sp=sp, micro_batches=accum)
want = predict.by_op_phase(rows)
if ctx.is_main:
    # bytes: each call's whole tensor (nccl-tests' S); on the wire, what a ring makes each rank send
    ctx.log(f"\ncollectives per step in the tensor-parallel group (step {census_step}, rank 0), measured / predicted")
    wire = collectives_table(ctx.log, tally, want, T)
    for row in rows:
        size = f"{row.bytes / MiB:.3f} MiB" if row.bytes >= MiB / 100 else f"{row.bytes / 1024:.1f} KiB"
        ctx.log(f"    predicted: {row.op:15}{row.phase:9}{row.calls:4} x {size:>10}  {row.where}")
    paper = predict.megatron_paper_count(config.layers)
    ctx.log(f"  Megatron-LM: 2 all-reduces per layer forward (g) and 2 backward (f): {paper['forward']} and "
            f"{paper['backward']} for {config.layers} layers" + (", each an all-gather and a reduce-scatter under "
                                                                   "sequence parallelism" if sp else ""))
    ctx.log(f"  each rank sends {wire / MiB:.2f} MiB per step through a ring (x 2(t-1)/t for an all-reduce, "
            f"(t-1)/t for an all-gather or a reduce-scatter)")
    figures.append(mib_figure("tensor-parallel traffic per rank per step", wire, None,
                              "sent through a ring, all collectives of the tp group"))
    ctx.check(*same_collectives("collectives per step as predicted", tally, want))

# ---- Memory per rank: model states and activations against the memory model ---------------
setup = replace(memory.setup_from_ds_config(ds, dp, config, seq), tp=T, sp=sp)
predicted = {t.name: t.total for t in memory.estimate(setup).terms}
x, y = batch(0)[0]
acts = {}
for label, split_sequence in (("dense (one rank)", None), ("tp", False), ("tp + sp", True)):
    net = dense.to(dev)
    if split_sequence is not None:
        net = TensorParallelLlama(config, tp_group, sequence_parallel=split_sequence).to(dev)
        net.load_dense(dense)
    with saved_activations() as saved:
        net(x, y)
    acts[label] = (saved.bytes, activation_bytes(replace(setup, tp=1 if split_sequence is None else T,
                                                         sp=bool(split_sequence))))
everyone = gathered(measured)
predicted["model_states"] = sum(predicted[k] for k in MODEL_STATES)
dense_states = memory.estimate(replace(setup, tp=1, sp=False)).model_states  # the same states, unsplit
if ctx.is_main:
    rows, tol = per_rank(everyone, (*MODEL_STATES, "model_states")), S["memory"]["tolerance"]
    ctx.log(f"\nmemory per rank, MiB (census after step {census_step}'s backward), predicted with tp {T}")
    figures += memory_table(ctx.log, rows, predicted, width=26)[1]
    ctx.log(f"  the dense model's states / {T}: {dense_states / T / MiB:.2f} MiB; with the replicated norms "
            f"whole on every rank: {predicted['model_states'] / MiB:.2f} MiB")
    ctx.check(*within("model states per rank match the model",
                      [(v, predicted["model_states"]) for v in rows["model_states"]], tol))
    ctx.log(f"\nactivations saved for backward, one micro-batch of {micro} x {seq}, MiB, measured / predicted")
    for label, (got, guess) in acts.items():
        ctx.log(f"  {label:18}{got / MiB:9.3f} / {guess / MiB:.3f}   error {100 * abs(got - guess) / guess:.1f}%")
        figures.append(mib_figure(f"activations, {label}", got, guess))
    ctx.check(*within("activations match the memory model", acts.values(), tol, "worst", digits=1))
    states = max(rows["model_states"])
    figures.append(mib_figure(f"model states per rank vs dense / {T}", states, dense_states / T,
                              "the replicated norms make the difference"))
    plots.measured_vs_predicted(ctx.run_dir / "memory.png", {
        "model states per rank": {"dense": (None, dense_states / MiB), f"tp {T}": (states / MiB,
                                                                                 predicted["model_states"] / MiB)},
        f"activations, one micro-batch of {micro} x {seq}": {k: (a / MiB, b / MiB) for k, (a, b) in acts.items()}},
        f"memory per rank: {S['model']['preset']!r} split over tp {T} (dense states: predicted only)")

# ---- The production paths: same weights, same batches, side by side ------------------------
# Each trains compare_steps steps from the initial weights; the hand-written layers run again
# under the same optimizer loop (torch's AdamW, no DeepSpeed engine), so the times compare.
warm = [t for i, t in enumerate(times) if i not in (0, census_step)] or times
step_s = statistics.median(warm)
compared, k = {}, S["tp"]["compare_steps"]
names = ["hand-written", *S["tp"]["compare"]] if dp == 1 and S["tp"]["compare"] else []
if S["tp"]["compare"] and dp > 1:
    ctx.log("\n(the production paths are compared where the tensor-parallel group is the world: dp 1)")
for name in names:
    reason = side_by_side.why_not(name, sp)
    compared[name] = (reason, None) if reason else side_by_side.run(name, config, initial, mesh, ds, sp, batch, k, dev)
if ctx.is_main and compared:
    base = compared["hand-written"][1]
    ctx.log(f"\nthe production paths beside the hand-written layers, {k} steps each from the same weights")
    ctx.log(f"  {'path':14}{'largest loss gap':>18}{'step time':>12}{'vs hand-written':>18}")
    for name, (path_losses, path_s) in compared.items():
        if isinstance(path_losses, str):
            ctx.log(f"  {name:14}skipped: {path_losses}")
            continue
        gap = largest_gap(path_losses, losses)
        ctx.log(f"  {name:14}{gap:18.2e}{1e3 * path_s:10.1f}ms{path_s / base:17.2f}x")
        ctx.check(*follows(f"{name} agrees with the DeepSpeed-trained run", path_losses, losses))
        if name != "hand-written":
            figures.append(figure(f"step time, {name} / hand-written", round(path_s / base, 3), "x", None,
                                  f"median of the {k - 1} steps after the first"))

if ctx.is_main:
    figures += [figure("final loss", round(losses[-1], 4), "nats"),
                figure("step time", round(step_s, 4), "s", None, "DeepSpeed engine; median, warm-up and census steps left out"),
                *util.figures(warm, "all replicas")]
    ctx.log("\nmesh.png: the ranks of this run's tp x dp grid; memory.png: memory per rank against the model")
ctx.finish(figures, data=corpus.source, real_data=corpus.real, tokenizer=tokens.tokenizer, tp=T, dp=dp, vocab=vocab,
           micro_batches=accum,
           sequence_parallel=sp, losses=losses, params_per_rank=mine,
           collectives={f"{op} {phase}": list(v) for (op, phase), v in tally.items()},
           activations={k: list(v) for k, v in acts.items()},
           compared={k: {"losses": v[0], "step_s": v[1]} for k, v in compared.items() if not isinstance(v[0], str)})
