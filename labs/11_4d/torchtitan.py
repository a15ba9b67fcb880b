"""Lab 11, torchtitan's way: the same Llama split by FSDP2, DTensor tensor parallelism and torch's pipeline.

train.py composes the splits from the course's own pieces. Here each is PyTorch's, stacked on one
DeviceMesh pp x dp x tp as torchtitan stacks them (plscale/strategies/fsdp/composed.py): the model
cut into stages, `parallelize_module` splitting each layer's Linears over tp, `fully_shard`
splitting every weight again over dp, torch.distributed.pipelining's 1F1B moving micro-batches
between the stages. The run checks that the DeviceMesh's groups are train.py's, each rank's
parameters, gradients and Adam moments against plscale/predict/fsdp.py, one step's collectives
against the predictions, every step's loss against the dense model, and every rank's stage after
the first step against the dense model's. Beside it: `plscale lab run 4d` (train.py) on the same
batches.

    plscale lab run fsdp2-tp2 --gpus 4           (fsdp2-tp2-pp2 on 8)
    torchrun --nproc_per_node 4 labs/11_4d/torchtitan.py --variant fsdp2-tp2
"""

import contextlib
import logging
import statistics
import time

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from plscale.predict import fsdp as fsdp_predict, tensor_parallel as tp_predict
from plscale.predict.memory import MODEL_STATES
from plscale.predict.presets import param_count, preset
from plscale.rank import runtime
from plscale.rank.against_dense import every_replica, follows, largest_gap, reference_losses, step_by_step
from plscale.rank.against_prediction import memory_table, per_rank, per_rank_counts, within
from plscale.rank.data import wikitext
from plscale.rank.dispatched import counting
from plscale.rank.distributed import gathered
from plscale.rank.mesh import Mesh
from plscale.rank.metrics import figure
from plscale.rank.models import llama_pieces
from plscale.rank.models.llama import Llama
from plscale.rank.tally import Tally
from plscale.rank.utilization import Utilization
from plscale.strategies.fsdp import census, composed
from plscale.strategies.pipeline.stages import split

ctx = runtime.start(__file__)
S, ds, dev, N = ctx.settings, ctx.ds_config, ctx.device, ctx.world_size
TP, PP = S["parallel"]["tp"], S["parallel"]["pp"]
DP, seq, seed, steps = N // (TP * PP), S["model"]["seq"], S["seed"], S["train"]["steps"]
micro, m = ds["train_micro_batch_size_per_gpu"], ds["gradient_accumulation_steps"]

# ---- The DeviceMesh pp x dp x tp, and train.py's mesh of the same shape: the same groups ---------
mesh = composed.device_mesh(dev.type, PP, DP, TP)
replica, stage_id = mesh.get_local_rank("dp"), mesh.get_local_rank("pp")
hand = Mesh.build(tp=TP, pp=PP, dims=("tp", "dp", "pp"))
ctx.log(f"DeviceMesh {dict(zip(mesh.mesh_dim_names, mesh.shape))}: " + "; ".join(
    f"{dim} groups {hand.layout.groups(dim)}" for dim in ("tp", "dp", "pp")))
same = all(mesh[dim].mesh.tolist() == hand.ranks(dim) for dim in ("tp", "dp", "pp"))
ctx.check("the DeviceMesh's groups are train.py's mesh's", all(gathered(same)), "tp, dp and pp, on every rank")

# ---- Data: train.py's batches (each replica m micro-batches a step) and its model ---------------
corpus = wikitext.load_text()
tokens = wikitext.tokenize(corpus, preset(S["model"]["preset"]).vocab)
config = preset(S["model"]["preset"]).with_vocab(-(-tokens.vocab // TP) * TP)   # padded as train.py pads it
batch = wikitext.replica_batches(wikitext.pack(tokens.train, seq), micro, m, seed, dev, DP, replica)
ctx.log(f"data: {corpus.source}; per step {DP} replica(s) x {m} micro-batches of {micro} x {seq} tokens")
torch.manual_seed(seed)
dense = Llama(config)   # the weights train.py starts from; every rank draws them, keeps its stage's slices
train = composed.Composed(dense, mesh, ds, dev)
first, last = split(config, PP)[stage_id]
ctx.log(f"model: Llama-shaped {S['model']['preset']!r}, {param_count(config):,} parameters; stage {stage_id} of {PP} "
        f"holds pieces {first} .. {last - 1} (0 embedding, 1 .. L layers, L + 1 norm, L + 2 head)\n"
        f"  e.g. {next(n for n, p in train.stage.named_parameters() if 'q_proj' in n)}: "
        f"{next(p.placements for n, p in train.stage.named_parameters() if 'q_proj' in n)} over (dp, tp)")

# ---- Training: 1F1B over the stages, FSDP2 over dp, tp inside every layer; one step counted ----
census_step = min(1, steps - 1)   # after step 0, where the schedule runs an extra forward and backward to set up
losses, times, tally, measured = [], [], Tally(), {}
util = Utilization(ctx, config, seq, micro * m * DP * seq, S["ds"]["precision"])
for step in range(steps):
    t0, counted = time.perf_counter(), step == census_step
    with counting(tally, "step") if counted else contextlib.nullcontext():
        loss = train.backward(batch(step))
    if counted:   # the gradients sharded and reduced; the parameters resharded; the moments of step 0
        measured = census.states(train.stage, train.optimizer)
    train.update()
    dist.all_reduce(loss)   # the last stage's tp x dp ranks hold the loss, the others 0
    losses.append(loss.item() / (TP * DP))
    times.append(time.perf_counter() - t0)
    if step == 0:   # kept for the parameter check: every weight of the stage, gathered whole (torch warns
        # that a (_StridedShard, Shard) weight gathers in two all-gathers: slower, and only a check's)
        logging.getLogger("torch.distributed.tensor._redistribute").setLevel(logging.ERROR)
        after_first = {name: p.full_tensor() if isinstance(p, DTensor) else p.detach().clone()
                       for name, p in train.stage.named_parameters()}
    ctx.metrics.step(step=step, loss=losses[-1], step_time_s=times[-1], **util.of_step(times[-1]))
    ctx.metrics.progress(f"FSDP2 dp {DP} x DTensor tp {TP} x torch pp {PP}", step + 1, steps, f"loss {losses[-1]:.4f}")

# ---- Each rank's model states, and the step's collectives, against the predictions -------------
want = fsdp_predict.states(config, N, tp=TP, pp=PP, stage=stage_id)
want["model_states"] = sum(want[k] for k in MODEL_STATES)
sent_want = fsdp_predict.composed_collectives(config, N, m, TP, PP, stage_id)
tp_rows = [r for r in tp_predict.collectives(config, TP, seq, micro, "fp32", micro_batches=m,
                                             layers=config.layers // PP) if r.where.startswith("layers")]
for (op, _), (calls, nbytes) in tp_predict.by_op_phase(tp_rows).items():   # DTensor's f and g, in the layers only
    sent_want[(op, "step")] = tuple(a + b for a, b in zip(sent_want.get((op, "step"), (0, 0)), (calls, nbytes)))
everyone = gathered((measured, want, tally.rows(), sent_want))
figures = []
if ctx.is_main:
    rows = per_rank([got for got, *_ in everyone], (*MODEL_STATES, "model_states"))
    ctx.log(f"\nmodel states per rank, MiB (after step {census_step}'s backward); predicted: the largest stage's")
    figures = memory_table(ctx.log, rows, {k: max(w[k] for _, w, *_ in everyone) for k in rows})[1]
    ctx.check(*within("model states match the memory model, every term, every rank",
                      [(got[k], w[k]) for got, w, *_ in everyone for k in MODEL_STATES if w[k]],
                      0.02))
    ctx.log(f"\ncollectives of step {census_step}, calls and MiB, measured/predicted: FSDP2's all-gathers (a layer m + 1 "
            f"times, the root once) and reduce-scatters (once a group), tp's all-reduces and the tied sum")
    ctx.check(*per_rank_counts(ctx.log, "FSDP2's, tp's and the tied collectives per step as predicted, every rank",
                               [(got, w) for *_, got, w in everyone]))
    ctx.log(f"  without a pipeline FSDP2 gathers every group twice a micro-batch ({2 * m} times): torch's stage keeps "
            f"a layer gathered from its backward to its next forward, and its gradients whole until the step's end")

# ---- Parity: the loss, step by step, and every rank's stage after step 1, against the dense model
parity, lr = min(S["train"]["parity_steps"], steps), ds["optimizer"]["params"]["lr"]
reference = Llama(config).to(dev)
reference.load_state_dict(dense.state_dict())
reference_losses(reference, ds, every_replica(batch, DP), 1)
after = llama_pieces.build_pieces(reference, first, last).state_dict()   # the dense model's stage after step 1
param_gaps = gathered(max(((after_first[n] - after[n]).abs().max() / lr).item() for n in after_first))
if ctx.is_main:
    reference.load_state_dict(dense.state_dict())
    dense_losses = reference_losses(reference, ds, every_replica(batch, DP), parity)
    loss_gap = largest_gap(losses, dense_losses)
    ctx.log(f"\nloss, FSDP2 x TP x PP vs dense: {step_by_step(losses, dense_losses)}")
    ctx.check(*follows("the composed model follows the dense model's loss", losses, dense_losses))
    ctx.log("each rank's stage after step 1, gathered, against the dense model's, largest gap in lr: "
            + ", ".join(f"r{r} {g:.1e}" for r, g in enumerate(param_gaps)))
    ctx.check("every rank's stage equals the dense model's after the first step",
              max(param_gaps) <= S["train"]["param_tolerance"],
              f"largest gap {max(param_gaps):.2e} lr; tolerance {S['train']['param_tolerance']:g} lr")
    timed = [t for i, t in enumerate(times) if i not in (0, census_step)] or times   # the first and the counted left out
    step_s = statistics.median(timed)
    figures += [figure("final loss", round(losses[-1], 4), "nats"),
                figure("largest loss gap", float(f"{loss_gap:.3g}"), "relative", None, f"against the dense model, "
                       f"{parity} steps"),
                figure("step time", round(step_s, 4), "s", None, "median, the first and the counted step left out"),
                *util.figures(timed)]
    ctx.log(f"\nbeside it: plscale lab run 4d --gpus {N} --set parallel.tp={TP} --set parallel.pp={PP}: train.py's "
            f"hand-written composition on the same batches")
ctx.finish(figures, data=corpus.source, real_data=corpus.real, tokenizer=tokens.tokenizer, params=param_count(config),
           preset=S["model"]["preset"], engine="torch", dp=DP, tp=TP, pp=PP, cp=1, seq=seq, micro_batch=micro,
           grad_accum=m, losses=losses, loss_gap=loss_gap if ctx.is_main else 0.0, param_gaps=param_gaps,
           mesh={dim: hand.layout.groups(dim) for dim in ("tp", "dp", "pp")})
