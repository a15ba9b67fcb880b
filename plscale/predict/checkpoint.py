"""Checkpointing: how often to save, what a crash costs, and how many bytes a save writes.

Host-side and pure: `plscale estimate checkpoint` prints it, and a checkpointing lab prints
it beside what it measures.

How often (first-order model). Every τ seconds of training the job stalls δ seconds to write
a checkpoint; failures arrive at random, one per M seconds on average (the MTBF of the whole
job, not of one node); after a failure the job spends R seconds restarting and redoes the
work since the last checkpoint, on average half a period. The fraction of time lost:

    waste(τ) = δ/τ  +  (τ + δ)/(2M)  +  R/M
               checkpoint   rework per      restart per
               overhead     failure         failure

valid while τ + δ << M (at most one failure per period). d waste/dτ = 0 gives Young's interval
(Young, 1974), and Daly's higher-order correction (Daly, 2006) for a δ that is not small:

    τ_Young = sqrt(2δM)
    τ_Daly  = sqrt(2δM)·[1 + (1/3)·sqrt(δ/(2M)) + (1/9)·(δ/(2M))] − δ    for δ < 2M, else M

At τ_Young the first two terms are equal, and waste ≈ sqrt(2δ/M): a 30 s stall against a
24 h MTBF saves every 38 min (2277 s) and loses about 2.7 % of the run.

What a crash costs, in steps. Saving every k steps, with the newest checkpoint durable only
l steps after it was taken (an asynchronous save still writing), a crash at a uniformly random
moment falls a uniform 0..k steps past the newest durable checkpoint's step + l:

    expected steps lost = k/2 + l        worst = k + l

What `engine.save_checkpoint` writes (DeepSpeed 0.19, Adam/AdamW; measured on 2-4 CPU ranks
with plscale's Llama, tiny/small/deep presets, fp32 and bf16, stages 0-3). Ψ parameters,
N ranks, p bytes per weight (4 fp32, 2 bf16/fp16), K = 12 bytes of fp32 optimizer state
(master copy 4 + Adam m 4 + v 4; an fp32 model at stage 0 steps the weights itself: K = 8):

    stage 0     rank 0:    mp_rank_00_model_states.pt        (p + K)Ψ     weights + optimizer
    stage 1, 2  rank 0:    mp_rank_00_model_states.pt        pΨ           the weights
                each rank: zero_pp_rank_r_..._optim_states.pt  12Ψ'/N     its partition
    stage 3     each rank: zero_pp_rank_r_..._model_states.pt  0          metadata only
                each rank: zero_pp_rank_r_..._optim_states.pt  12Ψ''/N    its partition

Ψ' = Ψ rounded up to a multiple of 2N (ZeRO-1/2 pad the flat buffer); Ψ''/N = Σ ceil(Ψ_i/N)
over the parameter tensors (ZeRO-3 pads each one). bf16 prefixes the optimizer files
"bf16_". Stage 3 writes no weights: they live in the fp32 partitions (DeepSpeed's
zero_to_fp32.py rebuilds them; `plscale ckpt convert --to fp32` calls it). Each file adds a few KiB of
metadata (torch.save's zip records, pickled names, the DeepSpeed config), fitted per file
class to n, the model's parameter tensors (below): it matters only for stage 3's metadata
file. fp16 is taken to follow bf16 without the prefix (not measured: CPUs lack fp16).
"""

import math
from dataclasses import dataclass

from plscale.predict import tensors
from plscale.predict.errors import PredictionError
from plscale.predict.presets import ModelConfig, param_count
from plscale.predict.units import BYTES

# Metadata bytes per file, a + b·n for n parameter tensors, fitted to the tiny (n = 20) and
# small (n = 38) presets on 2 CPU ranks (the larger file where ranks differ by a few hundred
# bytes of pickled names); checked on deep (n = 74, within 1 %) and on 3 and 4 ranks.
# Stage 0 pays per zip record: 4 per tensor in fp32 (weight, m, v, step), 5 in bf16 (+ master).
_STAGE0_META = (1000, 318)          # a, b per record
_WEIGHTS_META = (1745, 260)         # stages 1-2: the flat weight buffer is one record
_STAGE3_META = (1892, 472)          # stage 3's model-states file: names and empty tensors
_PARTITION_META = {1: (3667, 64), 2: (3667, 64), 3: (4100, 0)}


def job_mtbf_hours(gpus: int, interruptions: int, days: float, observed_gpus: int) -> float:
    """Hours between failures of a job on `gpus` GPUs, at the failure rate per GPU of an observed run
    (`interruptions` in `days` on `observed_gpus`), failures growing in proportion to the GPUs."""
    return days * 24 * observed_gpus / interruptions / gpus


def young_interval(stall_s: float, mtbf_s: float) -> float:
    """Seconds of training between checkpoints that minimise the first-order waste: sqrt(2δM)."""
    _check_stall_mtbf(stall_s, mtbf_s)
    return math.sqrt(2 * stall_s * mtbf_s)


def daly_interval(stall_s: float, mtbf_s: float) -> float:
    """Daly's higher-order optimum (2006); about 2δ/3 shorter than Young's while δ << M."""
    _check_stall_mtbf(stall_s, mtbf_s)
    if stall_s >= 2 * mtbf_s:
        return mtbf_s
    x = stall_s / (2 * mtbf_s)
    return math.sqrt(2 * stall_s * mtbf_s) * (1 + math.sqrt(x) / 3 + x / 9) - stall_s


def waste_fraction(interval_s: float, stall_s: float, mtbf_s: float, restart_s: float = 0.0) -> float:
    """Expected fraction of wall time lost, δ/τ + (τ + δ)/(2M) + R/M (first order: τ + δ << M)."""
    _check_stall_mtbf(stall_s, mtbf_s)
    if interval_s <= 0:
        raise PredictionError("interval_s", interval_s, f"Checkpoint interval {interval_s:g} s: it must be positive.", lead=False)
    if restart_s < 0:
        raise PredictionError("restart_s", restart_s, f"Restart time {restart_s:g} s: it cannot be negative.", lead=False)
    return stall_s / interval_s + (interval_s + stall_s) / (2 * mtbf_s) + restart_s / mtbf_s


def expected_steps_lost(interval_steps: float, lag_steps: float = 0) -> float:
    """Steps redone after a crash at a random moment: k/2 + l."""
    _check_steps(interval_steps, lag_steps)
    return interval_steps / 2 + lag_steps


def worst_steps_lost(interval_steps: float, lag_steps: float = 0) -> float:
    """Steps redone after a crash just before a checkpoint becomes durable: k + l."""
    _check_steps(interval_steps, lag_steps)
    return interval_steps + lag_steps


@dataclass(frozen=True)
class CheckpointFile:
    name: str          # DeepSpeed's file name, r for the rank
    copies: int        # how many such files one save writes
    nbytes: int        # bytes of each
    formula: str
    every_rank: bool   # one per rank (else rank 0 writes it alone)


@dataclass(frozen=True)
class CheckpointBytes:
    files: tuple
    ranks: int

    @property
    def total(self) -> int:
        return sum(f.copies * f.nbytes for f in self.files)

    def by_name(self) -> dict[str, int]:
        """Each file DeepSpeed writes, under its own name (r spelled out): what a lab lists."""
        return {(f.name.replace("_r_", f"_{r}_") if f.every_rank else f.name): f.nbytes
                for f in self.files for r in range(f.copies)}

    @property
    def per_rank(self) -> int:
        """Bytes rank 0 writes, the most any rank does: the stall is set by the busiest rank."""
        return sum(f.nbytes for f in self.files)


def tensor_sizes(c: ModelConfig) -> list[int]:
    """Elements of each parameter tensor (one entry per tensor; a tied head is none)."""
    return tensors.sizes(c)


def checkpoint_bytes(params: int, stage: int = 0, ranks: int = 1, precision: str = "bf16",
                     model: ModelConfig | None = None) -> CheckpointBytes:
    """The files one `engine.save_checkpoint` writes (see the module doc). `model`, when given,
    supplies the tensor count for the metadata and the tensor sizes for ZeRO-3's padding;
    without it the metadata is its constant part and the padding is ignored."""
    if precision not in BYTES:
        raise PredictionError("precision", precision, f"Precision {precision!r}: use fp32, bf16 or fp16.", lead=False)
    if stage not in (0, 1, 2, 3):
        raise PredictionError("stage", stage, f"ZeRO stage {stage} does not exist: use 0, 1, 2 or 3.", lead=False)
    if ranks < 1 or params < 1:
        raise PredictionError("ranks" if ranks < 1 else "params", ranks if ranks < 1 else params,
                              f"A checkpoint needs at least one rank and one parameter (got {ranks}, {params}).",
                              lead=False)
    if model is not None and param_count(model) != params:
        raise PredictionError("params", params, f"{params} parameters, but the model shape has {param_count(model)}.", lead=False)
    p, n = BYTES[precision], ranks
    sizes = tensor_sizes(model) if model is not None else []
    tensors = len(sizes)
    meta = lambda ab, count=tensors: ab[0] + ab[1] * count  # noqa: E731
    if stage == 0:
        k = 8 if precision == "fp32" else 12
        records = tensors * (4 if precision == "fp32" else 5)
        return CheckpointBytes((CheckpointFile("mp_rank_00_model_states.pt", 1,
                                               (p + k) * params + meta(_STAGE0_META, records),
                                               f"({p}+{k})Ψ weights + optimizer", False),), n)
    prefix = "bf16_" if precision == "bf16" else ""
    if stage < 3:
        partition = 2 * math.ceil(params / (2 * n))
        files = [CheckpointFile("mp_rank_00_model_states.pt", 1, p * params + meta(_WEIGHTS_META),
                                f"{p}Ψ weights", False)]
        shard = "12Ψ'/N, Ψ' = Ψ padded to 2N"
    else:
        partition = sum(math.ceil(s / n) for s in sizes) if sizes else math.ceil(params / n)
        files = [CheckpointFile("zero_pp_rank_r_mp_rank_00_model_states.pt", n, meta(_STAGE3_META),
                                "metadata only", True)]
        shard = "12·Σ ceil(Ψ_i/N)"
    files.append(CheckpointFile(f"{prefix}zero_pp_rank_r_mp_rank_00_optim_states.pt", n,
                                12 * partition + meta(_PARTITION_META[stage]), shard, True))
    return CheckpointBytes(tuple(files), n)


def _check_stall_mtbf(stall_s: float, mtbf_s: float) -> None:
    if mtbf_s <= 0:
        raise PredictionError("mtbf_s", mtbf_s, f"MTBF {mtbf_s:g} s: the mean time between failures must be positive.",
                              lead=False)
    if stall_s <= 0:
        raise PredictionError("stall_s", stall_s, f"Checkpoint stall {stall_s:g} s: a save takes some time; give a "
                                                   f"positive stall.", lead=False)


def _check_steps(interval_steps: float, lag_steps: float) -> None:
    if interval_steps <= 0:
        raise PredictionError("interval_steps", interval_steps, f"Checkpoint interval {interval_steps:g} steps: it must "
                                                                 f"be positive.", lead=False)
    if lag_steps < 0:
        raise PredictionError("lag_steps", lag_steps, f"Lag {lag_steps:g} steps: a checkpoint cannot be durable before "
                                                       f"it is taken.", lead=False)


def dcp_bytes(c: ModelConfig) -> int:
    """What torch.distributed.checkpoint writes for an fp32 FSDP2 model and torch's AdamW, all
    ranks together, tensors only: every tensor once, each rank its own rows (no padding: a DTensor's
    local shard is its rows only), the fp32 weights and Adam's two moments, 12Ψ, and AdamW's step
    count, one fp32 scalar per tensor (replicated: rank 0 writes it). The model's state dict names a
    tied head as well as the embedding, and DCP saves each name: the tied weight twice (+4 vocab h).
    Not counted: the .metadata file (global shapes, every chunk's file and offset), each item's own
    serialisation record in the .distcp files, each rank's random streams (0.6% more for `small`)."""
    sizes = tensor_sizes(c)
    return 12 * sum(sizes) + 4 * len(sizes) + (4 * c.vocab * c.hidden if c.tie_embeddings else 0)
