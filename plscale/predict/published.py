"""Published training configurations and the model shapes behind them: what `plscale plan` is
validated against (tests/test_plan.py), and large shapes `--model` accepts beside the presets.

Host-side and pure. The shapes are Llama-shaped `ModelConfig`s (kept here, not in
plscale.predict.presets: the presets are built as torch models by the tests, and these are
hundreds of billions of parameters).

Llama 3 (Grattafiori et al., "The Llama 3 Herd of Models", 2024), table 3 (shapes) and table 4
(the 405B's pre-training layouts on H100 80GB, 8 a server, 400 Gb/s a GPU):
    GPUs     TP  CP  PP   DP   seq      batch/DP  tokens/batch  TFLOP/s a GPU  BF16 MFU
    8,192     8   1  16   64   8,192    32        16M           430            43%
    16,384    8   1  16  128   8,192    16        16M           400            41%
    16,384    8  16  16    8   131,072  16        16M           380            38%
  The paper's pipeline is interleaved and uneven: the first and last stages hold one layer
  fewer (126 = 16 x 8 - 2), which is how PP 16 divides 126 layers.

Megatron-LM (Narayanan et al., "Efficient Large-Scale Language Model Training on GPU Clusters
Using Megatron-LM", SC 2021), table 1 (GPT models, vocabulary 51,200, sequence 2,048, A100
80GB on Selene: DGX A100 nodes of 8 GPUs, 8 x 200 Gb/s HDR a node). GPT's MLP (4h, two
matrices, 8h^2 weights) is written as a SwiGLU of the same weights, f = 8h/3 (rounded down to a
multiple of 8 where 8h/3 is not whole): the same parameters and FLOPs per token.
    params   heads  hidden  layers  TP  PP  GPUs   batch  TFLOP/s a GPU
    145.6B   96     12,288  80       8   8  1,536  2,304  148
    310.1B   128    16,384  96       8  16  1,920  2,160  155
  These runs used full activation recomputation and the interleaved schedule where it helped.

Validation (tests/test_plan.py, `benchmarks/plan_order.py --published`): each run is planned with
the choices its system offered (`fixed`, the reason in `differences`) and its layout must be among
the `top_k` best layouts, its predicted step time within `max_gap` of the best one's. The planner
enumerates the interleaved schedule and Llama 3's uneven stages, so neither is a difference. Where
the planner, left free, prefers another layout, `differences` says which and why.
"""

from dataclasses import dataclass

from plscale.errors import did_you_mean
from plscale.predict.errors import PredictionError
from plscale.predict.presets import PRESETS, ModelConfig

# The MFU the decks quote for a large, well-run job (slides 01 and 04): Llama 3 405B's pre-training ran at
# 38-43 % BF16 MFU on 8K-16K H100s (Grattafiori et al. 2024, table 4, above). The planner's efficiency is
# its own model's (plscale.predict.matmul), not this figure.
LLAMA3_MFU = 0.40

# Failures at scale (slides 11 and 12): Llama 3's pre-training saw 419 unexpected interruptions in a
# 54-day snapshot on 16,384 H100 GPUs (Grattafiori et al. 2024, section 3.3.4).
LLAMA3_INTERRUPTIONS, LLAMA3_DAYS, LLAMA3_GPUS = 419, 54, 16_384

SHAPES = {
    "llama3-8b": ModelConfig(vocab=128256, hidden=4096, layers=32, heads=32, kv_heads=8, ffn=14336,
                             max_seq=8192, tie_embeddings=False, rope_theta=500_000.0),
    "llama3-70b": ModelConfig(vocab=128256, hidden=8192, layers=80, heads=64, kv_heads=8, ffn=28672,
                              max_seq=8192, tie_embeddings=False, rope_theta=500_000.0),
    "llama3-405b": ModelConfig(vocab=128256, hidden=16384, layers=126, heads=128, kv_heads=8, ffn=53248,
                               max_seq=131072, tie_embeddings=False, rope_theta=500_000.0),
    # Mixtral's shapes (the v0.1 base models' config.json): 8 experts, top-2, untied; 46.7B and 140.6B parameters.
    "mixtral-8x7b": ModelConfig(vocab=32000, hidden=4096, layers=32, heads=32, kv_heads=8, ffn=14336, max_seq=32768,
                                tie_embeddings=False, rope_theta=1e6, experts=8, top_k=2),
    "mixtral-8x22b": ModelConfig(vocab=32000, hidden=6144, layers=56, heads=48, kv_heads=8, ffn=16384,
                                 max_seq=65536, tie_embeddings=False, rope_theta=1e6, experts=8, top_k=2),
    # Qwen3's MoE shapes (Qwen's config.json): 128 experts, top-8, heads of 128 wider than hidden / heads, q and k
    # normed; 30.5B and 235B parameters (transformers' count; Qwen: "30.5B total, 3.3B activated", "235B, 22B").
    "qwen3-30b-a3b": ModelConfig(vocab=151936, hidden=2048, layers=48, heads=32, kv_heads=4, ffn=768, max_seq=40960,
                                 tie_embeddings=False, rope_theta=1e6, norm_eps=1e-6, experts=128, top_k=8,
                                 head_size=128, qk_norm=True),
    "qwen3-235b-a22b": ModelConfig(vocab=151936, hidden=4096, layers=94, heads=64, kv_heads=4, ffn=1536,
                                   max_seq=40960, tie_embeddings=False, rope_theta=1e6, norm_eps=1e-6, experts=128,
                                   top_k=8, head_size=128, qk_norm=True),
    "gpt-145b": ModelConfig(vocab=51200, hidden=12288, layers=80, heads=96, kv_heads=96, ffn=32768, max_seq=2048),
    "gpt-310b": ModelConfig(vocab=51200, hidden=16384, layers=96, heads=128, kv_heads=128, ffn=43688, max_seq=2048),
}


@dataclass(frozen=True)
class Published:
    """One published run: the model, the cluster, the batch, and the layout it used."""
    name: str
    model: str           # a key of SHAPES
    gpu: str             # a key of plscale.predict.cluster.GPUS
    gpus: int
    seq: int
    global_batch: int    # sequences per step
    dp: int
    tp: int
    pp: int
    cp: int
    tflops_per_gpu: float
    source: str
    fixed: tuple         # (name, value) the planner is held to: what the run's system offered
    top_k: int           # the layout must rank among the top_k best layouts, under `fixed`
    max_gap: float       # ... with a predicted step time at most this fraction above the best's
    differences: str     # what the paper did that the planner does not model, and known deviations

    @property
    def layout(self) -> tuple[int, int, int, int]:
        return (self.dp, self.tp, self.pp, self.cp)


_LLAMA = ("held to CP as published (the paper adds CP only for long context) and ZeRO-1, the planner's "
          "closest option with PP to the paper's FSDP beside PP (weights kept gathered from forward to backward; "
          "the planner offers ZeRO 0-1 with pp). "
          "Known deviation, ZeRO free: the planner prefers ZeRO-3 over every DP rank without PP (m = 1): it hides "
          "each parameter gather behind compute and prices no loss of bandwidth for per-rank shards of a few "
          "hundred KB over 1-2K ranks. Known deviation, CP free as well: it prefers cp > 1 without "
          "recomputation (CP cuts activations so the forward need not rerun). The published layout fits the "
          "memory model only with full recomputation (plscale's Llama's activation count). The matmul-shape "
          "efficiency prices tp 8's thinner GEMMs: tp 4 x pp 8 is predicted up to 8 % faster on 8K GPUs")
_MEGATRON = ("held to ZeRO 0 and CP 1: Megatron-LM (2021) had neither (its distributed optimizer came in "
             "2022). Known deviation, ZeRO free: the planner prefers ZeRO-3 data parallelism without PP, for the "
             "reason given for Llama 3. GPT (GELU MLP, learned positions) is written as a Llama-shaped model of "
             "the same weights")
_LLAMA_FIXED, _MEGATRON_FIXED = (("zero", 1),), (("zero", 0), ("cp", 1))
PUBLISHED = [
    Published("Llama 3 405B, 8K GPUs", "llama3-405b", "H100", 8192, 8192, 2048, 64, 8, 16, 1, 430,
              "Llama 3 paper, table 4", (*_LLAMA_FIXED, ("cp", 1)), 5, 0.10, _LLAMA),
    Published("Llama 3 405B, 16K GPUs", "llama3-405b", "H100", 16384, 8192, 2048, 128, 8, 16, 1, 400,
              "Llama 3 paper, table 4", (*_LLAMA_FIXED, ("cp", 1)), 3, 0.07, _LLAMA),
    Published("Llama 3 405B, 16K GPUs, 128K context", "llama3-405b", "H100", 16384, 131072, 128, 8, 8, 16, 16, 380,
              "Llama 3 paper, table 4", (*_LLAMA_FIXED, ("cp", 16)), 3, 0.07, _LLAMA),
    Published("Megatron-LM GPT 145.6B", "gpt-145b", "A100", 1536, 2048, 2304, 24, 8, 8, 1, 148,
              "Narayanan et al. 2021, table 1", _MEGATRON_FIXED, 3, 0.05, _MEGATRON),
    Published("Megatron-LM GPT 310.1B", "gpt-310b", "A100", 1920, 2048, 2160, 15, 8, 16, 1, 155,
              "Narayanan et al. 2021, table 1", _MEGATRON_FIXED, 3, 0.05, _MEGATRON),
]


def model_shape(name: str) -> ModelConfig:
    """A preset (plscale.predict.presets) or a published shape (SHAPES), by name."""
    if name.lower() in PRESETS:
        return PRESETS[name.lower()]
    if name.lower() in SHAPES:
        return SHAPES[name.lower()]
    known = [*PRESETS, *SHAPES]
    raise PredictionError("model", name, f"No model {name!r}.{did_you_mean(name.lower(), known)} Use a preset or a "
                                         f"published shape ({', '.join(known)}), or give the shape with {{layers}}, "
                                         f"{{hidden}}, {{heads}}, {{kv_heads}}, {{ffn}} and {{vocab}}.", lead=False)
