"""The step-time model of `plscale plan` (plscale.predict.plan): seconds of one optimizer step of a
candidate layout, as the sum of TERMS. Host-side and pure.

The pace is set by the slowest pipeline stage. Stages differ at their ends: the first holds the
embedding, the last the output head and the loss (and, on Llama 3's uneven split, both hold one
layer fewer). Each kind of stage (first, middle, last; one stage with pp 1) is costed as below and
the one with the most compute + tp + cp sets every term.

  compute   the stage's FLOPs (recompute.step_flops: 6 per weight per token, attention, what
            recomputation reruns; the head's on the last stage) x tokens x pp / (gpus x peak x
            efficiency), `compute_seconds`: each GPU of a stage does 1 / (dp tp cp) of the stage's work.
            The efficiency is the job's where it states one, else the layer's at the candidate's
            per-GPU shapes (`efficiency`: matmul.layer_efficiency, the GEMMs at the GPU's measured best
            rate, tile and wave quantization, flash or materialised attention, memory-bound
            elementwise work), 0.5 on a GPU whose matmul figures are not known;
            plus, where it was measured (CPU ranks: `GPU.layer_overhead_us`), a layer's fixed cost
            for each of its layers and micro-batches, which tp and cp do not divide
  bubble    the pipelined work (compute + tp + pp + cp) x f / (1 - f),
            f = pipeline.bubble_fraction(pp, m, v) = (pp - 1) / (v m + pp - 1): with 1F1B (v 1) and
            pp 4, m 8 the bubble is 3/8 of the busy time; interleaved with v 2, 3/16.
            CPU ranks sharing c cores (cluster.cpu_ranks: N ranks, N > c) take turns on them: a rank
            idle in the bubble hands its core to a busy one. The measured FLOP/s are a rank's share
            while all N work (c/N of a core), so a rank alone runs up to N/c times faster; the step
            takes the longer of the work at that share (W, no bubble) and the pipeline's critical
            path at a core each, W (c/N) / (1 - f): bubble = max(0, W c / (N (1 - f)) - W). An
            optimistic bound: it assumes the scheduler shares the cores perfectly, and speeds up
            the communication terms in W like compute
  tp        every collective of tensor_parallel.collectives (Megatron's f and g: 4 a layer a
            micro-batch; the embedding's on the first stage, the head's and the loss's on the
            last), on the critical path, not overlapped. Full recomputation reruns each layer's
            forward, its forward collectives too (x 2 for those); selective recomputation reruns
            only the attention core, which lies between f and g and needs no collective. With the job's
            tp_overlap (Megatron-Core's --tp-comm-overlap, torchtitan's async TP: each collective split
            into chunks pipelined with the GEMM beside it; both need sequence parallelism), only what the
            stage's compute cannot cover: max(0, tp - compute)
  dp        the gradient sync over the dp x cp ranks (Megatron's dp-cp group) of pΨ bytes (Ψ =
            memory.rank_params; 4Ψ of fp32 gradients under Megatron's optimizer; with expert parallelism
            the rank's experts sync over the edp ranks holding the same experts (memory.expert_split), etp x
            ep apart, their seconds added to the dense part's before the overlap below), issued a layer at a time
            (buckets, FSDP units): stage 0 one all-reduce a step; 1 a reduce-scatter and an all-gather a
            step; 2 a reduce-scatter a micro-batch and an all-gather a step; 3 per micro-batch an all-gather
            forward, one backward and a reduce-scatter (the ZeRO paper's 1.5x stage 0's volume). Overlap:
            reductions hide behind the backward of their micro-batch (backward and recomputation), ZeRO-3's
            forward gathers behind its forward; the parameter all-gather after the optimizer step (stages
            1-2) is exposed, unless the job's gather_overlap (Megatron-Core's --overlap-param-gather) hides
            it behind the next step's first forward
  pp        point-to-point, per micro-batch and chunk boundary an activation forward and a
            gradient backward of b (s/cp) h e bytes, / tp (Megatron's scatter-gather: Narayanan
            et al. 2021 sec. 4.1); not overlapped
  cp        ring attention's k, v hops (context_parallel.ring_bytes, with the kv_heads / tp heads
            a TP rank holds) for each layer and micro-batch, plus the forward's hops again when
            recomputation reruns the attention; hidden behind the causal attention core of the
            rank's zig-zag share (context_parallel.pair_work's scores: 4 d FLOPs a score forward,
            twice that backward)
  ep        expert parallelism's all-to-alls (a mixture of experts, ep > 1): per MoE layer and
            micro-batch, dispatch and combine forward and both again backward, 4 (6 when full
            recomputation reruns the forward); each carries the k routes of the rank's tokens, b s/(cp t) h e
            bytes each route (Megatron-Core's dropless alltoall dispatcher, sequence parallel over tp; no
            capacity padding), (ep - 1)/ep of them leaving the rank. The ep ranks are etp apart (Megatron-Core's
            expert grid over a stage's tp x cp x dp ranks: etp, ep, edp; etp is tp, or 1 when the experts
            are whole, its parallel folding, and then the tp group issues only the attention's pair of
            collectives a layer); inside a node the bytes leave over NVLink; a group
            spanning nodes with k members a node sends (ep - k)/ep over the rank's own network card and the
            rest over NVLink at once, the slower setting the time, plus one latency step. Not overlapped
            (DeepSeek-V3's DualPipe hides them; Megatron-Core's 1F1B A2A overlap: not modelled), on the
            critical path like tp's
  optimizer the optimizer step over the parameters a rank keeps states of (rank_params; / dp x cp
            under ZeRO 1-3), after the gradients and before ZeRO's parameter all-gather: a
            measured AdamW's seconds a parameter (CPU ranks, cluster.cpu_ranks), else an
            elementwise AdamW's ADAM_BYTES a parameter read and written at the HBM bandwidth
            (0 when the GPU's is unknown)

Collectives (`collective_seconds`): bytes x busbw.bus_factor(op, n) / bandwidth + latency steps
x a step's latency. The bandwidth is the link's (below), or inside a node an op's own where it
was measured (`GPU.collective_gbs`: gloo's reduce-scatter and all-gather on CPU ranks). Latency
steps: an all-reduce takes the fewer of a ring's (n - 1 a phase, two phases) and a tree's (log2 n a
phase): NCCL switches to its tree at scale. An all-gather or a reduce-scatter runs as a ring, n - 1
steps: NCCL has no tree for them, and its PAT algorithm (log n) serves only one GPU a node.

Links (`link`): ranks are laid out as Megatron orders them, tp fastest, then cp, dp, pp. A group
of n ranks `stride` apart stays on NVLink when every such group lies inside one node (span n x
stride at most a node and dividing it). A group that crosses nodes with k members on each node
it touches runs its collectives at min(NVLink, k x network): NCCL spreads its rings over the k
network cards (one per GPU); the fewest members any group has on one node set k.
Point-to-point traffic (pp, cp's ring hops) uses one card a pair: the network's bandwidth. Its
latency a message is a ring step's, or a hop's where it was measured (`GPU.p2p_latency_us`).

Not modelled: launch latency on GPUs, kernels reaching less than matmul.py gives them (on H100s the
published runs are 13-30 % slower than predicted: benchmarks/plan_validation.py), DeepSpeed's ZeRO-3
gathers of 2021 (3-4x slower than NCCL's rates at 1,536 GPUs), the network's lower efficiency on small
messages (a ring's chunk is its message / n), congestion between groups sharing a card, zero-bubble
schedules, expert parallelism, offload, fp8.
"""

from collections import Counter
from dataclasses import replace
from functools import cache
from math import ceil, gcd, log2

from plscale.predict.busbw import bus_factor
from plscale.predict.cluster import GPU
from plscale.predict.context_parallel import check_split, chunks, pair_work, ring_bytes
from plscale.predict.matmul import layer_efficiency
from plscale.predict.memory import BYTES, Setup, expert_split, rank_params
from plscale.predict.pipeline import bubble_fraction, in_flight
from plscale.predict.presets import ModelConfig
from plscale.predict.recompute import layer_forward_flops, step_flops
from plscale.predict.tensor_parallel import ELEMENT_BYTES
from plscale.predict.tensor_parallel import collectives as tp_collectives

TERMS = ("compute", "bubble", "tp", "dp", "pp", "cp", "ep", "optimizer")
LABELS = {"compute": "compute", "bubble": "pipeline bubble", "tp": "tensor-parallel comm",
          "dp": "data-parallel comm", "pp": "pipeline p2p", "cp": "context-parallel ring",
          "ep": "expert all-to-all", "optimizer": "optimizer step"}
UNKNOWN_EFFICIENCY = 0.5   # a GPU without matmul figures (cluster.GPU.mamf, sms, hbm_gbs): a stated assumption
# bytes an elementwise AdamW moves a parameter: reads the fp32 master, gradient and two moments,
# writes the master and the moments back (7 x 4 B; fused and foreach kernels touch each once)
ADAM_BYTES = 28


def latency_steps(op: str, n: int) -> int:
    """Latency steps of one collective over n ranks: an all-reduce's min(ring, tree) for each of its two
    phases, ring n - 1 for the others (module doc)."""
    if n <= 1:
        return 0
    if op == "all_reduce":
        return 2 * min(n - 1, ceil(log2(n)))
    return n - 1


def collective_seconds(op: str, nbytes: float, n: int, link: tuple[float, float], calls: int = 1) -> float:
    """`calls` collectives of `nbytes` in all over n ranks on a link (bytes/s, seconds a step)."""
    bandwidth, latency = link
    return nbytes * bus_factor(op, n) / bandwidth + calls * latency_steps(op, n) * latency


def compute_seconds(flops: float, gpus: int, gpu: GPU, precision: str = "bf16", efficiency: float = 1.0) -> float:
    """Seconds for `flops` shared evenly by `gpus` GPUs, each at `efficiency` of its dense peak:
    flops / (gpus x peak x efficiency), the compute term above (perfect scaling, no communication).

    >>> from plscale.predict.cluster import GPUS
    >>> round(compute_seconds(989e12 * 8, 8, GPUS["H100"], efficiency=0.5), 6)
    2.0
    """
    return flops / (gpus * gpu.peak(precision) * efficiency)


@cache
def fewest_per_node(n: int, stride: int, per_node: int) -> int | None:
    """None when every group of n ranks `stride` apart lies inside one node; else the fewest
    members any such group has on one node it touches."""
    if n <= 1:
        return None
    if stride >= per_node:
        return 1
    fewest = None
    period = per_node // gcd(n * stride, per_node)     # groups before the node pattern repeats
    for block in range(period):
        for inner in range(stride):
            counts = Counter((block * n * stride + inner + j * stride) // per_node for j in range(n))
            if len(counts) > 1:
                fewest = min(fewest or n, *counts.values())
    return fewest


def link(gpu: GPU, n: int, stride: int, op: str = "all_reduce") -> tuple[float, float]:
    """(bytes/s, seconds a latency step) of the collectives `op` of a group of n ranks `stride` apart."""
    k = fewest_per_node(n, stride, gpu.gpus_per_node)
    if k is None:
        return gpu.collective_gbs.get(op, gpu.intra_gbs) * 1e9, gpu.intra_latency_us * 1e-6
    return min(gpu.intra_gbs, k * gpu.inter_gbs) * 1e9, gpu.inter_latency_us * 1e-6


def p2p_link(gpu: GPU, n: int, stride: int) -> tuple[float, float]:
    """Point-to-point between neighbours of such a group: one network card a pair when it crosses."""
    if fewest_per_node(n, stride, gpu.gpus_per_node) is None:
        return gpu.intra_gbs * 1e9, (gpu.p2p_latency_us or gpu.intra_latency_us) * 1e-6
    return gpu.inter_gbs * 1e9, (gpu.p2p_latency_us or gpu.inter_latency_us) * 1e-6


def links(gpu: GPU, n: int, stride: int) -> tuple:
    """((op, link), ...) for the collectives a tensor-parallel group issues, hashable for the cache."""
    return tuple((op, link(gpu, n, stride, op)) for op in ("all_reduce", "all_gather", "reduce_scatter"))


def stages(layers: int, pp: int, heaviest: int) -> dict[str, tuple[int, bool, bool]]:
    """name -> (layers, holds the embedding, holds the head) of each kind of pipeline stage."""
    if pp == 1:
        return {"the only stage": (layers, True, True)}
    edge = heaviest - 1 if heaviest * pp == layers + 2 else heaviest
    out = {"first stage": (edge, True, False), "last stage": (edge, False, True)}
    if pp > 2:
        out["middle stages"] = (heaviest, False, False)
    return out


@cache
def tp_parts(model: ModelConfig, tp: int, tokens: int, micro_batch: int, precision: str, sp: bool, m: int,
             op_links: tuple) -> tuple[float, float, float, float]:
    """Seconds a step of TP collectives: (a layer's forward ones, a layer's backward ones, the first
    stage's own, the last stage's own), from tensor_parallel.collectives of 1 and 2 layers."""
    def seconds(layers):
        rows = tp_collectives(replace(model, layers=layers), tp, tokens, micro_batch, precision, sp=sp,
                              micro_batches=m)
        out, by_op = {}, dict(op_links)
        for r in rows:
            key = ("embedding" if r.where.startswith("embedding") else "rest", r.phase)
            out[key] = out.get(key, 0.0) + collective_seconds(r.op, r.total, tp, by_op[r.op], r.calls)
        return out
    one, two = seconds(1), seconds(2)
    layer = {k: two[k] - one[k] for k in two}
    edge = {k: one[k] - layer[k] for k in one}
    forward, backward = layer.get(("rest", "forward"), 0.0), layer.get(("rest", "backward"), 0.0)
    first = edge.get(("embedding", "forward"), 0.0) + edge.get(("embedding", "backward"), 0.0)
    last = edge.get(("rest", "forward"), 0.0) + edge.get(("rest", "backward"), 0.0)   # head, loss, final norm
    return forward, backward, first, last


def tp_seconds(job, gpu: GPU, c, layers: int, first: bool, last: bool) -> float:
    """TP collectives of one stage a step (module doc), full recomputation's forward rerun included."""
    if c.tp == 1:
        return 0.0
    forward, backward, own_first, own_last = tp_parts(job.model, c.tp, job.seq // c.cp, c.micro_batch,
                                                      job.precision, c.sp, c.micro_batches, links(gpu, c.tp, 1))
    rerun = 2 if c.recompute == "full" else 1
    if job.model.moe and c.expert_tp == 1:   # whole experts: only the attention's pair; the all-to-all moves the MLP's tokens
        forward, backward = forward / 2, backward / 2
    return layers * (rerun * forward + backward) + first * own_first + last * own_last


@cache
def _causal_scores(seq: int, cp: int) -> int:
    """Unmasked query-key scores of a rank's zig-zag share (one sequence, one head): rank 0's, which
    context_parallel.attention_work counts for every rank, and the zig-zag makes all ranks' equal."""
    check_split(seq, cp, "zigzag")
    size = seq // (2 * cp)
    return sum(pair_work(i, j, size) for i in chunks(cp, 0, "zigzag") for j in range(2 * cp))


def cp_seconds_a_layer(job, gpu: GPU, c, rate: float) -> float:
    """Exposed ring-attention seconds of one layer a step (module doc)."""
    model, e = job.model, ELEMENT_BYTES[job.precision]
    ring = ring_bytes(c.micro_batch, job.seq, c.cp, model.kv_heads // c.tp, model.head_dim, e)
    rerun = c.recompute != "none"
    bandwidth, latency = p2p_link(gpu, c.cp, c.tp)
    hops = (ring.total + rerun * ring.forward) / bandwidth + (1 + rerun) * (3 * (c.cp - 1) + 1) * latency
    forward = 4 * model.head_dim * _causal_scores(job.seq, c.cp) * (model.heads // c.tp) * c.micro_batch
    window = compute_seconds((3 + rerun) * forward, 1, gpu, job.precision, rate) if job.overlap else 0.0
    return c.micro_batches * max(0.0, hops - window)


def ep_seconds_a_layer(job, gpu: GPU, c) -> float:
    """Expert all-to-alls of one MoE layer a step (module doc); 0 without expert parallelism."""
    if c.ep == 1:
        return 0.0
    model = job.model
    routes = model.top_k * c.micro_batch * job.seq // (c.cp * c.tp)
    message = routes * model.hidden * ELEMENT_BYTES[job.precision]
    k = fewest_per_node(c.ep, c.expert_tp, gpu.gpus_per_node)
    if k is None:
        seconds = message * (c.ep - 1) / c.ep / (gpu.intra_gbs * 1e9) + gpu.intra_latency_us * 1e-6
    else:
        seconds = max(message * (k - 1) / c.ep / (gpu.intra_gbs * 1e9),
                      message * (c.ep - k) / c.ep / (gpu.inter_gbs * 1e9)) + gpu.inter_latency_us * 1e-6
    calls = 6 if c.recompute == "full" else 4
    return c.micro_batches * calls * seconds


def efficiency(job, gpu: GPU, c) -> float:
    """The fraction of the peak a candidate's compute reaches: the job's, else its layer's (module doc)."""
    if job.efficiency is not None:
        return job.efficiency
    if not (gpu.mamf and gpu.sms and gpu.hbm_gbs):
        return UNKNOWN_EFFICIENCY
    return layer_efficiency(gpu, job.model, job.seq, c.micro_batch, c.tp, c.cp, c.sp, job.precision, job.fp8,
                            c.ep, c.expert_tp)


def step_terms(job, gpu: GPU, c, setup: Setup, heaviest: int) -> dict:
    """Seconds of each of TERMS for one optimizer step of candidate c (module doc)."""
    model, m = job.model, c.micro_batches
    flops = _step_flops(model, job.seq, c.recompute)
    layer_fwd = layer_forward_flops(model, job.seq)
    head = 3 * (flops.forward - model.layers * layer_fwd)
    layer = 3 * layer_fwd + flops.recompute / model.layers
    rate = efficiency(job, gpu, c)
    per_flop = compute_seconds(job.global_batch * job.seq * c.pp, job.gpus, gpu, job.precision, rate)
    flash = job.efficiency is None and model.attention != "math" and gpu.mamf   # the core runs at the flash rate
    cp_layer = cp_seconds_a_layer(job, gpu, c, gpu.flash if flash else rate) if c.cp > 1 else 0.0
    ep_layer = ep_seconds_a_layer(job, gpu, c)
    paced = {}
    for name, (layers, first, last) in stages(model.layers, c.pp, heaviest).items():
        compute = (layers * layer + last * head) * per_flop + m * layers * gpu.layer_overhead_us * 1e-6
        paced[name] = (compute, tp_seconds(job, gpu, c, layers, first, last), layers * cp_layer,
                       layers * ep_layer, layers)
    compute, tp, cp, ep, layers = max(paced.values(), key=lambda t: t[0] + t[1] + t[2] + t[3])
    if job.tp_overlap and c.sp and job.overlap:   # Megatron-Core and torchtitan overlap with sp only
        tp = max(0.0, tp - compute)

    per_micro = compute / m if job.overlap else 0.0
    backward_window = per_micro * (flops.backward + flops.recompute) / flops.total
    forward_window = per_micro * flops.forward / flops.total
    n = c.dp * c.cp
    if c.ep > 1 or c.expert_tp != c.tp:   # the experts' gradients over the edp ranks holding the same experts
        dense, experts, edp = expert_split(setup)
        syncs = [(dense, n, c.tp), (experts, edp, c.expert_tp * c.ep)]
    else:
        syncs = [(rank_params(setup), n, c.tp)]
    reduce, scatter, gather = (sum(t) for t in zip(*(_sync_seconds(job, gpu, *g, layers) for g in syncs)))
    after_step = max(0.0, gather - forward_window) if job.gather_overlap else gather
    if c.zero == 0:     # an all-reduce: a reduce-scatter and an all-gather's bytes, at its own rate
        dp = max(0.0, reduce - backward_window)
    elif c.zero == 1:
        dp = max(0.0, scatter - backward_window) + after_step
    elif c.zero == 2:
        dp = m * max(0.0, scatter - backward_window) + after_step
    else:
        dp = m * (max(0.0, gather - forward_window) + max(0.0, gather + scatter - backward_window))

    pp = 0.0
    if c.pp > 1:   # each micro-batch crosses the rank's v chunk boundaries, forward and backward
        bandwidth, latency = p2p_link(gpu, c.pp, c.tp * c.cp * c.dp)
        activation = c.micro_batch * (job.seq // c.cp) * model.hidden * ELEMENT_BYTES[job.precision] / c.tp
        pp = 2 * m * c.virtual * (activation / bandwidth + latency)

    bubble = 0.0
    if c.pp > 1:
        f = bubble_fraction(c.pp, m, c.virtual)
        work = compute + tp + pp + cp + ep
        if gpu.cores and job.gpus > gpu.cores:   # ranks taking turns on shared cores (module doc)
            bubble = max(0.0, work * gpu.cores / (job.gpus * (1 - f)) - work)
        else:
            bubble = work * f / (1 - f)
    kept = sum(params / (group if c.zero >= 1 else 1) for params, group, _ in syncs)   # the states this rank steps
    if gpu.optimizer_ns:
        optimizer = kept * gpu.optimizer_ns * 1e-9
    else:
        optimizer = kept * ADAM_BYTES / (gpu.hbm_gbs * 1e9) if gpu.hbm_gbs else 0.0
    return {"compute": compute, "bubble": bubble, "tp": tp, "dp": dp, "pp": pp, "cp": cp, "ep": ep,
            "optimizer": optimizer}


def _sync_seconds(job, gpu: GPU, params: float, n: int, stride: int, layers: int) -> tuple[float, float, float]:
    """(all-reduce, reduce-scatter, all-gather) seconds of a rank's `params` over n ranks `stride` apart,
    a layer at a time: the gradients' pΨ (4Ψ under Megatron's optimizer), the weights' pΨ."""
    if n <= 1:
        return 0.0, 0.0, 0.0
    weights = BYTES[job.precision] * params
    grads = 4 * params if job.optimizer == "megatron" else weights   # Megatron reduces in fp32

    def seconds(op, nbytes):
        return collective_seconds(op, nbytes, n, link(gpu, n, stride, op), calls=layers)
    return seconds("all_reduce", grads), seconds("reduce_scatter", grads), seconds("all_gather", weights)


_step_flops = cache(step_flops)


@cache
def in_flight_ratio(pp: int, m: int, v: int) -> float:
    """Activations rank 0 holds under interleaved 1F1B against plain 1F1B's (pp micro-batches of a
    stage): chunks in flight (pipeline.in_flight) of 1/v of a stage each, over pp. The peak comes at
    the end of the warm-up, 2(pp-1) + (v-1)pp forwards: m beyond 4pp (4 pp v > that) changes nothing."""
    return in_flight("interleaved", pp, min(m, 4 * pp), 0, v) / (pp * v)
