"""The best training configuration for a model on a cluster: enumerate, keep what fits, rank by
a step-time model. The last question of the Ultra-Scale Playbook, answered on paper.

Host-side and pure: `plscale plan` prints it; tests/test_plan.py checks it against published
layouts (plscale.predict.published) and benchmarks/plan_order.py against runs on this machine.

Enumerated (`plan`): tp (at most a node's GPUs; divides hidden, heads, kv heads, ffn and
vocabulary: tensor_parallel.check_divisible), pp (divides the layers, or, as Llama 3 did, the
layers plus 2: first and last stage one layer fewer), cp (2 cp divides seq: Megatron's zig-zag
split), dp = gpus / (tp pp cp) dividing the global batch B, ZeRO stage 0-3 (only 0 when
dp x cp = 1: nothing to shard over; 0-1 with pp > 1: DeepSpeed's pipeline engine refuses
ZeRO-2/3, Megatron's distributed optimizer is ZeRO-1; 0-1 only under Job.optimizer megatron or
bf16-optimizer), recomputation none/selective/full, the micro-batch b (divides B/dp; m = B/(dp b)
micro-batches a step, at least pp with pp > 1), and for pp > 1 the interleaved schedule's v chunks
a rank (v divides the stage's layers, pp divides m).
Sequence parallelism, on or off, wherever tp > 1 and s/cp splits over tp (same bytes as TP alone,
a t-th of the norms' activations: Korthikanti et al. 2022; BLOOM trained without it); always on for a
mixture of experts (Megatron-Core requires it with tp > 1).
A mixture of experts (ModelConfig.experts) adds ep, the expert-parallel ranks, and etp, the experts'
tensor-parallel split: tp (Megatron-Core's default) or 1 (whole experts, its parallel folding, with
ep > 1), ep dividing the experts and ep x etp the stage's tp x cp x dp ranks (Megatron-Core lays the
experts out on their own grid over them); memory.py splits the experts' states, step_time adds the
all-to-alls.
ZeRO-3 is not offered with ep > 1 (DeepSpeed's MoE layers refuse it; FSDP2 with expert parallelism,
torchtitan's, is not modelled).

Memory per GPU: plscale.predict.memory.estimate (model states, ZeRO over dp x cp ranks, and
activations; 1F1B's first stage holds pp micro-batches of L/pp layers, the whole model's worth).
An uneven pipeline is costed as its heaviest stage: every stage holding k = (L+2)/pp layers.
Interleaving (v chunks) holds step_time.in_flight_ratio times 1F1B's activations.
A configuration fits when it needs at most (1 - headroom) of the GPU's memory (default 10 % kept
for the allocator's fragmentation, communication buffers and the CUDA context).

Step time: plscale.predict.step_time (compute at the stated efficiency or, by default, the one the
layout's matmul shapes reach on the GPU (plscale.predict.matmul), the pipeline bubble, and each
dimension's communication over the link it crosses; the slowest stage sets the pace).
MFU = model FLOPs (presets.flops_per_token, no recomputation) / (step time x gpus x peak), the fp8
peak with fp8 matmuls (Job.fp8).
Ranking (`rank`): by step time; then, walking down that order, every candidate within 1 % of the
fastest of its group joins the group (a tie: the model cannot tell 1 % apart), and a slower one
starts the next group. Inside a group, the fewest model-parallel ranks (tp x pp x cp x v x ep: the
simpler program) come first, then the least memory. So a later group is always slower than
an earlier one, and a tie says so (`why_faster`).
"""

from dataclasses import dataclass, field, replace
from itertools import product

from plscale.errors import UserError
from plscale.predict.cluster import GPU
from plscale.predict.errors import PredictionError
from plscale.predict.memory import Setup, estimate
from plscale.predict.presets import ModelConfig, check_moe_shape, flops_per_token, param_count
from plscale.predict.step_time import LABELS, TERMS, efficiency, in_flight_ratio, step_terms
from plscale.predict.tensor_parallel import check_divisible
from plscale.predict.units import BYTES, gib

__all__ = ["HEADROOM", "LABELS", "RECOMPUTE", "RESOLUTION", "TERMS", "Candidate", "Job", "Plan", "plan", "rank",
           "why_faster"]

RECOMPUTE = ("none", "selective", "full")
HEADROOM = 0.10
MAX_GPUS = 2**20               # beyond any cluster built; keeps the enumeration finite and quick
MAX_TOKENS = 2**30             # tokens a step: 64 x the largest published (Llama 3 405B, 16M)
RESOLUTION = 0.01              # step times within this of their group's fastest are a tie (rank)
PP_ZERO = (0, 1)               # ZeRO stages offered with pp > 1 (module doc)


@dataclass(frozen=True)
class Job:
    model: ModelConfig
    gpus: int
    seq: int
    global_batch: int          # sequences per optimizer step
    precision: str = "bf16"
    efficiency: float | None = None   # fraction of the peak FLOP/s the compute reaches; None: the layer's
                               # at each candidate's shapes (step_time.efficiency, matmul.py)
    headroom: float = HEADROOM
    fixed: tuple = ()          # (name, value) pairs a candidate must have: dp, tp, pp, cp, ep, etp, zero, recompute,
                               # micro_batch, virtual, sp
    overlap: bool = True       # communication hides behind compute where the module doc says (False: CPU
                               # ranks, where gloo's threads and the matmuls share the same cores)
    activations: str = "plscale"   # whose activation count (memory.py): plscale's Llama's or Megatron-LM's
    tp_overlap: bool = False   # TP collectives pipelined with the GEMMs (Megatron-Core's --tp-comm-overlap)
    gather_overlap: bool = False   # ZeRO's parameter all-gather behind the next forward (--overlap-param-gather)
    fp8: bool = False          # the GEMMs in fp8 (matmul.py), MFU against the fp8 peak; weights and activations bf16
    optimizer: str = "deepspeed"   # whose gradients the memory counts (memory.py): deepspeed, megatron (fp32
                                   # main grads) or bf16-optimizer; the last two offer ZeRO 0-1 only

    def allows(self, **values) -> bool:
        return all(values.get(k, v) == v for k, v in self.fixed)

    def check(self) -> None:
        for name in ("gpus", "seq", "global_batch"):
            if getattr(self, name) < 1:
                raise PredictionError(name, getattr(self, name), ": must be at least 1.")
        if self.gpus > MAX_GPUS:
            raise PredictionError("gpus", self.gpus, f": the planner covers clusters of up to {MAX_GPUS:,} GPUs.",
                                  show=f"{self.gpus:,}")
        if self.global_batch * self.seq > MAX_TOKENS:
            raise PredictionError("global_batch", self.global_batch,
                                  f" sequences of {self.seq:,} tokens is {self.global_batch * self.seq:,} tokens a step, "
                                  f"more than {MAX_TOKENS:,}: {{global_batch}} counts sequences, not tokens (Llama 3 "
                                  f"405B: 2,048 sequences of 8,192, 16M tokens).", show=f"{self.global_batch:,}")
        check_moe_shape(self.model)
        if self.model.moe and self.activations == "plscale":
            raise PredictionError("activations", self.activations, ": plscale's Llama has no experts: count a "
                                  "mixture of experts' activations as Megatron-LM keeps them ({activations} megatron).")
        if self.precision not in BYTES:
            raise PredictionError("precision", self.precision, ": use bf16, fp16 or fp32.")
        if self.fp8 and self.efficiency is not None:
            raise PredictionError("fp8", self.fp8, ": fp8 GEMMs are priced from the GPU's fp8 figures: drop "
                                  "{efficiency}.", show="")
        if self.fp8 and self.precision == "fp32":
            raise PredictionError("fp8", self.fp8, ": fp8 GEMMs sit beside bf16 or fp16 weights: train in bf16.",
                                  show="")
        if self.efficiency is not None and not 0 < self.efficiency <= 1:
            raise PredictionError("efficiency", self.efficiency, ": a fraction of the peak, above 0 and at most 1.")
        if not 0 <= self.headroom < 1:
            raise PredictionError("headroom", self.headroom, ": a fraction of the GPU's memory, 0 to below 1.")


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
    tie: int = 0               # its tie group in the ranking (rank): the same number, a tie
    parts: dict = field(default_factory=dict)   # memory term -> bytes a GPU (the least-memory candidate's)
    tokens_per_s: float = 0.0
    mfu: float = 0.0
    efficiency: float = 0.0    # the fraction of the peak its compute reaches (step_time.efficiency)
    ep: int = 1                # expert-parallel ranks (a mixture of experts)
    etp: int = 0               # the experts' tensor-parallel split: 0 as tp, or 1 (whole: parallel folding)

    @property
    def expert_tp(self) -> int:
        return self.etp or self.tp

    @property
    def layout(self) -> tuple:
        """(dp, tp, pp, cp), and (ep, etp) after them where the experts are split."""
        split = self.ep > 1 or self.expert_tp != self.tp
        return (self.dp, self.tp, self.pp, self.cp) + ((self.ep, self.expert_tp) if split else ())

    @property
    def step_s(self) -> float:
        return sum(self.terms.values())

    def to_dict(self) -> dict:
        return {"dp": self.dp, "tp": self.tp, "pp": self.pp, "cp": self.cp, "ep": self.ep, "etp": self.expert_tp,
                "zero": self.zero,
                "recompute": self.recompute, "micro_batch": self.micro_batch, "micro_batches": self.micro_batches,
                "virtual": self.virtual, "tie": self.tie, "sp": self.sp, "memory_gib": gib(self.memory),
                "step_s": self.step_s, "terms_s": dict(self.terms), "tokens_per_s": self.tokens_per_s, "mfu": self.mfu,
                "efficiency": self.efficiency}


@dataclass
class Plan:
    job: Job
    gpu: GPU
    ranked: list               # every configuration that fits, in ranked order (rank)
    considered: int            # configurations whose memory was estimated
    least_memory: Candidate | None   # the one needing the least memory, fitting or not

    @property
    def usable(self) -> float:
        return self.gpu.memory * (1 - self.job.headroom)

    def best_per_layout(self) -> list[Candidate]:
        """The first configuration of each (dp, tp, pp, cp) in ranked order."""
        seen, out = set(), []
        for c in self.ranked:
            if c.layout not in seen:
                seen.add(c.layout)
                out.append(c)
        return out

    def rank_of(self, layout: tuple) -> int | None:
        """1-based place of a (dp, tp, pp, cp[, ep, etp]) among best_per_layout; None when none of it fits."""
        for i, c in enumerate(self.best_per_layout(), 1):
            if c.layout == layout:
                return i
        return None


def divisors(n: int) -> list[int]:
    """Every divisor of n, ascending (pairs up to the square root: n may be large)."""
    small = [d for d in range(1, int(n**0.5) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


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
    """(dp, tp, pp, cp, stage layers) that multiply to the GPUs, dp dividing the global batch, 2 cp the
    sequence (cp > 1)."""
    for tp in tp_degrees(job.model, job.gpus, gpu.gpus_per_node):
        for pp, stage_layers in pipeline_degrees(job.model.layers).items():
            if job.gpus % (tp * pp):
                continue
            for cp in divisors(job.gpus // (tp * pp)):
                dp = job.gpus // (tp * pp * cp)
                zigzag = 2 * cp if cp > 1 else 1
                if job.seq % zigzag == 0 and job.global_batch % dp == 0 and job.allows(dp=dp, tp=tp, pp=pp, cp=cp):
                    yield dp, tp, pp, cp, stage_layers


def memory_setup(job: Job, c: Candidate, stage_layers: int) -> Setup:
    """The memory model's question for a candidate (an uneven pipeline as its heaviest stage)."""
    model = job.model if stage_layers * c.pp == job.model.layers else replace(job.model, layers=stage_layers * c.pp)
    return Setup(params=param_count(model), stage=c.zero, dp=c.dp * c.cp, precision=job.precision, tp=c.tp,
                 pp=c.pp, sp=c.sp, model=model, seq=job.seq, micro_batch=c.micro_batch, grad_accum=c.micro_batches,
                 recompute=c.recompute, cp=c.cp, persistence_threshold=0,   # FSDP and Megatron shard every tensor
                 activations=job.activations, virtual=c.virtual, optimizer=job.optimizer, ep=c.ep, etp=c.etp)


def zero_stages(dp: int, cp: int, pp: int, optimizer: str = "deepspeed") -> tuple[int, ...]:
    """The ZeRO stages worth enumerating (module doc): Megatron's optimizer and DeepSpeed's BF16_Optimizer
    shard the optimizer states at most (ZeRO-1)."""
    if dp * cp == 1:
        return (0,)
    return PP_ZERO if pp > 1 or optimizer != "deepspeed" else (0, 1, 2, 3)


def no_layout_reason(job: Job, gpu: GPU) -> str:
    """Why no dp x tp x pp x cp fits the GPUs: the fixed degree at fault, else the batch. Each
    quantity is written `{tp}`, `{gpus}`, ...: the caller words them (predict.errors.worded)."""
    fixed = dict(job.fixed)
    given = {k: fixed[k] for k in ("dp", "tp", "pp", "cp") if k in fixed}
    product = 1
    for value in given.values():
        product *= value
    named = " x ".join(f"{{{k}}} {v}" for k, v in given.items())
    if given and job.gpus % product:
        return f"{named}{f' = {product} GPUs' if len(given) > 1 else ''} does not divide {{gpus}} {job.gpus}"
    if "tp" in given:
        if given["tp"] > gpu.gpus_per_node:
            return f"{{tp}} {given['tp']}: tensor parallelism stays inside a node of {gpu.gpus_per_node} GPUs"
        try:
            check_divisible(job.model, given["tp"])
        except UserError as exc:
            return f"{{tp}} {given['tp']}: {exc}"
    if "pp" in given and given["pp"] not in pipeline_degrees(job.model.layers):
        return f"{{pp}} {given['pp']} divides neither the {job.model.layers} layers nor {job.model.layers} + 2"
    if given.get("cp", 1) > 1 and job.seq % (2 * given["cp"]):
        return (f"{{cp}} {given['cp']}: the zig-zag split needs {{seq}} {job.seq} to be a multiple of "
                f"{2 * given['cp']}")
    if job.model.moe and fixed.get("zero") == 3 and fixed.get("ep", 1) > 1:
        return f"{{zero}} 3 with {{ep}} {fixed['ep']}: DeepSpeed's MoE layers refuse ZeRO-3; use {{zero}} 0-2 or {{ep}} 1"
    if job.model.moe and fixed.get("etp", 1) != 1 and fixed["etp"] != fixed.get("tp", fixed["etp"]):
        return f"{{etp}} {fixed['etp']}: the experts split over {{tp}} {fixed['tp']} or not at all ({{etp}} 1)"
    if job.model.moe and fixed.get("etp", 1) != 1 and fixed["etp"] not in tp_degrees(job.model, job.gpus,
                                                                                     gpu.gpus_per_node):
        return f"{{etp}} {fixed['etp']}: the experts split over a tp the model allows, or not at all ({{etp}} 1)"
    if job.model.moe and fixed.get("etp") == 1 and fixed.get("ep") == 1 and fixed.get("tp", 1) > 1:
        return "whole experts ({etp} 1) on tensor-parallel ranks come with expert parallelism: raise {ep} or drop {etp}"
    if job.model.moe and "ep" in fixed:
        free = replace(job, fixed=tuple((k, v) for k, v in job.fixed if k not in ("ep", "etp")))
        grids = [d * t * c for d, t, _, c, _ in layouts(free, gpu)]
        if not any(g % (fixed["ep"] * fixed.get("etp", 1)) == 0 for g in grids):
            return (f"{{ep}} {fixed['ep']} comes out of a pipeline stage's tp x cp x dp ranks, and no layout left has "
                    f"a multiple of it (the most: {max(grids, default=0)})")
    if job.model.moe and fixed.get("sp") is False and fixed.get("tp", 1) > 1:
        return f"a mixture of experts with {{tp}} {fixed['tp']} needs sequence parallelism (Megatron-Core): leave {{sp}} on"
    if "dp" in given and job.global_batch % given["dp"]:
        dp = given["dp"]
        return (f"{{global_batch}} {job.global_batch} does not split over {{dp}} {dp} replicas: try {{global_batch}} "
                f"{dp * max(1, round(job.global_batch / dp))}, a multiple of {dp}")
    if "micro_batch" in fixed:
        return (f"{{micro_batch}} {fixed['micro_batch']} must divide each replica's share of {{global_batch}} "
                f"{job.global_batch} (global batch / dp) into at least pp micro-batches, for some layout")
    free = job.gpus // product  # the GPUs the free degrees share
    return (f"dp x tp x pp x cp must equal {{gpus}} {job.gpus}, with tp dividing the heads, pp the layers, 2 cp "
            f"{{seq}} {job.seq} and dp {{global_batch}} {job.global_batch}{' and the fixed degrees' if given else ''}"
            + (f": try a global batch that is a multiple of {free}" if free > 1 else ""))


def plan(job: Job, gpu: GPU) -> Plan:
    """Every configuration that fits, ranked (module doc)."""
    job.check()
    if job.fp8:
        gpu.peak("fp8")    # one line for a GPU without fp8 tensor cores
    if job.gpus > gpu.gpus_per_node and job.gpus % gpu.gpus_per_node:
        raise PredictionError("gpus", job.gpus, f" is not a whole number of {gpu.gpus_per_node}-GPU nodes: use a "
                                                f"multiple of {gpu.gpus_per_node} (or set {{gpus_per_node}}).")
    fits, considered, least = [], 0, None
    usable = gpu.memory * (1 - job.headroom)
    tokens = job.global_batch * job.seq
    model_flops = flops_per_token(job.model, job.seq) * tokens
    for dp, tp, pp, cp, stage_layers in layouts(job, gpu):
        splits = tp > 1 and (job.seq // cp) % tp == 0
        if job.model.moe and tp > 1 and not splits:
            continue     # Megatron-Core's experts need sequence parallelism with tp > 1
        sp_options = [sp for sp in ((True,) if job.model.moe else (True, False)) if splits] or [False]
        sp_options = [sp for sp in sp_options if job.allows(sp=sp)]
        experts = [(1, 0)] if job.allows(ep=1, etp=tp) else []   # (ep, etp): dense, or every expert on every rank
        if job.model.moe:   # Megatron-Core's expert grid: etp x ep divides the stage's tp x cp x dp ranks
            experts = [(e, etp) for etp in sorted({tp, 1}, reverse=True) for e in divisors(job.model.experts)
                       if (tp * cp * dp) % (e * etp) == 0 and (e > 1 or etp == tp) and job.allows(ep=e, etp=etp)]
        per_replica = job.global_batch // dp
        for micro_batch in divisors(per_replica):
            m = per_replica // micro_batch
            if (pp > 1 and m < pp) or not job.allows(micro_batch=micro_batch):
                continue
            chunks = [v for v in divisors(stage_layers) if v == 1 or m % pp == 0] if pp > 1 else [1]
            chunks = [v for v in chunks if job.allows(virtual=v)]
            for zero, recompute, sp, (ep, etp) in product(zero_stages(dp, cp, pp, job.optimizer), RECOMPUTE,
                                                          sp_options, experts):
                if not job.allows(zero=zero, recompute=recompute) or (zero == 3 and ep > 1):
                    continue   # DeepSpeed's MoE refuses ZeRO-3; Megatron's optimizer is ZeRO-1
                setup = memory_setup(job, Candidate(dp, tp, pp, cp, zero, recompute, micro_batch, m, sp, 0.0, ep=ep,
                                                    etp=etp), stage_layers)
                memory = estimate(setup)
                for v in chunks:   # interleaving changes only how many micro-batches' activations are held
                    c = Candidate(dp, tp, pp, cp, zero, recompute, micro_batch, m, sp, memory.total("device"), v,
                                  ep=ep, etp=etp)
                    if v > 1 and c.memory > usable:
                        break      # v holds more than 1F1B: none of them fits either
                    if v > 1:
                        c.memory += (in_flight_ratio(pp, m, v) - 1) * memory.term("activations").device
                    considered += 1
                    if least is None or c.memory < least.memory:
                        least = c
                        c.parts = {t.name: t.device for t in memory.terms}
                        c.parts["activations"] = c.memory - sum(v for k, v in c.parts.items() if k != "activations")
                    if c.memory > usable:
                        continue
                    c.terms = step_terms(job, gpu, c, setup, stage_layers)
                    c.efficiency = efficiency(job, gpu, c)
                    c.tokens_per_s = tokens / c.step_s
                    c.mfu = model_flops / (c.step_s * job.gpus * gpu.peak("fp8" if job.fp8 else job.precision))
                    fits.append(c)
    return Plan(job, gpu, rank(fits), considered, least)


def model_parallel_ranks(c: Candidate) -> int:
    return c.tp * c.pp * c.cp * c.virtual * c.ep


def rank(candidates: list[Candidate]) -> list[Candidate]:
    """By step time, in tie groups (module doc): each candidate's `tie` is its group's number."""
    def tie_order(group):
        return sorted(group, key=lambda c: (model_parallel_ranks(c), c.memory))

    out, group = [], []
    for c in sorted(candidates, key=lambda c: c.step_s):
        if group and c.step_s > group[0].step_s * (1 + RESOLUTION):
            out += tie_order(group)
            group = []
        c.tie = group[0].tie if group else (out[-1].tie + 1 if out else 0)
        group.append(c)
    return out + tie_order(group)


def why_faster(a: Candidate, b: Candidate) -> str:
    """Why a comes before b: a tie (and what broke it), or the term that differs most in a's favour."""
    names = {"micro_batch": "micro-batch", "virtual": "v", "expert_tp": "etp"}
    def shown(value):
        return ("on" if value else "off") if isinstance(value, bool) else value
    changed = ", ".join(f"{names.get(k, k)} {shown(getattr(a, k))} vs {shown(getattr(b, k))}" for k in
                        ("dp", "tp", "pp", "cp", "ep", "expert_tp", "sp", "zero", "recompute", "micro_batch",
                         "virtual") if getattr(a, k) != getattr(b, k)
                        and (k != "expert_tp" or max(a.ep, b.ep) > 1 and (a.expert_tp == 1) != (b.expert_tp == 1))) \
        or "same layout"
    if a.tie == b.tie:
        fewer = model_parallel_ranks(a) < model_parallel_ranks(b)
        return (f"a tie (within {RESOLUTION:.0%} of the fastest of its group): "
                + ("fewer model-parallel ranks" if fewer else "less memory") + f" ({changed})")
    gains = {t: b.terms.get(t, 0.0) - a.terms.get(t, 0.0) for t in TERMS}
    term = max(gains, key=gains.get)
    return f"{b.step_s - a.step_s:.3g} s faster: {LABELS[term]} {gains[term]:.3g} s less ({changed})"
