"""Lab 08, expert parallelism: a mixture of experts, the experts split over ranks.

An MoE layer replaces the MLP with E expert MLPs and a router that sends each token to its
top-k experts: E times the MLP's parameters for about k times its compute per token. With
expert parallelism each of ep ranks holds E/ep experts; everything else is replicated and
data parallel. One MoE layer, on every rank, per micro-batch:

    route      top-k of softmax(x @ W_gate); each expert has C slots (the capacity), routes
               beyond them are dropped (the residual carries the token on)
    dispatch   all-to-all: the [E, C, h] buffer goes out, each rank gets its experts' slots
               from every rank
    experts    each rank runs its E/ep experts on ep x C tokens
    combine    all-to-all back, weighted by the gates

The lab checks the router written by hand against DeepSpeed's gate, trains the MoE Llama
(experts.impl: hand, or DeepSpeed's MoE layer) through DeepSpeed against an unsharded
reference holding every expert, and reports tokens per expert, routes dropped at each
capacity factor, the all-to-all bytes per step against plscale estimate moe, and MFU (each
token's k experts) beside HFU (every capacity slot the experts compute).

    plscale lab run moe --gpus 2                  (moe-deepspeed: DeepSpeed MoE; --gpus 4: ep 4)
    deepspeed --num_gpus 2 labs/08_context_expert/experts.py --variant moe-deepspeed
        (DS_ACCELERATOR=cpu without GPUs; PLSCALE_DATA_DIR=path/to/wikitext-2 for the real data)
"""

import contextlib
import time

import torch
import torch.distributed as dist
from deepspeed.moe.sharded_moe import top1gating, top2gating

from plscale.charts import plots
from plscale.predict import experts as predict
from plscale.predict.presets import preset
from plscale.predict.units import MiB
from plscale.rank import comms, runtime
from plscale.rank.data import wikitext
from plscale.strategies.experts import dispatch
from plscale.strategies.experts.llama import MoELlama, backward, initialize
from plscale.strategies.experts.router import route
from plscale.rank.mesh import Mesh
from plscale.rank.metrics import figure
from plscale.rank.against_dense import every_replica, follows, reference_losses, step_by_step
from plscale.rank.against_prediction import mib_figure
from plscale.rank.distributed import gathered
from plscale.rank.utilization import Utilization

ctx = runtime.start(__file__)
S, ds, dev = ctx.settings, ctx.ds_config, ctx.device
EP, opts, seq, seed = S["parallel"]["ep"], S["experts"], S["model"]["seq"], S["seed"]
E, K, factor, slack = opts["count"], opts["top_k"], opts["capacity_factor"], opts["min_capacity"]
micro, accum = ds["train_micro_batch_size_per_gpu"], ds["gradient_accumulation_steps"]
tokens_per_micro = micro * seq  # S, the tokens one rank routes per micro-batch and layer
figures = []

# ---- The mesh: experts split over ep ranks; the rest replicated, data parallel -------------
mesh = Mesh.build(ep=EP, dims=("dp", "ep", "edp"))
dp, replica = mesh.size("dp"), mesh.rank_in("dp")
ctx.log(f"mesh: {mesh.layout}\n  expert-parallel groups (ep):  {mesh.layout.groups('ep')}   "
        f"{E // EP} of the {E} experts each; tokens meet them by all-to-all\n"
        f"  expert-data-parallel (edp):   {mesh.layout.groups('edp')}   the same experts\n"
        f"  data-parallel groups (dp):    {mesh.layout.groups('dp')}   attention, norms, embedding, routers")

# ---- 1. The router written by hand routes exactly as DeepSpeed's gate ---------------------
g = torch.Generator().manual_seed(seed)
logits = torch.randn(tokens_per_micro, E, generator=g)
logits[:, 0] += 1.0  # expert 0 is popular: it overflows, and both gates must drop the same routes
for k in (1, 2):
    mine = route(logits, k, factor, slack)
    if k == 1:
        _, combine, _, counts = top1gating(logits, factor, slack, use_rts=False)
    else:
        _, combine, _, counts = top2gating(logits, factor, slack, top2_2nd_expert_sampling=False)
    same = torch.equal(mine.combine, combine) and torch.equal(mine.counts, counts)
    ctx.log(f"\nrouter by hand, top-{k}: C = {mine.capacity} slots per expert, routes per expert "
            f"{mine.counts.tolist()}, {mine.dropped} dropped; DeepSpeed's gate: the same slots and weights: {same}")
    ctx.check(f"top-{k} router by hand equals DeepSpeed's gate", same,
              "combine weights (which token, which slot, which weight) and routes per expert, bit for bit")

# ---- 2. The model: every expert built on every rank from one seed; each rank keeps its own --
corpus = wikitext.load_text()
tokens = wikitext.tokenize(corpus, preset(S["model"]["preset"]).vocab)
config = preset(S["model"]["preset"]).with_vocab(tokens.vocab)
torch.manual_seed(seed)
unsharded = MoELlama(config, E, K, factor, None, "hand", opts["aux_weight"], slack)  # every expert
initial = {k: v.clone() for k, v in unsharded.state_dict().items()}
model = MoELlama(config, E, K, factor, mesh.group("ep"), opts["impl"], opts["aux_weight"], slack).to(dev)
model.load_unsharded(initial)
engine = initialize(model, ds, mesh)
held, want = sum(p.numel() for p in model.parameters()), predict.expert_params(config, E).per_rank(EP)
ctx.log(f"\nmodel: Llama-shaped {S['model']['preset']!r} with {E} experts (top-{K}) in each of its {config.layers} "
        f"layers, {'the router and all-to-all by hand' if opts['impl'] == 'hand' else 'DeepSpeed MoE'}; "
        f"{predict.expert_params(config, E).total:,} parameters, {held:,} on this rank")
ctx.check("parameters per rank as predicted", held == want, f"{held:,} held, {want:,} predicted (plscale estimate moe)")

blocks = wikitext.pack(tokens.train, seq)
batch = wikitext.replica_batches(blocks, micro, accum, seed, dev, dp, replica)  # batch(step, replica=mine)
ctx.log(f"data: {corpus.source}; {len(blocks):,} blocks of {seq} tokens, each rank its own batch")

# ---- 3. Training: DeepSpeed steps the model; one step's routing and all-to-alls counted ----
steps, census_step, losses, times = S["train"]["steps"], 1, [], []
routing, alltoall = [], {}
slots = E * predict.capacity(tokens_per_micro, E, K, factor, slack) / tokens_per_micro   # E x C / S
flops = predict.step_flops(config, E, K, seq, slots)   # MFU: k experts a token; HFU: every capacity slot
util = Utilization(ctx, config, seq, micro * accum * ctx.world_size * seq, S["ds"]["precision"],
                   flops=(flops.model, flops.hardware, f"every capacity slot computed: {slots:g} a token, k = {K}"))
for step in range(steps):
    dispatch.TALLY.reset()
    before = comms.snapshot() if comms.enabled() else None
    total, t0 = 0.0, time.perf_counter()
    with comms.off() if step != census_step else contextlib.nullcontext():  # the logger waits on each collective
        for x, y in batch(step):
            loss = engine(x, y)
            backward(engine, loss, mesh)
            engine.step()
            total += loss.item()
    times.append(time.perf_counter() - t0)
    if step == census_step:
        routing = [(s.counts, s.dropped, s.capacity) for s in model.routing]  # the last micro-batch
        if opts["impl"] == "hand":
            alltoall = {phase: (c, b) for (_, phase), (c, b) in dispatch.TALLY.rows().items()}
        elif before is not None:
            t = comms.per_step(before, comms.snapshot(), 1).get("all_to_all_single", comms.Traffic(0, 0, 0))
            alltoall = {"forward + backward": (t.calls, t.bytes)}
    mean = torch.tensor([total / accum], dtype=torch.float64, device=dev)
    dist.all_reduce(mean, group=mesh.group("dp"))
    losses.append(mean.item() / dp)
    ctx.metrics.step(step=step, loss=losses[-1], step_time_s=times[-1], **util.of_step(times[-1]))
    ctx.metrics.progress(f"ep {EP}, {opts['impl']}", step + 1, steps, f"loss {losses[-1]:.4f}")

parity = min(S["train"]["parity_steps"], steps)
if ctx.is_main and parity:  # every expert on one rank, every replica's micro-batches, the same optimizer
    reference = unsharded.to(dev)
    want_losses = reference_losses(reference, ds, every_replica(batch, dp), parity)
    ctx.log("\nloss (cross-entropy + load balancing), expert-parallel vs unsharded: "
            + step_by_step(losses, want_losses))
    ctx.check(*follows("the expert-parallel model follows the unsharded reference", losses, want_losses))

# ---- 4. Where the tokens went: routes per expert, and what the capacity factor drops --------
everyone = gathered(routing)
x, _ = batch(steps)[0]  # one batch after training, the same on every rank of a replica
sweep = []
with torch.no_grad():
    for f in opts["capacity_sweep"]:
        for layer in model.layers:
            layer.mlp.set_capacity_factor(f)
        model(x)
        dropped = sum(s.dropped for s in model.routing)
        sweep.append((f, dropped, predict.dropped_if_even(tokens_per_micro, E, K, f, slack) * config.layers))
    for layer in model.layers:
        layer.mlp.set_capacity_factor(factor)
sweeps = gathered(sweep)
routes = K * tokens_per_micro * config.layers * ctx.world_size  # routes per micro-batch, all layers and ranks
if ctx.is_main:
    C = routing[0][2]
    ctx.log(f"\nroutes per expert at step {census_step} (its last micro-batch, {tokens_per_micro} tokens per rank, "
            f"top-{K}), capacity C = {C} = max(ceil({K} x {tokens_per_micro} / {E} x {factor}), {slack}) per rank")
    for i in range(config.layers):
        per_rank = [r[i] for r in everyone]
        ctx.log(f"  layer {i}: " + "   ".join(f"rank {r} [{' '.join(map(str, counts))}] {dropped} dropped"
                                             for r, (counts, dropped, _) in enumerate(per_rank)))
    if opts["impl"] == "deepspeed":  # DeepSpeed's gate sizes its own queues: compare
        ctx.check("DeepSpeed's capacity as predicted", C == predict.capacity(tokens_per_micro, E, K, factor, slack),
                  f"C = {C} read from DeepSpeed's gate (plscale estimate moe)")
    ctx.log(f"\nroutes dropped at each capacity factor (one batch after training, all {config.layers} layers, "
            f"all ranks), measured / if the router were even")
    table = []
    for i, f in enumerate(opts["capacity_sweep"]):
        got, even = sum(s[i][1] for s in sweeps), sum(s[i][2] for s in sweeps)
        table.append((f, 100 * got / routes, 100 * even / routes))
        ctx.log(f"  factor {f:5}: {got:6} / {even:6} routes of {routes}  ({table[-1][1]:.1f}% / {table[-1][2]:.1f}%)")
        figures.append(figure(f"routes dropped at capacity factor {f}", round(table[-1][1], 2), "%",
                              round(table[-1][2], 2), "predicted: an even router"))
    ctx.log("  an even router drops the least a factor allows (k S - E C when positive); the rest is the "
            "router's imbalance")
    layer0 = {f"rank {r}": counts for r, (counts, _, _) in enumerate(r[0] for r in everyone)}
    plots.routing_chart(ctx.run_dir / "experts.png", layer0, C, table,
                        f"{E} experts, top-{K}, ep {EP}: routes of layer 0 at step {census_step} (factor {factor}); "
                        f"drops of all layers, one batch after training")

# ---- 5. The all-to-alls of one step against plscale estimate moe ----------------------------
a2a = predict.alltoall_bytes(tokens_per_micro, E, K, factor, config.hidden, EP, 4, slack)
want_calls, want_bytes, want_sent = a2a.per_step(config.layers, accum)
got_calls, got_bytes = sum(c for c, _ in alltoall.values()), sum(b for _, b in alltoall.values())
if ctx.is_main:
    source = "the dispatch's tally" if opts["impl"] == "hand" else "DeepSpeed's comms logger"
    ctx.log(f"\nall-to-alls per step on this rank ({source}), measured / predicted")
    for phase, (c, b) in alltoall.items():
        ctx.log(f"  {phase:20}{c:4g} calls  {b / MiB:8.3f} MiB")
    ctx.log(f"  in all: {got_calls:g} / {want_calls} calls, {got_bytes / MiB:.3f} / {want_bytes / MiB:.3f} MiB "
            f"(4 per layer and micro-batch of E x C x h = {E} x {a2a.capacity} x {config.hidden} fp32); "
            f"{want_sent / MiB:.3f} MiB leave the rank ((ep - 1)/ep)")
    ctx.check("all-to-all bytes per step as predicted", (got_calls, got_bytes) == (want_calls, want_bytes),
              f"{got_calls:g} calls, {got_bytes:,.0f} bytes; predicted {want_calls}, {want_bytes:,}")
    figures += [mib_figure("all-to-all messages per rank per step", got_bytes, want_bytes,
                           f"{want_sent / MiB:.3g} MiB of them leave the rank"),
                figure("final loss", round(losses[-1], 4), "nats"),
                *util.figures([t for i, t in enumerate(times) if i not in (0, census_step)] or times)]
    ctx.log("\nexperts.png: routes per expert against the capacity, and dropped routes against the factor")
ctx.finish(figures, data=corpus.source, real_data=corpus.real, tokenizer=tokens.tokenizer, ep=EP, dp=dp,
           impl=opts["impl"], losses=losses, routing=everyone, dropped=table if ctx.is_main else None,
           alltoall={"calls": got_calls, "bytes": got_bytes})
