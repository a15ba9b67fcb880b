"""The planner's compute efficiency by matmul shape (plscale/predict/matmul.py), against published
measurements: ml-engineering's MAMF table and tile count, and one layer of Korthikanti et al. 2022's
22B model timed on A100s (their table 4)."""

import doctest
from math import ceil

import pytest

from plscale.predict.cluster import GPUS
from plscale.predict.errors import PredictionError
from plscale.predict.matmul import TILE, gemm_seconds, layer_efficiency, layer_time, wave_efficiency
from plscale.predict.presets import ModelConfig
from plscale.predict.step_time import links, tp_parts
from tests.conftest import ROOT

# Korthikanti et al. 2022, table 3: the 22B GPT (4h MLP, learned positions, vocabulary 51,200), tp 8,
# micro-batch 4 of 2,048 tokens, A100 80GB; Megatron-LM of 2022 materialised the attention scores.
GPT_22B = ModelConfig(vocab=51200, hidden=6144, layers=48, heads=64, kv_heads=64, ffn=4 * 6144, max_seq=2048,
                      family="gpt2", attention="math")


def test_mamf_is_ml_engineerings_measured_best_gemm():
    """The best large bf16 GEMM over the datasheet peak, stas00/ml-engineering's MAMF table: A100 SXM 271.2 of
    312 TFLOP/s, H100 SXM 794.5 of 989 (H200 the same), B200 1,745 of 2,250."""
    for name, mamf, peak in (("A100", 271.2, 312), ("H100", 794.5, 989), ("H200", 794.5, 989), ("B200", 1745, 2250)):
        gpu = GPUS[name]
        assert gpu.peak("bf16") == peak * 1e12
        assert gpu.mamf == pytest.approx(mamf / peak, abs=5e-4)


def test_a_large_gemm_runs_at_the_mamf_and_a_thin_one_at_the_roofline():
    """An 8192^3 GEMM runs at 85% (TYPICAL, ml-engineering's 80-90% of ordinary shapes) of the best 794.5
    TFLOP/s, less its last wave's idle SMs: 2,048 tiles in 16 waves of 132 (97.0%). A GEMM of 16 rows is
    bound by its bytes: (16 x 8192 + 8192^2 + 16 x 8192) x 2 bytes at 3,350 GB/s."""
    h100 = GPUS["H100"]
    big = gemm_seconds(h100, 8192, 8192, 8192)
    assert 2 * 8192**3 / big == pytest.approx(794.5e12 * 0.85 * 2048 / (16 * 132), rel=1e-3)
    thin = gemm_seconds(h100, 16, 8192, 8192)
    bytes_moved = 2 * (16 * 8192 + 8192 * 8192 + 16 * 8192)
    assert thin == pytest.approx(bytes_moved / 3350e9 / wave_efficiency(16, 8192, 132), rel=1e-9)


def test_tiles_of_llama_8b_up_projection_as_ml_engineering_counts_them():
    """ml-engineering (training/performance, tile and wave quantization): Llama-3.1-8B's MLP up-projection at
    8K tokens, an 8192 x 14336 output, is 3,584 blocks of 128 x 256; on an H100's 132 SMs, 28 waves (27.15)."""
    tiles = ceil(8192 / TILE[0]) * ceil(14336 / TILE[1])
    assert tiles == 3584
    assert wave_efficiency(8192, 14336, 132) == pytest.approx(3584 / (28 * 132))
    # one tile more than a full wave wastes most of a wave; one fewer loses one SM's share
    assert wave_efficiency(128 * 133, 256, 132) == pytest.approx(133 / 264)
    assert wave_efficiency(128 * 131, 256, 132) == pytest.approx(131 / 132)


@pytest.mark.parametrize("sp, forward_ms, backward_ms", [(False, 7.7, 11.9), (True, 7.2, 11.8)])
def test_one_layer_of_22b_within_15_percent_of_korthikanti_table_4(sp, forward_ms, backward_ms):
    """Korthikanti et al. 2022, table 4: one layer of the 22B model on 8 A100s, tp 8, micro-batch 4: forward
    7.7 ms and backward 11.9 ms (sequence parallel: 7.2 and 11.8), without recomputation. The model's
    compute (matmul.layer_time) plus the step-time model's tensor-parallel collectives over NVLink."""
    a100 = GPUS["A100"]
    t = layer_time(a100, GPT_22B, 2048, 4, tp=8, sp=sp)
    tp_forward, tp_backward, _, _ = tp_parts(GPT_22B, 8, 2048, 4, "bf16", sp, 1, links(a100, 8, 1))
    assert (t.forward + tp_forward) * 1e3 == pytest.approx(forward_ms, rel=0.15)
    assert (t.backward + tp_backward) * 1e3 == pytest.approx(backward_ms, rel=0.15)
    assert t.backward > 1.5 * t.forward      # two GEMMs a weight backward, one forward


def test_efficiency_rises_with_width_and_falls_with_tensor_parallel_splits():
    """Wider layers spend less of their time on elementwise work, which grows as h while the matmuls grow as
    h^2; splitting a layer over tp leaves each GPU thinner GEMMs and more waves half full."""
    h100 = GPUS["H100"]

    def gpt(h):
        return ModelConfig(vocab=51200, hidden=h, layers=1, heads=h // 128, kv_heads=h // 128, ffn=4 * h,
                           max_seq=4096, family="gpt2")
    widths = [2048, 4096, 8192, 16384]
    rates = [layer_efficiency(h100, gpt(h), 4096, 1) for h in widths]
    assert rates == sorted(rates) and rates[-1] < h100.mamf
    assert layer_efficiency(h100, gpt(4096), 4096, 1, tp=8) < layer_efficiency(h100, gpt(4096), 4096, 1, tp=1)


def test_korthikanti_iteration_times_within_15_percent_pinned_to_their_layouts():
    """Korthikanti et al. 2022, table 5 (and 6.3's 530B at dp 8): iteration times of 1.10, 13.75, 37.83,
    71.49 and 39.15 s with sequence parallelism and selective recomputation on A100s. The planner, held to
    each published layout (benchmarks/published_runs.csv, benchmarks/plan_validation.py), predicts each
    within 15%."""
    import csv
    import sys
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import plan_validation
    rows = [r for r in csv.DictReader(plan_validation.RUNS.open()) if r["name"].startswith("Korthikanti")]
    assert [float(r["value"]) for r in rows] == [1.10, 13.75, 37.83, 71.49, 39.15]
    for row in rows:
        result = plan_validation.validate(row)
        assert result["fits"] and result["ratio"] == pytest.approx(1, abs=0.15), (row["name"], result["ratio"])


def test_fp8_gemms_at_the_fp8_peak_and_its_measured_best():
    """fp8 (e4m3) dense peaks from the datasheets and ml-engineering's best fp8 GEMMs: H100 1,402.6 of 1,979
    TFLOP/s, H200 1,453.4, B200 3,432.5 of 4,500. An 8192^3 fp8 GEMM on an H100 runs at 85% of 1,402.6 less
    its waves; an A100 has no fp8 and says so."""
    for name, best, peak in (("H100", 1402.6, 1979), ("H200", 1453.4, 1979), ("B200", 3432.5, 4500)):
        gpu = GPUS[name]
        assert gpu.peak("fp8") == peak * 1e12 and gpu.best_fraction("fp8") == pytest.approx(best / peak, abs=5e-4)
    fp8 = gemm_seconds(GPUS["H100"], 8192, 8192, 8192, "fp8")
    assert 2 * 8192**3 / fp8 == pytest.approx(1402.6e12 * 0.85 * 2048 / (16 * 132), rel=1e-3)
    with pytest.raises(PredictionError, match="no fp8"):
        GPUS["A100"].peak("fp8")
    # the same layer in fp8: its GEMMs faster, its attention and elementwise work the same
    bf16, eight = (layer_time(GPUS["H100"], GPT_22B, 2048, 4, tp=8, fp8=f) for f in (False, True))
    assert eight.matmul_forward < 0.6 * bf16.matmul_forward
    assert (eight.attention_forward, eight.elementwise_forward) == (bf16.attention_forward, bf16.elementwise_forward)


def test_the_modules_worked_examples():
    import plscale.predict.matmul as matmul
    assert doctest.testmod(matmul).failed == 0


def test_plan_refuses_fp8_where_the_gpu_has_none(quick_cli):
    result = quick_cli("plan", "--model", "7b", "--gpus", "8", "--gpu", "A100", "--fp8")
    assert result.returncode == 2 and "no fp8 tensor cores" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
