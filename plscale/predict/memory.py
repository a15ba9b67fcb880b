"""Memory per rank for training with ZeRO: model states (ZeRO paper) and activations.

Host-side and pure: `plscale estimate memory` prints it, and the ZeRO lab prints it beside
what each rank measures (`setup_from_ds_config` reads the run's DeepSpeed config into a
Setup, plscale.predict.setup: so the lab and the CLI ask the same question).

Model states (Rajbhandari et al., ZeRO, 2020). Ψ parameters on this model-parallel rank
(Ψ_total / (tp * pp); given a model shape, tensor_parallel.params_per_rank, as the norm weights
are replicated over the TP group, and with pp > 1 the largest stage's, tensor_parallel.stage_params:
the embedding's shard on the first stage, the final norm and the head's on the last, a tied head
kept there as a copy), N data-parallel ranks, p bytes per weight
(2 in bf16/fp16, 4 in fp32), K = 12 bytes of optimizer state per parameter (fp32 master 4 +
Adam m 4 + v 4):

    stage 0   pΨ + pΨ + KΨ              parameters, gradients, optimizer states, all replicated
    stage 1   pΨ + pΨ + KΨ/N            optimizer states sharded
    stage 2   pΨ + (p + K)Ψ/N           ... and gradients
    stage 3   (2p + K)Ψ/N               ... and parameters

The terms, one vocabulary everywhere (this model, the rank's tensor census, a run's
summary, `plscale estimate memory --json`): parameters, gradients, master, moments,
activations; `LABELS` says how each is shown.

Where DeepSpeed departs from the paper, the model follows DeepSpeed (each rule was measured
with the ZeRO lab's tensor census, fp32 and bf16 on 2 CPU ranks, and read in DeepSpeed
0.19's stage_1_and_2.py and stage3.py). Gradients are counted at their peak, while
micro-batches accumulate:

 1. fp32 at stage 0: the optimizer steps the weights themselves (K = 8). From stage 1 on
    DeepSpeed keeps its own fp32 master partition even of an fp32 model, so K stays 12.
 2. ZeRO-1 with one micro-batch per step (grad_accum 1) reduces and partitions the
    gradients inside the backward, bucket by bucket, as ZeRO-2 does: pΨ/N. The full pΨ of
    the paper's ZeRO-1 only lives while micro-batches accumulate (grad_accum > 1); DeepSpeed
    reduces at the accumulation boundary. A ZeRO-1 that reduces after the backward, from whole
    gradients (Setup.reduce_in_backward False: lab 11's, written by hand), holds pΨ always.
 3. Optimizer offload (ZeRO-Offload) moves the master copy and the moments to the host, and
    the gradients the host's Adam steps: an fp32 partition, 4Ψ/N whatever p is. Micro-batches
    accumulate somewhere else:
      stage 1  in the full gradients on the device (pΨ, with grad_accum > 1; rule 2);
      stage 2  in a second host partition of pΨ/N, only with grad_accum > 1 (a lone
               backward per step is copied straight into the fp32 partition);
      stage 3  in a second host partition of pΨ/N (ZeRO-3's flat gradient buffer), always.
 4. Parameter offload (stage 3) moves the parameter partition to the host.
 5. A partition of the gradients (stage 2, and stage 1 reducing in the backward; rule 2) holds
    whole tensors, not exactly pΨ/N: DeepSpeed cuts its flat buffer into N partitions of
    P = Ψ/N elements (padded to 2N) and rank r keeps the whole gradient of every tensor that
    starts in its partition or straddles its start, so a tensor that crosses a boundary is held
    by both ranks (plscale.predict.zero_partitions, with the source lines). Given the shape
    (tp = pp = 1: the layout of the whole model), the term is the largest rank's, and
    Term.by_rank has each rank's. Without a shape it stays pΨ/N; ZeRO-3 (stage3.py) partitions
    its gradients exactly. ZeRO-2 offload's accumulation on the host (rule 3) is the same whole
    tensors: one buffer per tensor of the partition (accumulated_grads_in_cpu).

 6. ZeRO-3 keeps every tensor of at most `stage3_param_persistence_threshold` elements
    (DeepSpeed's default 1e5; plscale's configs and Setup's default 1e4) whole on every rank,
    beside its partition: the norms, and a small model's projections (parameter_offload.py,
    mark_persistent_parameters: `ds_numel <= threshold`). The planner sets 0 (FSDP, Megatron).
    Given the shape (tp = pp = 1), the parameters term adds pΨ_persist, the sum of those
    tensors' elements; with parameter offload they stay on the device.

Gradients by framework (`optimizer`), bf16 weights at ZeRO stage 0 or 1 (1: the optimizer states
sharded, Megatron's distributed optimizer; fp16 has other rows there, not modelled):
    deepspeed        the rules above: pΨ of 16-bit gradients
    megatron         Megatron-LM keeps its gradients in an fp32 buffer for the data-parallel reduction
                     (accumulate_allreduce_grads_in_fp32, on with bf16): 4Ψ, whole on every rank; its
                     docs (api-guide/dist_optimizer.md) count 6 + 12/d bytes a parameter, 18 without d
    bf16-optimizer   DeepSpeed's BF16_Optimizer (Megatron-DeepSpeed, BLOOM): the 16-bit gradients and a
                     flat fp32 accumulation buffer of every parameter (bf16_optimizer.py,
                     fp32_groups_gradients_flat), 2Ψ + 4Ψ whole; its fp32 master and moments sharded
                     as ZeRO-1's

`accounting="deepspeed"` reproduces DeepSpeed's estimate_zero2/3_model_states_mem_needs
instead (device memory, mixed precision, stages 2 and 3, no accumulation): an fp32 gradient
partition for the step besides the 16-bit one (stage 2: 2Ψ + 18Ψ/N), and at stage 3 the
largest layer's parameters and gradients gathered in full (2 + 2 bytes each) plus 18Ψ/N.

Activations (plscale.predict.activations, with their formulas): what each layer and the head
keep for backward, under recomputation (`recompute`: none, selective, full or deepspeed, of the
first `recompute_layers` layers of the model), tensor and sequence parallelism. The `activations`
term is what the forward keeps plus one rerun, the most recomputation adds at once in the
backward; the step's peak holds more (the logits' gradient in the head's backward, the
parameters' gradients). Pipeline parallelism (1F1B) holds the whole model's worth on its first
stage.

`activations="megatron"` counts them as Megatron-LM keeps them instead (plscale.predict.megatron,
Korthikanti et al. 2022's table 2: 16-bit norms, sequence parallelism over them too, the first
stage's pp micro-batches, interleaving's extra): for the layouts published runs use.

Context parallelism (cp ranks share each sequence, s/cp tokens each) cuts every activation
term, layers and head, to s/cp tokens: ring attention and Ulysses each keep only their own tokens'
q, k, v, output and log-sum-exp (the k, v blocks that pass through a ring rank, and Ulysses'
whole-sequence heads, are transient). The model states do not change: the cp ranks of a
group hold the same weights and see different tokens of the same sequences, so their
gradients are summed like data parallelism's, and ZeRO shards over dp x cp ranks
(DeepSpeed's sequence-data-parallel group, Megatron's dp-cp group). `dp` here is that N,
the ranks ZeRO shards over, whatever cp is: give dp x cp.

Expert parallelism (a mixture of experts, ep ranks; Megatron-Core's, DeepSpeed-MoE's): each rank holds
E/ep of every layer's experts, split over etp ranks (tp, as the MLP is: Megatron-Core's default; or 1,
whole: its parallel folding), and everything else as a dense model (`expert_split`). Megatron-Core lays
the experts out on their own grid over a stage's tp x N ranks, etp x ep x edp: the edp ranks holding the
same experts sum their gradients, so ZeRO shards the experts' states over edp = tp N / (etp ep) ranks and
the rest over N: each term is the dense part's over N plus the experts' over edp (a Mixtral-8x7B under
Megatron's distributed optimizer on N = 64, ep 8, tp 1: 6 + 12/64 bytes a dense parameter, 6 + 12/8 an
expert's).
Rules 5 and 6 (whole tensors at partition edges, ZeRO-3's persistent tensors) are not applied to a
mixture of experts: how its experts are laid out in tensors differs between transformers' versions
(one tensor an expert's matrix, or all experts' fused), so its partitions are the paper's pΨ/N.
"""

from dataclasses import asdict, dataclass, field, replace
from functools import cache

from plscale.dsconfig.valid import zero_settings
from plscale.predict import megatron
from plscale.predict.activations import (
    activation_bytes,
    activation_formula,
    rebuilt_bytes,
)
from plscale.predict.errors import PredictionError
from plscale.predict.presets import ModelConfig, largest_layer_params, mlp_params, param_count
from plscale.predict.setup import Setup
from plscale.predict.tensor_parallel import params_per_rank, stage_params
from plscale.predict.units import BYTES, gib
from plscale.predict.zero_partitions import held_elements, tensor_sizes

__all__ = ["BYTES", "LABELS", "MODEL_STATES", "Estimate", "Setup", "Term", "estimate", "gib", "rank_params",
           "setup_from_ds_config"]

MODEL_STATES = ("parameters", "gradients", "master", "moments")
LABELS = {"parameters": "parameters", "gradients": "gradients", "master": "optimizer: fp32 master",
          "moments": "optimizer: Adam moments", "activations": "activations", "model_states": "model states",
          # measured only (the rank's tensor census, the CUDA allocator), never predicted:
          "buffers": "buffers (buckets, staging)", "other": "other (data, tables, ...)",
          "allocated": "allocated (CUDA)"}


def setup_from_ds_config(ds_config: dict, world_size: int, model: ModelConfig, seq: int) -> Setup:
    """The Setup of a run: stage, precision, offload, micro batch and accumulation as its
    DeepSpeed config says, data parallel over all `world_size` ranks, this model and seq."""
    micro = ds_config.get("train_micro_batch_size_per_gpu")
    accum = ds_config.get("gradient_accumulation_steps")
    total = ds_config.get("train_batch_size")
    if accum is None:  # DeepSpeed derives what is missing of the batch triple
        accum = total // (micro * world_size) if total and micro else 1
    if micro is None:
        micro = total // (accum * world_size)
    zero = ds_config.get("zero_optimization") or {}
    persist = {"persistence_threshold": int(zero.get("stage3_param_persistence_threshold", 100_000))} \
        if zero.get("stage") == 3 else {}   # rule 6, ZeRO-3's alone; 1e5 is DeepSpeed's default
    return Setup(params=param_count(model), dp=world_size, model=model, seq=seq, micro_batch=micro,
                 grad_accum=accum, largest_layer=largest_layer_params(model), **persist, **zero_settings(ds_config))


@dataclass
class Term:
    name: str                         # one of MODEL_STATES or "activations"; LABELS[name] to show it
    device: float                     # bytes per rank on the accelerator (or the CPU running it)
    host: float = 0.0                 # bytes per rank offloaded to host memory
    formula: str = ""
    by_rank: tuple = ()               # bytes on each data-parallel rank where they differ (rule 5); the
                                      # term's device or host bytes are the largest of them

    @property
    def total(self) -> float:
        return self.device + self.host

    @property
    def label(self) -> str:
        return LABELS[self.name]


@dataclass
class Estimate:
    setup: Setup
    terms: list = field(default_factory=list)

    def term(self, name: str) -> Term:
        return next(t for t in self.terms if t.name == name)

    def total(self, where: str = "device", names=None) -> float:
        return sum(getattr(t, where) for t in self.terms if names is None or t.name in names)

    @property
    def model_states(self) -> float:
        return sum(t.total for t in self.terms if t.name in MODEL_STATES)

    def to_dict(self) -> dict:
        """Plain data (`plscale estimate memory --json`): the setup, each term's bytes, totals."""
        return {"setup": asdict(self.setup),
                "terms": {t.name: {"label": t.label, "device": t.device, "host": t.host, "total": t.total,
                                   "formula": t.formula, **({"by_rank": list(t.by_rank)} if t.by_rank else {})}
                          for t in self.terms},
                "totals": {"device": self.total("device"), "host": self.total("host"),
                           "model_states": self.model_states}}


def rank_params(s: Setup) -> float:
    """Ψ, the parameters one model-parallel rank holds: Ψ_total / (tp * pp), or with a shape
    under tp, tensor_parallel.params_per_rank (exact: the norms are replicated). With a shape
    and pp > 1, the largest stage's (tensor_parallel.stage_params): its L/pp layers plus the
    embedding's shard (first stage) or the final norm and the head's shard (last; a tied head
    is a copy there), which Ψ_total / pp would spread over every stage."""
    if s.model is not None and s.pp > 1:
        return max(stage_params(s.model, s.tp, s.pp, i).total for i in range(s.pp))
    if s.model is not None and s.tp > 1:
        return params_per_rank(s.model, s.tp).total / s.pp
    return s.params / (s.tp * s.pp)


def stage_experts(s: Setup) -> float:
    """Every expert parameter of the heaviest pipeline stage's layers (0 for a dense model)."""
    if s.model is None or not s.model.moe:
        return 0.0
    return s.model.layers // s.pp * s.model.experts * mlp_params(s.model)


def expert_split(s: Setup) -> tuple[float, float, int]:
    """(dense, experts, edp): the parameters a rank holds outside the experts (rank_params, experts split over
    tp as the MLP, taken out), its own experts' (an etp x ep-th of the stage's), and the ranks holding the same
    experts, whose gradients are summed and over which ZeRO shards their states: tp x N / (etp x ep)."""
    experts = stage_experts(s)
    return rank_params(s) - experts / s.tp, experts / (s.expert_tp * s.ep), s.tp * s.dp // (s.expert_tp * s.ep)


def estimate(s: Setup) -> Estimate:
    s.validate()
    psi = rank_params(s)
    if s.ep > 1 or s.expert_tp != s.tp:
        terms = _expert_terms(s)
    else:
        terms = (_deepspeed_terms if s.accounting == "deepspeed" else _paper_terms)(s, psi)
    if s.model is not None:
        if s.activations == "megatron":   # Korthikanti et al. 2022 (megatron.py): Megatron-LM's own count
            kept = megatron.first_stage_bytes(s.model, s.tokens, s.micro_batch, s.tp, s.pp, s.sp, s.recompute,
                                              s.virtual, s.grad_accum if s.pp > 1 else None)
            terms.append(Term("activations", kept, 0.0, "Megatron-LM's: Korthikanti et al. 2022, table 2"))
        else:
            terms.append(Term("activations", activation_bytes(s) + rebuilt_bytes(s), 0.0, activation_formula(s)))
    return Estimate(s, terms)


def _paper_terms(s: Setup, psi: float) -> list[Term]:
    p, n = BYTES[s.precision], s.dp
    master = 0 if (s.precision == "fp32" and s.stage == 0) else 4                      # rule 1
    shard = lambda stage: (n, "/N") if s.stage >= stage else (1, "")
    (np_, fp), (no, fo) = shard(3), shard(1)
    terms = [_parameters(s, psi, p, np_, fp),
             _gradients(s, psi),
             Term("master", master * psi / no, 0, f"{master}Ψ{fo}" if master else "0 (steps the weights)"),
             Term("moments", 8 * psi / no, 0, f"8Ψ{fo}")]
    if s.offload_optimizer:                                                            # rule 3
        for t in terms[2:]:
            t.device, t.host, t.formula = 0.0, t.device, t.formula + " on host"
    if s.offload_param:                                                                # rule 4
        kept = _persistent(s)
        terms[0].device, terms[0].host = p * kept, terms[0].device - p * kept
        terms[0].formula = f"{p}Ψ/N on host" + (f" + {p}Ψ_persist ({kept:,} elements)" if kept else "")
    return terms


def _expert_terms(s: Setup) -> list[Term]:
    """Each model-state term as the dense parameters' over N plus the rank's experts' over edp (expert_split)."""
    if s.accounting == "deepspeed":
        raise PredictionError("accounting", s.accounting, ": DeepSpeed's estimators know no experts: use {accounting} "
                              "paper with {ep}.", show="deepspeed")
    dense, experts, edp = expert_split(s)
    ours = _paper_terms(s, dense)
    theirs = _paper_terms(replace(s, dp=edp, persistence_threshold=0), experts)   # the norms are dense
    def named(formula, mark, n):
        return formula.replace("Ψ", f"Ψ{mark}").replace("/N", f"/{n}")
    terms = [Term(d.name, d.device + e.device, d.host + e.host,
                  f"{named(d.formula, 'd', 'N')} + {named(e.formula.split(' (')[0], 'e', str(edp))}")
             for d, e in zip(ours, theirs)]
    terms[0].formula += f" (Ψe: the rank's 1/{s.ep * s.expert_tp} of the experts, held by {edp} rank" \
                        f"{'s' if edp > 1 else ''})"
    return terms


def _parameters(s: Setup, psi: float, p: int, n: int, shown: str) -> Term:
    """The weights: pΨ, or pΨ/N at stage 3 plus the tensors it keeps whole (rule 6)."""
    kept = _persistent(s)
    if kept:
        return Term("parameters", p * psi / n + p * kept, 0, f"{p}Ψ/N + {p}Ψ_persist ({kept:,} elements)")
    return Term("parameters", p * psi / n, 0, f"{p}Ψ{shown}")


def _persistent(s: Setup) -> int:
    """Rule 6: elements of the tensors ZeRO-3 keeps whole on every rank; 0 without the layout."""
    if s.stage != 3 or s.model is None or s.model.moe or s.tp != 1 or s.pp != 1 or s.dp < 2:
        return 0
    sizes = tensor_sizes(s.model)
    return sum(n for n in sizes if n <= s.persistence_threshold) if sum(sizes) == s.params else 0


def _gradients(s: Setup, psi: float) -> Term:
    """Gradients at their peak, while micro-batches accumulate (rules 2, 3 and 5; `optimizer`)."""
    p, n, accumulating = BYTES[s.precision], s.dp, s.grad_accum > 1
    if s.optimizer == "megatron":
        return Term("gradients", 4 * psi, 0, "4Ψ fp32 (Megatron's grad buffer)")
    if s.optimizer == "bf16-optimizer":
        return Term("gradients", (p + 4) * psi, 0, f"{p}Ψ + 4Ψ fp32 (BF16_Optimizer's accumulation buffer)")
    full = s.stage == 0 or (s.stage == 1 and (accumulating or not s.reduce_in_backward))
    held = _whole_tensors(s, psi)
    edges = " (whole tensors at partition edges)" if held else ""
    if not s.offload_optimizer:
        if full:
            return Term("gradients", p * psi, 0, f"{p}Ψ")
        note = " (one micro-batch per step: reduced in backward)" if s.stage == 1 else ""
        if held:
            return Term("gradients", max(held), 0, f"{p}Ψ/N{edges}{note}", tuple(held))
        return Term("gradients", p * psi / n, 0, f"{p}Ψ/N{note}")
    second = s.stage == 3 or (s.stage == 2 and accumulating)
    host = 4 * psi / n + (p * psi / n if second else 0)
    formula = (f"{p}Ψ accumulating; " if full else "") + "4Ψ/N fp32" \
        + (f" + {p}Ψ/N accumulating{edges if s.stage == 2 else ''}," if second else "") + " on host"
    if s.stage == 2 and second and held:  # accumulated_grads_in_cpu: one whole buffer per tensor of the partition
        by_rank = tuple(4 * psi / n + h for h in held)
        return Term("gradients", 0.0, max(by_rank), formula, by_rank)
    return Term("gradients", p * psi if full else 0.0, host, formula)


def _whole_tensors(s: Setup, psi: float) -> list | None:
    """Rule 5: the bytes of the whole tensors each rank's gradient partition holds at ZeRO-1/2
    (plscale.predict.zero_partitions), or None without the layout (no shape, tp or pp > 1, N = 1)."""
    if s.stage not in (1, 2) or s.model is None or s.model.moe or s.tp != 1 or s.pp != 1 or s.dp < 2:
        return None
    sizes = tensor_sizes(s.model)
    return [BYTES[s.precision] * h for h in _held(tuple(sizes), s.dp)] if sum(sizes) == psi else None


@cache
def _held(sizes: tuple, n: int) -> tuple:
    """held_elements, once for each model and N (the planner asks for every candidate of a layout)."""
    return tuple(held_elements(list(sizes), n))


def _deepspeed_terms(s: Setup, psi: float) -> list[Term]:
    """DeepSpeed's estimate_zero2/3_model_states_mem_needs, term by term (device memory)."""
    n, big = s.dp, s.largest_layer
    if s.stage == 2:
        grads = Term("gradients", 6 * psi / n, 0, "2Ψ/N + 4Ψ/N fp32 partition")
        states = [Term("master", 4 * psi / n, 0, "4Ψ/N"), Term("moments", 8 * psi / n, 0, "8Ψ/N")]
        if s.offload_optimizer:
            grads = Term("gradients", 0, 4 * psi / n, "4Ψ/N fp32 on host")
            states = [Term(t.name, 0, t.device, t.formula + " on host") for t in states]
        return [Term("parameters", 2 * psi, 0, "2Ψ"), grads, *states]
    params = Term("parameters", 2 * big + 2 * psi / n, 0, "2 x largest layer + 2Ψ/N")
    grads = Term("gradients", 2 * big + 4 * psi / n, 0, "2 x largest layer + 4Ψ/N fp32 partition")
    states = [Term("master", 4 * psi / n, 0, "4Ψ/N"), Term("moments", 8 * psi / n, 0, "8Ψ/N")]
    if s.offload_optimizer:
        grads = Term("gradients", 2 * big, 4 * psi / n, "2 x largest layer; 4Ψ/N on host")
        states = [Term(t.name, 0, t.device, t.formula + " on host") for t in states]
    if s.offload_param:
        params = Term("parameters", 2 * big, 2 * psi / n, "2 x largest layer; 2Ψ/N on host")
    return [params, grads, *states]

