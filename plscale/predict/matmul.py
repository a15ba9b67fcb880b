"""How fast a GPU runs one transformer layer at the shapes a layout gives it: the planner's compute
efficiency, from the matmuls' shapes instead of one figure for every layout.

Host-side and pure. One layer's forward and backward on one GPU, for a micro-batch of b sequences
of s tokens (s / cp on a context-parallel rank) on a tensor-parallel rank of t:

  matmuls    each GEMM of the layer on its per-GPU shape, an (m x k) @ (k x n) of 2mnk FLOPs
             (r = b s / cp rows; a Llama: q, k, v r x h -> (h + 2 d_kv)/t, o r x h/t -> h, gate and
             up r x h -> 2f/t, down r x f/t -> h; GPT-2's block: one up r x h -> f/t), and backward the
             two GEMMs of each (the input's gradient: m x n by n x k; the weight's: k x m by m x n),
             each at

                 peak x mamf x TYPICAL x waves(m, n) x min(1, intensity x HBM / (peak x mamf))

             mamf: the fraction of the dense peak the best large GEMM reaches (cluster.GPU.mamf,
             ml-engineering's MAMF table, its best shape found by search); TYPICAL 0.85: ordinary
             shapes reach 80-90 % of it (ml-engineering: a sweep over m at n = k = 4096 "should give
             around 80-90% of the maximum achievable result"; that sweep's own waves are counted twice
             here, a few percent on large GEMMs). waves: cuBLAS splits the output into tiles of 128 x 256
             and runs them on the S streaming multiprocessors a wave at a time; the last wave's idle
             SMs and a tile's unused edge are lost, useful m n / (128 x 256 x S x ceil(tiles / S))
             (NVIDIA's "Matrix Multiplication Background" guide: tile and wave quantization).
             The roofline (roofline.py) bounds a thin GEMM by its bytes.
  attention  the core, q k^T and p v over the rank's heads. Flash attention (ModelConfig.attention
             "fused", the default) computes the causal half of those FLOPs at the GPU's flash rate
             (cluster.GPU.flash: FlashAttention-2 and -3's published fractions of the peak), its
             backward 2.5 times its forward (five GEMMs to two, as those papers count), and keeps
             no scores; "math" (Megatron-LM until 2022) computes every score as a batch of GEMMs
             (s/cp x d by d x s, then s/cp x s by s x d) at the GEMM rate above, and writes them.
  elementwise  norms, activations, residuals, dropout, the softmax: memory-bound. Their bytes are
             the layer's activations as Megatron-LM counts them (megatron.layer_bytes, 16-bit; the
             scores only under "math"), A: forward writes them and reads them back (2A), backward
             reads them and the incoming gradient and writes the outgoing one (3A), at the HBM
             bandwidth.

A mixture of experts (ModelConfig.experts, ep expert-parallel ranks, the experts split over etp: tp or 1):
the router's r x h -> E GEMM, and the E/ep experts a rank holds each run gate-and-up and down, f/etp wide,
on their share of the tokens, (r/t) etp k ep / E rows (an etp group's k routes a token from the ep ranks,
spread evenly: dropless routing without imbalance), as separate GEMMs: few rows a GEMM pay their waves,
so more experts a rank run slower.

The layer's efficiency is its model FLOPs (forward + backward, causal-free, as presets.flops_per_token
counts them) over peak x its seconds; step_time applies it to the step's FLOPs. Checked against
Korthikanti et al. 2022, table 4 (one layer of the 22B model on A100s, tp 8: 7.7 ms forward, 11.9
ms backward, tensor-parallel collectives included), in tests/test_matmul.py.

fp8 (`fp8`): the GEMMs run on the GPU's fp8 tensor cores (its dense fp8 peak x mamf_fp8, one byte an
input for the roofline), as Transformer Engine and torchao's float8 training do; the attention core,
the elementwise work, the weights and the activations stay in the training precision.

Not modelled: kernels fused beyond one op (Transformer Engine's fused LayerNorm-GEMM), a GEMM's
lower rate on dimensions that are not multiples of 64, caches, launch gaps, the SMs a concurrent
collective takes.
"""

from dataclasses import dataclass, replace
from functools import cache
from math import ceil

from plscale.predict.cluster import GPU
from plscale.predict.megatron import layer_bytes
from plscale.predict.presets import ModelConfig
from plscale.predict.tensor_parallel import ELEMENT_BYTES

TILE = (128, 256)     # cuBLAS's usual output tile for 16-bit GEMMs on A100 and H100 (module doc)
TYPICAL = 0.85        # ordinary shapes' share of the best GEMM's rate (module doc)


def wave_efficiency(m: int, n: int, sms: int, batch: int = 1) -> float:
    """Useful work over what the waves of 128 x 256 tiles occupy (module doc).

    >>> round(wave_efficiency(128, 256, 132), 4)    # one tile: one SM busy, 131 idle
    0.0076
    >>> wave_efficiency(128 * 12, 256 * 11, 132)     # 132 tiles: one full wave
    1.0
    """
    tiles = ceil(m / TILE[0]) * ceil(n / TILE[1]) * batch
    return m * n * batch / (TILE[0] * TILE[1] * sms * ceil(tiles / sms))


def gemm_seconds(gpu: GPU, m: int, n: int, k: int, precision: str = "bf16", batch: int = 1) -> float:
    """Seconds of `batch` (m x k) @ (k x n) GEMMs on one GPU in `precision` (fp8: e4m3 inputs; module doc)."""
    return _gemm(_figures(gpu, "bf16" if precision == "fp8" else precision, precision == "fp8"), m, n, k, batch)


def _gemm(gpu: "_Figures", m: int, n: int, k: int, batch: int = 1) -> float:
    flops = 2 * m * n * k * batch
    best = gpu.gemm_peak * gpu.gemm_fraction * TYPICAL
    intensity = 2 * m * n * k / (gpu.gemm_bytes * (m * k + k * n + m * n))
    roof = min(1.0, intensity * gpu.hbm_gbs * 1e9 / best)
    return flops / (best * wave_efficiency(m, n, gpu.sms, batch) * roof)


def _forward_and_backward(gpu: "_Figures", m: int, n: int, k: int, batch: int = 1) -> tuple[float, float]:
    """A GEMM's forward seconds, and its backward's: the input's gradient and the weight's."""
    return _gemm(gpu, m, n, k, batch), _gemm(gpu, m, k, n, batch) + _gemm(gpu, k, n, m, batch)


@dataclass(frozen=True)
class LayerTime:
    """Seconds of one layer a micro-batch on one GPU, by part (module doc)."""
    matmul_forward: float
    matmul_backward: float
    attention_forward: float
    attention_backward: float
    elementwise_forward: float
    elementwise_backward: float
    model_flops: float          # forward + backward, causal-free (presets.flops_per_token's count)

    @property
    def forward(self) -> float:
        return self.matmul_forward + self.attention_forward + self.elementwise_forward

    @property
    def backward(self) -> float:
        return self.matmul_backward + self.attention_backward + self.elementwise_backward

    @property
    def total(self) -> float:
        return self.forward + self.backward


def layer_time(gpu: GPU, model: ModelConfig, seq: int, micro_batch: int, tp: int = 1, cp: int = 1,
               sp: bool = False, precision: str = "bf16", fp8: bool = False, ep: int = 1, etp: int = 0) -> LayerTime:
    """One decoder layer's forward and backward on one GPU (module doc); fp8: its GEMMs in fp8."""
    return _layer_time(_figures(gpu, precision, fp8), model, seq, micro_batch, tp, cp, sp, ep, etp or tp)


@dataclass(frozen=True)
class _Figures:
    """What the model reads of a GPU, hashable (GPU holds dicts) for the cache."""
    name: str
    peak: float              # the training precision's dense peak (flash attention's runs at its share)
    gemm_peak: float         # the GEMMs' precision's: fp8's with fp8 compute
    gemm_fraction: float     # the best GEMM's share of gemm_peak (mamf, mamf_fp8)
    gemm_bytes: int          # bytes of a GEMM's input element, for its roofline
    sms: int
    hbm_gbs: float
    flash: float
    element_bytes: int       # activations' (the elementwise work's)
    mamf: float              # the best GEMM's share of `peak`: the attention core's, always in that precision


def _figures(gpu: GPU, precision: str, fp8: bool) -> _Figures:
    gemm = "fp8" if fp8 else precision
    return _Figures(gpu.name, gpu.peak(precision), gpu.peak(gemm), gpu.best_fraction(gemm), 1 if fp8 else
                    ELEMENT_BYTES[precision], gpu.sms, gpu.hbm_gbs, gpu.flash, ELEMENT_BYTES[precision],
                    gpu.best_fraction(precision))


@cache
def _layer_time(gpu: _Figures, model: ModelConfig, seq: int, micro_batch: int, tp: int, cp: int,
                sp: bool, ep: int = 1, etp: int = 1) -> LayerTime:
    rows, h, f = micro_batch * seq // cp, model.hidden, model.ffn
    up = f if model.family == "gpt2" else 2 * f
    gemms = [(rows, (model.q_dim + 2 * model.kv_dim) // tp, h, 1), (rows, h, model.q_dim // tp, 1)]
    if model.moe:   # the router; E/ep local experts, each fed its even share of the ep ranks' k routes a token
        share = max(1, round(rows // tp * etp * model.top_k * ep / model.experts))   # an etp group's tokens
        gemms += [(rows, model.experts, h, 1), (share, up // etp, h, model.experts // ep),
                  (share, h, f // etp, model.experts // ep)]
    else:
        gemms += [(rows, up // tp, h, 1), (rows, h, f // tp, 1)]
    forward = backward = 0.0
    for m, n, k, count in gemms:
        fwd, bwd = _forward_and_backward(gpu, m, n, k)
        forward, backward = forward + count * fwd, backward + count * bwd
    heads, d, local = model.heads // tp, model.head_dim, seq // cp
    flash = model.attention != "math"
    if flash:    # the causal half of 4 s d FLOPs a token a head forward; backward 2.5x (five GEMMs to two)
        core = 4 * micro_batch * local * seq * heads * d / 2 / (gpu.peak * gpu.flash)
        attention = (core, 2.5 * core)
    else:
        core = replace(gpu, gemm_peak=gpu.peak, gemm_fraction=gpu.mamf, gemm_bytes=gpu.element_bytes)
        scores = _forward_and_backward(core, local, seq, d, micro_batch * heads)
        mixed = _forward_and_backward(core, local, d, seq, micro_batch * heads)
        attention = (scores[0] + mixed[0], scores[1] + mixed[1])
    kept = layer_bytes(model, local, micro_batch, tp, sp, "selective" if flash else "none") * gpu.element_bytes / 2
    hbm = gpu.hbm_gbs * 1e9
    flops = 3 * (2 * sum(m * n * k * count for m, n, k, count in gemms) + 4 * rows * seq * heads * d)
    if model.moe:   # the model's FLOPs: every token's k routes, not the share rounded
        flops += 6 * (rows * model.top_k / tp - share * model.experts / (ep * etp)) * (up + f) * h
    return LayerTime(forward, backward, *attention, 2 * kept / hbm, 3 * kept / hbm, flops)


def layer_efficiency(gpu: GPU, model: ModelConfig, seq: int, micro_batch: int, tp: int = 1, cp: int = 1,
                     sp: bool = False, precision: str = "bf16", fp8: bool = False, ep: int = 1, etp: int = 0) -> float:
    """Model FLOPs of a layer's forward and backward over peak x its seconds: the fraction of the dense
    peak of the training precision the layout's compute reaches (module doc); with fp8 GEMMs it may pass 1.

    >>> from plscale.predict.cluster import GPUS
    >>> from plscale.predict.presets import PRESETS
    >>> round(layer_efficiency(GPUS["H100"], PRESETS["7b"], 4096, 1), 2)
    0.63
    >>> round(layer_efficiency(GPUS["H100"], PRESETS["7b"], 4096, 1, fp8=True), 2)   # of the bf16 peak
    0.98
    """
    t = layer_time(gpu, model, seq, micro_batch, tp, cp, sp, precision, fp8, ep, etp)
    return t.model_flops / (gpu.peak(precision) * t.total)
