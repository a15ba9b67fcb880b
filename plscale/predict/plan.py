"""The best training configuration for a model on a cluster: enumerate, keep what fits, rank by
a step-time model. The last question of the Ultra-Scale Playbook, answered on paper.

Host-side and pure: `plscale plan` prints it; tests/test_plan.py checks it against published
layouts (plscale.predict.published) and benchmarks/plan_order.py against runs on this machine.

Enumerated: tp (at most a node's GPUs; divides hidden, heads, kv heads, ffn and vocabulary:
tensor_parallel.check_divisible), pp (divides the layers, or, as Llama 3 did, the layers plus 2:
first and last stage one layer fewer), cp (divides seq), dp = gpus / (tp pp cp) dividing the
global batch B, ZeRO stage 0-3 (0-1 with pp > 1: DeepSpeed's pipeline engine refuses ZeRO-2/3,
Megatron's distributed optimizer is ZeRO-1), recomputation none/selective/full, and the
micro-batch b (divides B/dp; m = B/(dp b) micro-batches a step, at least pp with pp > 1).
Sequence parallelism is on whenever tp > 1 and s/cp splits over tp (same bytes as TP alone,
a t-th of the norms' activations: Korthikanti et al. 2022).

Memory per GPU: plscale.predict.memory.estimate (model states, ZeRO over dp x cp ranks, and
activations; 1F1B's first stage holds pp micro-batches of L/pp layers, the whole model's worth).
An uneven pipeline is costed as its heaviest stage: every stage holding k = (L+2)/pp layers.
A configuration fits when it needs at most (1 - headroom) of the GPU's memory (default 10 % kept
for the allocator's fragmentation, communication buffers and the CUDA context).

Step time (seconds), the sum of these terms (`TERMS`), per GPU:
  compute   FLOPs of the step (recompute.step_flops: 6 per weight per token, attention, and what
            recomputation reruns) x tokens / (gpus x peak x efficiency), x k pp / L (the slowest
            stage sets the pace)
  bubble    1F1B's idle time: the pipelined work (compute + tp + pp + cp) x f / (1 - f),
            f = pipeline.bubble_fraction(pp, m) = (pp-1)/(m+pp-1)
  tp        every collective of tensor_parallel.collectives for one stage's layers (4 per layer per
            micro-batch, Megatron), time = bytes x busbw factor / link; inside a node (NVLink); on
            the critical path, not overlapped
  dp        the gradient sync over the dp x cp ranks of pΨ bytes (Ψ = memory.rank_params):
            stage 0 one all-reduce a step; 1 a reduce-scatter and an all-gather a step; 2 a
            reduce-scatter a micro-batch and an all-gather a step; 3 per micro-batch an all-gather
            forward, one backward and a reduce-scatter (ZeRO paper: 1.5x stage 0's volume).
            Overlap: reductions hide behind the backward of their micro-batch (backward and
            recomputation FLOPs), ZeRO-3's forward gathers behind its forward; the parameter
            all-gather after the optimizer step (stages 1-2) is exposed
  pp        point-to-point, per micro-batch an activation forward and a gradient backward of
            b (s/cp) h e bytes, / t with tp (Megatron's scatter-gather: Narayanan et al. 2021
            sec. 4.1); not overlapped
  cp        ring attention's k, v hops (context_parallel.ring_bytes) for each layer and micro-batch,
            hidden behind the attention core's compute of the block in hand (forward + backward)
A group crosses the network (inter-node link) when it spans more than one node, with Megatron's
rank order (tp fastest, then cp, dp, pp): tp inside a node always, cp when tp cp > gpus per node,
dp when tp cp dp > gpus per node, pp when the job has more than one node. Ring collectives run at
the link's bandwidth x busbw's factor (busbw.bus_factor). Not modelled: kernel and launch
latency, interleaved or zero-bubble schedules, expert parallelism, offload, fp8.
MFU = model FLOPs (presets.flops_per_token, no recomputation) / (step time x gpus x peak).
Ranking: fastest first; step times within 1 % are a tie, given to the fewest model-parallel ranks
(tp x pp x cp x v), then the least memory (rank_key).
"""

from dataclasses import dataclass, field, replace
from functools import cache
from itertools import product
from math import log, log1p

from plscale.errors import UserError
from plscale.predict.activations import element_bytes
from plscale.predict.busbw import bus_factor
from plscale.predict.cluster import GPU
from plscale.predict.context_parallel import ring_bytes
from plscale.predict.memory import BYTES, Setup, estimate, rank_params
from plscale.predict.pipeline import bubble_fraction, in_flight
from plscale.predict.presets import ModelConfig, flops_per_token, param_count
from plscale.predict.recompute import attention_core_flops, step_flops
from plscale.predict.tensor_parallel import check_divisible
from plscale.predict.tensor_parallel import collectives as tp_collectives

RECOMPUTE = ("none", "selective", "full")
TERMS = ("compute", "bubble", "tp", "dp", "pp", "cp")
LABELS = {"compute": "compute", "bubble": "pipeline bubble", "tp": "tensor-parallel comm",
          "dp": "data-parallel comm", "pp": "pipeline p2p", "cp": "context-parallel ring"}
HEADROOM = 0.10
RESOLUTION = 0.01              # step times closer than this are a tie (rank_key)


@dataclass(frozen=True)
class Job:
    model: ModelConfig
    gpus: int
    seq: int
    global_batch: int          # sequences per optimizer step
    precision: str = "bf16"
    efficiency: float = 0.5    # fraction of the peak FLOP/s the matmuls reach
    headroom: float = HEADROOM
    fixed: tuple = ()          # (name, value) pairs a candidate must have: dp, tp, pp, cp, zero, recompute
    overlap: bool = True       # communication hides behind compute where the module doc says (False: CPU
                               # ranks, where gloo's threads and the matmuls share the same cores)

    def allows(self, **values) -> bool:
        return all(values.get(k, v) == v for k, v in self.fixed)

    def check(self) -> None:
        for name in ("gpus", "seq", "global_batch"):
            if getattr(self, name) < 1:
                raise UserError(f"--{name.replace('_', '-')} {getattr(self, name)}: must be at least 1.")
        if self.precision not in BYTES:
            raise UserError(f"--precision {self.precision!r}: use bf16, fp16 or fp32.")
        if not 0 < self.efficiency <= 1:
            raise UserError(f"--efficiency {self.efficiency}: a fraction of the peak, above 0 and at most 1.")
        if not 0 <= self.headroom < 1:
            raise UserError(f"--headroom {self.headroom}: a fraction of the GPU's memory, 0 to below 1.")


@dataclass
class Candidate:
    dp: int
    tp: int
    pp: int
    cp: int
    zero: int
    recompute: str
    micro_batch: int
    micro_batches: int         # m, per optimizer step
    sp: bool
    memory: float              # bytes per GPU
    virtual: int = 1           # model chunks per pipeline rank (interleaved 1F1B when > 1)
    terms: dict = field(default_factory=dict)   # TERMS -> seconds
    tokens_per_s: float = 0.0
    mfu: float = 0.0

    @property
    def layout(self) -> tuple[int, int, int, int]:
        return (self.dp, self.tp, self.pp, self.cp)

    @property
    def step_s(self) -> float:
        return sum(self.terms.values())

    def to_dict(self) -> dict:
        return {"dp": self.dp, "tp": self.tp, "pp": self.pp, "cp": self.cp, "zero": self.zero,
                "recompute": self.recompute, "micro_batch": self.micro_batch, "micro_batches": self.micro_batches,
                "virtual": self.virtual, "sp": self.sp, "memory_gib": self.memory / 2**30, "step_s": self.step_s,
                "terms_s": dict(self.terms), "tokens_per_s": self.tokens_per_s, "mfu": self.mfu}


@dataclass
class Plan:
    job: Job
    gpu: GPU
    ranked: list               # every configuration that fits, fastest first
    considered: int            # configurations whose memory was estimated
    least: Candidate | None    # the one needing the least memory, fitting or not

    @property
    def usable(self) -> float:
        return self.gpu.memory * (1 - self.job.headroom)

    def best_per_layout(self) -> list[Candidate]:
        """The fastest configuration of each (dp, tp, pp, cp), fastest first."""
        seen, out = set(), []
        for c in self.ranked:
            if c.layout not in seen:
                seen.add(c.layout)
                out.append(c)
        return out

    def rank_of(self, layout: tuple[int, int, int, int]) -> int | None:
        """1-based place of a (dp, tp, pp, cp) among best_per_layout; None when none of it fits."""
        for i, c in enumerate(self.best_per_layout(), 1):
            if c.layout == layout:
                return i
        return None


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def pipeline_degrees(layers: int) -> dict[int, int]:
    """pp -> layers on the heaviest stage: pp divides L (L/pp), or L + 2 (Llama 3's uneven split,
    first and last stage one layer fewer; at least one layer left on them)."""
    out = {pp: layers // pp for pp in divisors(layers)}
    for pp in divisors(layers + 2):
        if pp not in out and (layers + 2) // pp >= 2:
            out[pp] = (layers + 2) // pp
    return dict(sorted(out.items()))


def tp_degrees(model: ModelConfig, gpus: int, per_node: int) -> list[int]:
    out = []
    for tp in divisors(gpus):
        if tp > per_node:
            break
        try:
            check_divisible(model, tp)
        except UserError:
            continue
        out.append(tp)
    return out


def layouts(job: Job, gpu: GPU):
    """(dp, tp, pp, cp, stage layers) that multiply to the GPUs, dp dividing the global batch."""
    for tp in tp_degrees(job.model, job.gpus, gpu.gpus_per_node):
        for pp, stage_layers in pipeline_degrees(job.model.layers).items():
            if job.gpus % (tp * pp):
                continue
            for cp in divisors(job.gpus // (tp * pp)):
                dp = job.gpus // (tp * pp * cp)
                if job.seq % cp == 0 and job.global_batch % dp == 0 and job.allows(dp=dp, tp=tp, pp=pp, cp=cp):
                    yield dp, tp, pp, cp, stage_layers


def memory_setup(job: Job, c: Candidate, stage_layers: int) -> Setup:
    """The memory model's question for a candidate (an uneven pipeline as its heaviest stage)."""
    model = job.model if stage_layers * c.pp == job.model.layers else replace(job.model, layers=stage_layers * c.pp)
    return Setup(params=param_count(model), stage=c.zero, dp=c.dp * c.cp, precision=job.precision, tp=c.tp,
                 pp=c.pp, sp=c.sp, model=model, seq=job.seq, micro_batch=c.micro_batch, grad_accum=c.micro_batches,
                 recompute=c.recompute, cp=c.cp)


def _link(gpu: GPU, span: int) -> tuple[float, float]:
    """(bytes per second, seconds of latency a ring step) of the slowest link a group of `span`
    consecutive ranks crosses."""
    if span <= gpu.gpus_per_node:
        return gpu.intra_gbs * 1e9, gpu.intra_latency_us * 1e-6
    return gpu.inter_gbs * 1e9, gpu.inter_latency_us * 1e-6


def ring_seconds(op: str, nbytes: float, n: int, gpu: GPU, span: int, calls: int = 1) -> float:
    """`calls` ring collectives of `nbytes` in all over n ranks: bytes x bus factor / link, plus each
    call's n-1 steps (2(n-1) for an all-reduce) of latency (cluster module doc)."""
    bandwidth, latency = _link(gpu, span)
    steps = (n - 1) * (2 if op == "all_reduce" else 1)
    return nbytes * bus_factor(op, n) / bandwidth + calls * steps * latency


def step_terms(job: Job, gpu: GPU, c: Candidate, setup: Setup, stage_layers: int) -> dict:
    """Seconds of each of TERMS for one optimizer step (module doc)."""
    model, m, e = job.model, c.micro_batches, element_bytes(job.precision)
    speed = job.gpus * gpu.peak(job.precision) * job.efficiency
    flops = _step_flops(model, job.seq, c.recompute)
    compute = flops.total * job.global_batch * job.seq / speed * stage_layers * c.pp / model.layers
    per_micro = compute / m if job.overlap else 0.0
    backward_window = per_micro * (flops.backward + flops.recompute) / flops.total
    forward_window = per_micro * flops.forward / flops.total
    tokens = job.seq // c.cp

    tp = _tp_seconds(replace(model, layers=stage_layers), c.tp, tokens, c.micro_batch, job.precision, c.sp, m,
                     _link(gpu, c.tp)) if c.tp > 1 else 0.0

    n, grads = c.dp * c.cp, BYTES[job.precision] * rank_params(setup)
    dp = 0.0
    if n > 1:   # one reduce-scatter or all-gather of pΨ, issued a layer at a time (buckets, FSDP units)
        ring = ring_seconds("reduce_scatter", grads, n, gpu, c.tp * c.cp * c.dp, calls=stage_layers)
        if c.zero == 0:
            dp = max(0.0, 2 * ring - backward_window)
        elif c.zero == 1:
            dp = max(0.0, ring - backward_window) + ring
        elif c.zero == 2:
            dp = m * max(0.0, ring - backward_window) + ring
        else:
            dp = m * (max(0.0, ring - forward_window) + max(0.0, 2 * ring - backward_window))

    pp = 0.0
    if c.pp > 1:   # each micro-batch crosses the rank's v chunk boundaries, forward and backward
        bandwidth, latency = _link(gpu, job.gpus)
        activation = c.micro_batch * tokens * model.hidden * e / c.tp
        pp = 2 * m * c.virtual * (activation / bandwidth + latency)

    cp = 0.0
    if c.cp > 1:
        bandwidth, latency = _link(gpu, c.tp * c.cp)
        ring = ring_bytes(c.micro_batch, job.seq, c.cp, model.kv_heads, model.head_dim, e)
        hops = ring.total / bandwidth + (3 * (c.cp - 1) + 1) * latency
        attention = 3 * attention_core_flops(model, job.seq) * c.micro_batch * tokens / c.tp \
            / (gpu.peak(job.precision) * job.efficiency) if job.overlap else 0.0
        cp = stage_layers * m * max(0.0, hops - attention)

    bubble = 0.0
    if c.pp > 1:
        f = bubble_fraction(c.pp, m, c.virtual)
        bubble = (compute + tp + pp + cp) * f / (1 - f)
    return {"compute": compute, "bubble": bubble, "tp": tp, "dp": dp, "pp": pp, "cp": cp}


@cache
def _in_flight_ratio(pp: int, m: int, v: int) -> float:
    """Activations rank 0 holds under interleaved 1F1B against plain 1F1B's (pp micro-batches of a
    stage): chunks in flight (pipeline.in_flight) of 1/v of a stage each, over pp. The peak comes at
    the end of the warm-up, 2(pp-1) + (v-1)pp forwards: m beyond 4pp (4 pp v > that) changes nothing."""
    return in_flight("interleaved", pp, min(m, 4 * pp), 0, v) / (pp * v)


_step_flops = cache(step_flops)


@cache
def _tp_seconds(stage: ModelConfig, tp: int, tokens: int, micro_batch: int, precision: str, sp: bool, m: int,
                link: tuple[float, float]) -> float:
    """Every tensor-parallel collective of a stage's step, over the TP group's link (bytes/s, latency)."""
    bandwidth, latency = link
    rows = tp_collectives(stage, tp, tokens, micro_batch, precision, sp=sp, micro_batches=m)
    return sum(r.total * bus_factor(r.op, tp) / bandwidth + r.calls * (tp - 1) * (2 if r.op == "all_reduce" else 1)
               * latency for r in rows)


def plan(job: Job, gpu: GPU) -> Plan:
    """Every configuration that fits, ranked by predicted step time (ties: less memory first)."""
    job.check()
    fits, considered, least = [], 0, None
    tokens = job.global_batch * job.seq
    model_flops = flops_per_token(job.model, job.seq) * tokens
    for dp, tp, pp, cp, stage_layers in layouts(job, gpu):
        sp = tp > 1 and (job.seq // cp) % tp == 0
        per_replica = job.global_batch // dp
        for micro_batch in divisors(per_replica):
            m = per_replica // micro_batch
            if pp > 1 and m < pp:
                continue
            chunks = [v for v in divisors(stage_layers) if v == 1 or m % pp == 0] if pp > 1 else [1]
            for zero, recompute in product((0, 1) if pp > 1 else (0, 1, 2, 3), RECOMPUTE):
                if not job.allows(zero=zero, recompute=recompute):
                    continue
                setup = memory_setup(job, Candidate(dp, tp, pp, cp, zero, recompute, micro_batch, m, sp, 0.0),
                                     stage_layers)
                memory = estimate(setup)
                for v in chunks:   # interleaving changes only how many micro-batches' activations are held
                    c = Candidate(dp, tp, pp, cp, zero, recompute, micro_batch, m, sp, memory.total("device"), v)
                    if v > 1 and c.memory > gpu.memory * (1 - job.headroom):
                        break      # v holds more than 1F1B: none of them fits either
                    if v > 1:
                        c.memory += (_in_flight_ratio(pp, m, v) - 1) * memory.term("activations").device
                    considered += 1
                    if least is None or c.memory < least.memory:
                        least = c
                    if c.memory > gpu.memory * (1 - job.headroom):
                        continue
                    c.terms = step_terms(job, gpu, c, setup, stage_layers)
                    c.tokens_per_s = tokens / c.step_s
                    c.mfu = model_flops / (c.step_s * job.gpus * gpu.peak(job.precision))
                    fits.append(c)
    fits.sort(key=rank_key)
    return Plan(job, gpu, fits, considered, least)


def rank_key(c: Candidate) -> tuple:
    """Fastest first; step times within RESOLUTION of each other (in steps of it, log scale) are a
    tie, which goes to the fewest model-parallel ranks (tp pp cp: the simpler program), then the
    least memory. The model cannot tell 1 % apart (module doc: what it leaves out)."""
    return (round(log(c.step_s) / log1p(RESOLUTION)), c.tp * c.pp * c.cp * c.virtual, c.memory)


def why_faster(a: Candidate, b: Candidate) -> str:
    """Why a beats b: the step-time term that differs most in a's favour, and what differs."""
    if rank_key(a)[0] == rank_key(b)[0]:
        more = b.tp * b.pp * b.cp * b.virtual > a.tp * a.pp * a.cp * a.virtual
        return f"a tie within {RESOLUTION:.0%}: " + ("fewer model-parallel ranks" if more else "less memory")
    gains = {t: b.terms[t] - a.terms[t] for t in TERMS}
    term = max(gains, key=gains.get)
    names = {"micro_batch": "micro-batch", "virtual": "v"}
    changed = [f"{names.get(k, k)} {getattr(a, k)} vs {getattr(b, k)}" for k in
               ("dp", "tp", "pp", "cp", "zero", "recompute", "micro_batch", "virtual") if getattr(a, k) != getattr(b, k)]
    if gains[term] <= 0:
        return f"the same step time; less memory ({', '.join(changed) or 'same layout'})"
    return f"{b.step_s - a.step_s:.3g} s faster: {LABELS[term]} {gains[term]:.3g} s less ({', '.join(changed)})"
