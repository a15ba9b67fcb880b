"""Lab 08, context parallelism: the sequence split over ranks, attention across the split.

Long sequences run out of memory in the activations, which grow with s (and attention's
work with s^2). Context parallelism gives each of cp ranks s/cp tokens of every sequence.
Everything but attention works token by token and needs nothing from the other ranks;
attention needs every earlier key. Two ways to give it them:

    ring attention  each rank keeps its queries; key/value blocks go round the ring, and the
                    partial results merge with the online softmax (rescaled by log-sum-exp)
    Ulysses         an all-to-all trades the sequence split for a head split: each rank then
                    attends over the whole sequence with heads / cp heads, and trades back

With a causal mask the plain split leaves the last rank most of the work; the zig-zag split
(2cp chunks, rank r holds chunks r and 2cp - 1 - r) evens it out. The lab checks both attentions
against attention on one rank, measures the balance, the bytes each rank sends and the activations
per rank against their predictions (plscale estimate cp), then trains the split Llama through
DeepSpeed against the dense model's loss, and reports its throughput and MFU.

    plscale lab run ring-attention --gpus 2      (--gpus 4: cp 4; the ulysses variant: DeepSpeed-Ulysses)
    deepspeed --num_gpus 2 labs/08_context_expert/context.py --variant ulysses
        (DS_ACCELERATOR=cpu without GPUs; PLSCALE_DATA_DIR=path/to/wikitext-2 for the real data)
"""

import time
from dataclasses import replace

import deepspeed
import torch
import torch.distributed as dist
import torch.nn.functional as F

from plscale.charts import plots
from plscale.predict import context_parallel as predict, memory
from plscale.predict.activations import activation_bytes
from plscale.predict.presets import preset
from plscale.predict.units import MiB
from plscale.rank import comms, runtime
from plscale.rank.against_dense import every_replica, follows, reference_losses, step_by_step
from plscale.rank.against_prediction import largest_error, mib_figure, within
from plscale.rank.distributed import gathered
from plscale.rank.census import saved_activations
from plscale.strategies.context_parallel import ring_attention as ring, ulysses
from plscale.strategies.context_parallel.llama import ContextParallelLlama, split_batch
from plscale.rank.data import wikitext
from plscale.rank.mesh import MegatronMPU, Mesh
from plscale.rank.metrics import figure
from plscale.rank.models.llama import Llama
from plscale.rank.utilization import Utilization

ctx = runtime.start(__file__)
S, ds, dev = ctx.settings, ctx.ds_config, ctx.device
CP, opts, seq, seed = S["parallel"]["cp"], S["cp"], S["model"]["seq"], S["seed"]
attention, split = opts["attention"], opts["split"]
micro, accum = ds["train_micro_batch_size_per_gpu"], ds["gradient_accumulation_steps"]
config = preset(S["model"]["preset"])
heads, kv_heads, head_dim, figures = config.heads, config.kv_heads, config.head_dim, []

# ---- The mesh: the ranks that share each sequence (cp), and the replicas (dp) --------------
mesh = Mesh.build(cp=CP, dims=("tp", "cp", "dp", "dp-cp", "pp"))
group, me, dp, replica = mesh.group("cp"), mesh.rank_in("cp"), mesh.size("dp"), mesh.rank_in("dp")
ctx.log(f"mesh: {mesh.layout}\n  context-parallel groups (cp): {mesh.layout.groups('cp')}   each sequence split over them"
        f"\n  gradient groups (dp x cp):    {mesh.layout.groups('dp-cp')}   summed over cp, averaged over dp")
if ctx.is_main:
    plots.mesh_grid(mesh.layout, ctx.run_dir / "mesh.png")


def attend(kind: str, cut: str, q, k, v):
    """The rank's slice of q, k, v ([b, heads, s, d], whole on every rank) through one attention."""
    mine = torch.tensor(predict.positions(q.shape[2], CP, me, cut), device=q.device)
    local = [t[:, :, mine].detach().requires_grad_() for t in (q, k, v)]
    out = (ring.ring_attention(*local, group, mine.tolist()) if kind == "ring"
           else ulysses.ulysses_attention(*local, group))
    return mine, local, out


# ---- 1. Attention split over the ranks equals attention on one rank (float64) ---------------
g = torch.Generator().manual_seed(seed)
q, k, v = (torch.randn(2, h, seq, head_dim, generator=g, dtype=torch.float64).to(dev).requires_grad_()
           for h in (heads, kv_heads, kv_heads))
dout = torch.randn(2, heads, seq, head_dim, generator=g, dtype=torch.float64).to(dev)
full = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=kv_heads != heads)
full.backward(dout)
ctx.log(f"\nattention over {seq} tokens split across cp {CP}, against attention on one rank (float64, causal)")
for kind, cut in (("ring", "plain"), ("ring", "zigzag"), ("ulysses", "plain")):
    mine, local, out = attend(kind, cut, q, k, v)
    out.backward(dout[:, :, mine])
    gaps = {"output": (out - full[:, :, mine]).abs().max().item(), **{name: (part.grad - whole.grad[:, :, mine])
            .abs().max().item() for name, whole, part in zip(("dq", "dk", "dv"), (q, k, v), local)}}
    worst = {name: max(gathered(gap, group)) for name, gap in gaps.items()}  # the largest over the ranks
    label = f"{kind} attention, {cut} split" if kind == "ring" else "Ulysses (DeepSpeed DistributedAttention)"
    ctx.log(f"  {label:42}" + "  ".join(f"{n} {gap:.1e}" for n, gap in worst.items()))
    ctx.check(f"{label} equals full attention", max(worst.values()) <= 1e-10,
              f"largest gap over ranks, output and gradients: {max(worst.values()):.1e} (tolerance 1e-10)")

# ---- 2. The causal imbalance: the plain split against the zig-zag one ----------------------
long = opts["balance_seq"]
g = torch.Generator().manual_seed(seed)
q, k, v = (torch.randn(1, h, long, head_dim, generator=g).to(dev).requires_grad_() for h in (heads, kv_heads, kv_heads))
balance = {}
for cut in ("plain", "zigzag"):
    seconds = []
    for _ in range(3):  # the fastest of three runs: the first pays for allocation, others share the cores
        ring.TALLY.reset()
        _, _, out = attend("ring", cut, q, k, v)
        out.sum().backward()
        seconds.append(sum(ring.TALLY.compute_seconds.values()))
    balance[cut] = gathered((ring.TALLY.scores["forward"], min(seconds)), group)  # scores per head; seconds
if ctx.is_main:
    ctx.log(f"\ncausal attention of one {long}-token sequence, work per rank (query-key scores per head) "
            f"and compute time (forward + backward), measured / predicted")
    panels = {}
    for cut, rows in balance.items():
        want = predict.attention_work(long, CP, cut)
        work, times = [w for w, _ in rows], [t for _, t in rows]
        ctx.log(f"  {cut:7} " + "  ".join(f"rank {r}: {w / 1e6:.3f} / {p / 1e6:.3f} M, {1e3 * t:.0f} ms"
                                          for r, (w, t, p) in enumerate(zip(work, times, want))))
        ctx.log(f"          max/min work {predict.imbalance(work):.2f} (predicted {predict.imbalance(want):.2f}), "
                f"max/min time {max(times) / min(times):.2f}")
        ctx.check(f"{cut} split: work per rank as predicted", work == want,
                  f"{[int(w) for w in work]} scores measured, {want} predicted (plscale estimate cp)")
        figures += [figure(f"{cut} split: max/min attention work", round(predict.imbalance(work), 3), "x",
                           round(predict.imbalance(want), 3)),
                    figure(f"{cut} split: max/min attention time", round(max(times) / min(times), 3), "x", None,
                           "compute only, forward + backward")]
        panels[f"{cut}: work per rank, M scores"] = {f"rank {r}": (w / 1e6, p / 1e6)
                                                     for r, (w, p) in enumerate(zip(work, want))}
        panels[f"{cut}: time per rank, ms"] = {f"rank {r}": (1e3 * t, None) for r, t in enumerate(times)}
    zigzag = predict.imbalance([w for w, _ in balance["zigzag"]])
    ctx.check("zig-zag evens the causal work", abs(zigzag - 1) <= 0.1,
              f"max/min {zigzag:.3f} (target within 10% of 1.0; the plain split's "
              f"{predict.imbalance([w for w, _ in balance['plain']]):.2f})")
    plots.measured_vs_predicted(ctx.run_dir / "balance.png", panels,
                                f"causal attention over {long} tokens on cp {CP}: plain split vs zig-zag",
                                unit={name: name.split(", ")[-1] for name in panels}, grid=(2, 2))

# ---- 3. Activations per rank against the sequence length, with and without cp --------------
corpus = wikitext.load_text()
tokens = wikitext.tokenize(corpus, config.vocab)
config = config.with_vocab(tokens.vocab)
torch.manual_seed(seed)
dense = Llama(config).to(dev)
split_model = ContextParallelLlama(config, group, attention, split).to(dev)
split_model.load_state_dict(dense.state_dict())  # the same initial weights
setup = replace(memory.setup_from_ds_config(ds, mesh.size("dp-cp"), config, seq), micro_batch=1)
acts = []
for length in opts["memory_seqs"]:
    x = torch.randint(0, config.vocab, (1, length + 1), generator=torch.Generator().manual_seed(seed)).to(dev)
    with saved_activations() as whole:
        dense(x[:, :-1].clone(), x[:, 1:].clone())
    with saved_activations() as part:
        split_model(*split_batch(x[:, :-1], x[:, 1:], CP, me, split))
    acts.append((length, whole.bytes, activation_bytes(replace(setup, seq=length)), max(gathered(part.bytes, group)),
                 activation_bytes(replace(setup, seq=length, cp=CP))))
if ctx.is_main:
    ctx.log(f"\nactivations saved for backward, one sequence, MiB per rank, measured / predicted "
            f"('{S['model']['preset']}', {attention} attention)")
    for length, got1, want1, got, want in acts:
        ctx.log(f"  seq {length:6}   one rank {got1 / MiB:8.2f} / {want1 / MiB:.2f}   cp {CP} {got / MiB:8.2f} / "
                f"{want / MiB:.2f}   saved {1 - got / got1:.0%}")
    ctx.check(*within("activations per rank match the memory model", [p for r in acts for p in (r[1:3], r[3:5])],
                      S["memory"]["tolerance"], "worst", digits=1))
    last = acts[-1]
    figures += [mib_figure(f"activations per rank, seq {last[0]}, cp {CP}", last[3], last[4]),
                mib_figure(f"activations, seq {last[0]}, one rank", last[1], last[2])]
    plots.measured_and_predicted(ctx.run_dir / "memory.png", [r[0] for r in acts], {
        "one rank": ([r[1] / MiB for r in acts], [r[2] / MiB for r in acts]),
        f"cp {CP}": ([r[3] / MiB for r in acts], [r[4] / MiB for r in acts])},
        f"activations per rank against sequence length ('{S['model']['preset']}')", "sequence length", "MiB")

# ---- 4. Training: the Llama with its sequences split, through DeepSpeed ---------------------
# Each cp rank's loss is its tokens' share; DeepSpeed, told the mesh (MegatronMPU), sums over cp, averages over dp.
engine, *_ = deepspeed.initialize(model=split_model, model_parameters=split_model.parameters(), config=ds,
                                  mpu=MegatronMPU(mesh))
blocks = wikitext.pack(tokens.train, seq)
batch = wikitext.replica_batches(blocks, micro, accum, seed, dev, dp, replica)  # batch(step, replica=mine)
ctx.log(f"\ntraining: {corpus.source}; {len(blocks):,} blocks of {seq} tokens, "
        f"each split over cp {CP} ({split} split), {attention} attention")
steps, losses, times = S["train"]["steps"], [], []
util = Utilization(ctx, config, seq, micro * accum * dp * seq, S["ds"]["precision"])  # a sequence counts once
for step in range(steps):
    t0, total = time.perf_counter(), torch.zeros((), dtype=torch.float64, device=dev)
    with comms.off():  # timed steps: the comms logger waits on every collective
        for x, y in batch(step):
            loss = engine(*split_batch(x, y, CP, me, split))
            engine.backward(loss)
            engine.step()
            total += loss.detach().double() / accum
    dist.all_reduce(total, group=mesh.group("dp-cp"))  # shares add up over cp; replicas average
    losses.append(total.item() / dp)
    times.append(time.perf_counter() - t0)
    ctx.metrics.step(step=step, loss=losses[-1], step_time_s=times[-1], **util.of_step(times[-1]))
    ctx.metrics.progress(f"cp {CP}, {attention}", step + 1, steps, f"loss {losses[-1]:.4f}")
figures += util.figures(times[1:] or times)  # the first step warms up

parity = min(S["train"]["parity_steps"], steps)
if ctx.is_main and parity:  # the dense model has run forwards only: it is at the initial weights
    want = reference_losses(dense, ds, every_replica(batch, dp), parity)
    ctx.log("loss, context-parallel vs dense: " + step_by_step(losses, want))
    ctx.check(*follows("the split Llama follows the dense model's loss", losses, want))
# ---- 5. Bytes each rank sends per layer, as the sequence grows: ring and Ulysses -----------
# Ring: the ring's own tally of point-to-point sends. Ulysses: DeepSpeed's comms logger (on once deepspeed
# .initialize read ds.comms_logger) records each all-to-all's whole message, of which the P-th stays on the rank.
traffic, logged = [], comms.enabled()
for length in opts["comm_seqs"]:
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(1, h, length, head_dim, generator=g).to(dev).requires_grad_()
               for h in (heads, kv_heads, kv_heads))
    ring.TALLY.reset()
    attend("ring", "zigzag", q, k, v)[2].sum().backward()
    ulysses.TALLY.reset()
    before = comms.snapshot() if logged else None
    attend("ulysses", "plain", q, k, v)[2].sum().backward()
    if logged:
        message = comms.per_step(before, comms.snapshot(), 1).get("all_to_all_single", comms.Traffic(0, 0, 0)).bytes
    else:
        message = sum(b for _, b in ulysses.TALLY.rows().values())
    want_ring = predict.ring_bytes(1, length, CP, kv_heads, head_dim, 4)
    want_uly = predict.ulysses_bytes(1, length, CP, heads, kv_heads, head_dim, 4)
    traffic.append((length, sum(ring.TALLY.sent_bytes.values()), want_ring.total, message,
                    want_uly.forward_message + want_uly.backward_message))
if ctx.is_main:
    ctx.log(f"\nper attention layer (forward + backward, one sequence, fp32), measured / predicted: the bytes each "
            f"rank sends by ring; the all-to-all messages of Ulysses "
            f"({'DeepSpeed' + chr(39) + 's comms logger' if logged else 'its tally'}), of which (P - 1)/P leave the rank")
    for length, got_ring, want_ring, got_uly, want_uly in traffic:
        sent = got_uly * (CP - 1) / CP
        ctx.log(f"  seq {length:6}   ring {got_ring / MiB:8.3f} / {want_ring / MiB:.3f} MiB   Ulysses messages "
                f"{got_uly / MiB:8.3f} / {want_uly / MiB:.3f} MiB, sent {sent / MiB:.3f}   ring / Ulysses sent "
                f"{got_ring / sent:.2f}")
    off = largest_error(p for r in traffic for p in (r[1:3], r[3:5]))
    ctx.check("ring bytes and Ulysses messages as predicted", off <= 1e-9,
              f"largest gap {100 * off:.2g}% over {len(traffic)} sequence lengths")
    ctx.log(f"  bytes sent as cp grows (predicted, seq {traffic[-1][0]}): " + "  ".join(
        f"cp {row.cp}: ring {row.ring / MiB:.2f}, Ulysses "
        + (f"{row.ulysses / MiB:.2f}" if row.ulysses else "-") + " MiB"
        for row in predict.comm_table(config, 1, [traffic[-1][0]], [2, 4, 8], 4)))
    last = traffic[-1]
    figures += [mib_figure(f"ring bytes sent per rank per layer, seq {last[0]}", last[1], last[2], "forward + backward"),
                mib_figure(f"Ulysses all-to-all messages per rank per layer, seq {last[0]}", last[3], last[4],
                           "forward + backward; (P - 1)/P of them sent")]
    uly_sent = [predict.ulysses_bytes(1, r[0], CP, heads, kv_heads, head_dim, 4).total_sent for r in traffic]
    plots.measured_and_predicted(ctx.run_dir / "traffic.png", [r[0] for r in traffic], {   # bytes that leave a rank
        "ring: sent": ([r[1] / MiB for r in traffic], [r[2] / MiB for r in traffic]),
        "Ulysses: sent": ([r[3] * (CP - 1) / CP / MiB for r in traffic], [b / MiB for b in uly_sent])},
        f"bytes each rank sends per attention layer, cp {CP}", "sequence length", "MiB")
    figures.append(figure("final loss", round(losses[-1], 4), "nats"))
    ctx.log("\nbalance.png: work and time per rank, both splits; traffic.png: bytes per rank against the sequence; "
            "memory.png: activations per rank; mesh.png: the ranks")
ctx.finish(figures, data=corpus.source, real_data=corpus.real, tokenizer=tokens.tokenizer, cp=CP, dp=dp,
           attention=attention, split=split, losses=losses, balance=balance, traffic=traffic, activations=acts)
