"""The roofline (plscale.predict.roofline) and the compute time the decks share (step_time.compute_seconds)."""

import doctest

import pytest

from plscale.predict import roofline, step_time
from plscale.predict.cluster import GPUS
from plscale.predict.published import LLAMA3_MFU, PUBLISHED


@pytest.mark.parametrize("module", [roofline, step_time])
def test_docstring_examples(module):
    assert doctest.testmod(module).failed == 0


def test_attainable_is_bandwidth_bound_left_of_the_ridge_and_peak_right_of_it():
    h100 = GPUS["H100"]
    edge = roofline.ridge(h100)
    assert edge == pytest.approx(989e12 / 3350e9)
    assert roofline.attainable_flops(h100, edge / 2) == pytest.approx(h100.peak("bf16") / 2)
    assert roofline.attainable_flops(h100, edge * 2) == h100.peak("bf16")
    assert roofline.matmul_intensity(4096, 4096, 4096) == pytest.approx(4096 / 3)   # 2n^3 / (2 x 3n^2)
    assert all(gpu.hbm_gbs > 0 for gpu in GPUS.values())


def test_llama3_mfu_is_the_papers():
    """40 %: Llama 3 405B's 400 TFLOP/s a GPU on 16K H100s (table 4), rounded."""
    run = next(p for p in PUBLISHED if p.name == "Llama 3 405B, 16K GPUs")
    assert LLAMA3_MFU == round(run.tflops_per_gpu * 1e12 / GPUS[run.gpu].peak("bf16"), 2)
