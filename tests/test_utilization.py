"""MFU's two halves: the model FLOPs a step (plscale.predict.recompute.step_flops) against
torch's own FLOP counter on the real model, and the measured matmul peak (plscale.rank.peak)
against a GEMM timed here."""

import dataclasses
import json
import time
from types import SimpleNamespace

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from plscale.predict.presets import preset
from plscale.predict.recompute import step_flops
from plscale.rank import peak
from plscale.rank.models.llama import Llama, rope_tables
from plscale.rank.utilization import Utilization


@pytest.mark.parametrize("name", ["tiny", "small"])
def test_model_flops_equal_torchs_count_of_forward_and_backward(name):
    # the math core: its q k^T and p v are plain matmuls torch's counter sees (the fused CPU kernel it does not)
    c = dataclasses.replace(preset(name), attention="math")
    b, s = 2, 64
    tokens = torch.randint(0, c.vocab, (b, s + 1))
    with FlopCounterMode(display=False) as counter:
        Llama(c)(tokens[:, :-1], tokens[:, 1:]).backward()
    # causal-free, as PaLM's MFU counts it: the math core multiplies the masked half too
    assert counter.get_total_flops() == step_flops(c, s).step * b * s


def test_recomputation_counts_in_hfu_only():
    c, s = preset("tiny"), 64
    full = step_flops(c, s, "full")
    assert full.step == step_flops(c, s).step           # MFU's FLOPs: the same model, the same step
    # HFU's: one more forward of every layer (the head and embedding are not rerun)
    c_math = dataclasses.replace(c, attention="math")
    model = Llama(c_math)
    x, tables = torch.randn(2, s, c.hidden), rope_tables(c.head_dim, s, c.rope_theta, torch.device("cpu"))
    with FlopCounterMode(display=False) as counter:
        for layer in model.layers:
            x = layer(x, *tables)
    assert full.recompute * 2 * s == pytest.approx(counter.get_total_flops(), rel=1e-9)


@pytest.mark.parametrize("top_k, factor", [(1, 1.0), (2, 1.25), (2, 2.0)])
def test_moe_flops_equal_torchs_count_model_with_k_experts_hardware_with_every_slot(top_k, factor):
    # a mixture of experts by hand (lab 08), every expert in one process: torch counts what runs, by module.
    # The forward only: the counter's modules are right there (in the backward it credits a module's gradients
    # to others); the backward's 2 x the forward is the dense test's above
    from plscale.predict import experts as moe
    from plscale.strategies.experts.llama import MoELlama

    c, b, s, E = dataclasses.replace(preset("tiny"), attention="math"), 2, 64, 4
    torch.manual_seed(0)
    model = MoELlama(c, E, top_k, factor, None, "hand", 0.01, 4)
    tokens = torch.randint(0, c.vocab, (b, s + 1))
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        model(tokens[:, :-1], tokens[:, 1:])
    by_module = {name: sum(ops.values()) for name, ops in counter.get_flop_counts().items()}
    mlps = [f"MoELlama.layers.{i}.mlp" for i in range(c.layers)]
    experts_part = sum(by_module[f"{m}.experts.{e}"] for m in mlps for e in range(E))
    # the one-hot dispatch and combine einsums are the implementation's: what is left of each MoE layer is
    # its router and its experts, each over all E x C slots
    kept = sum(by_module[f"{m}.gate"] for m in mlps) + experts_part
    counted = by_module["MoELlama"] - sum(by_module[m] for m in mlps) + kept
    capacity = moe.capacity(b * s, E, top_k, factor, 4)
    flops = moe.step_flops(c, E, top_k, s, E * capacity / (b * s))
    assert 3 * counted == pytest.approx(flops.hardware * b * s, rel=1e-12)
    # MFU's count is the same model with k experts a token instead of the slots: the experts' part scaled
    assert flops.model * b * s == pytest.approx(3 * (counted - experts_part * (1 - top_k * b * s / (E * capacity))),
                                                rel=1e-12)


@pytest.fixture
def one_thread():
    """One thread, as a lab's CPU rank runs: a 2-thread GEMM on a loaded 2-core machine waits for its slower thread."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def test_the_peak_is_the_best_gemm_and_is_cached(tmp_path, monkeypatch, one_thread):
    cache = tmp_path / "peak.json"
    monkeypatch.setenv("PLSCALE_PEAK_CACHE", str(cache))
    monkeypatch.setattr(peak, "SECONDS_A_SHAPE", {"cpu": 0.2, "cuda": 0.1})
    torch.manual_seed(0)
    found = peak.matmul_peak(torch.device("cpu"), torch.float32)
    after = torch.rand(4)
    torch.manual_seed(0)   # measured or read from the cache, the run's seeded stream is the same (its dropout, its data)
    assert torch.equal(after, torch.rand(4))
    assert found.shape in peak.CPU_SIZES and found.threads == 1
    # a GEMM of that size timed here, the best over as long, in FLOP/s (2 n^3 a product): the sweep's
    # rate, within what another moment's load on a shared machine makes of it
    n = found.shape
    a, b = torch.randn(n, n), torch.randn(n, n)
    best, start = float("inf"), time.perf_counter()
    while time.perf_counter() - start < 0.2:
        best = min(best, _timed(lambda: a @ b))
    assert 0.25 * found.flops <= 2 * n**3 / best <= 1.5 * found.flops
    saved = json.loads(cache.read_text())
    assert len(saved) == 1 and next(iter(saved.values()))["flops"] == found.flops
    monkeypatch.setattr(peak, "measure", lambda *a: pytest.fail("measured again despite the cache"))
    assert peak.matmul_peak(torch.device("cpu"), torch.float32) == found


def test_utilization_of_a_step(tmp_path, monkeypatch, one_thread):
    monkeypatch.setenv("PLSCALE_PEAK_CACHE", str(tmp_path / "peak.json"))
    monkeypatch.setattr(peak, "SECONDS_A_SHAPE", {"cpu": 0.05, "cuda": 0.05})
    c, s, tokens = preset("tiny"), 64, 4 * 64 * 2
    ctx = SimpleNamespace(world_size=2, device=torch.device("cpu"), log=lambda *a: None)
    util = Utilization(ctx, c, s, tokens, "fp32", recompute="full")
    fields = util.of_step(0.5)
    model_flops = step_flops(c, s).step * tokens
    assert fields["tokens_per_s"] == pytest.approx(tokens / 0.5)
    assert fields["mfu"] == pytest.approx(model_flops / 0.5 / 2 / util.measured.flops, rel=1e-4)
    assert fields["hfu"] > fields["mfu"] and "mfu_datasheet" not in fields   # no datasheet peak on a CPU
    figures = {f["name"]: f for f in util.figures([0.4, 0.5, 9.0])}           # median 0.5: the slow step ignored
    assert figures["throughput"]["value"] == pytest.approx(tokens / 0.5, abs=0.1)
    assert "median of 3 timed steps" in figures["throughput"]["note"]
    assert "measured matmul" in figures["MFU"]["note"] and "recomputation" in figures["HFU"]["note"]


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0
