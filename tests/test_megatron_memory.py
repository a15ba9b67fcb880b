"""Megatron-LM's activation memory (plscale/predict/megatron.py) against Korthikanti et al. 2022:
each row of the paper's table 2 written out here, the first pipeline stage's total as its section
4.3 adds it up, and published runs that trained in 80 GB predicted to fit under it."""

import json

import pytest

from conftest import run_cli
from plscale.predict import megatron
from plscale.predict.cluster import GPUS
from plscale.predict.errors import PredictionError
from plscale.predict.memory import Setup, estimate
from plscale.predict.plan import Job, plan
from plscale.predict.presets import ModelConfig

# GPT-3 175B as the paper trains it (table 3): h 12288, a 96, L 96, s 2048, micro-batch 1, t 8; its MLP is 4h
GPT3 = ModelConfig(vocab=51200, hidden=12288, layers=96, heads=96, kv_heads=96, ffn=4 * 12288, max_seq=2048,
                    attention="math")   # the paper's attention writes its scores
S, B, H, A, T = 2048, 1, 12288, 96, 8


@pytest.mark.parametrize("tp, sp, recompute, paper", [
    (1, False, "none", S * B * H * (34 + 5 * A * S / H)),                 # no parallelism
    (T, False, "none", S * B * H * (10 + 24 / T + 5 * A * S / (H * T))),  # tensor parallel
    (T, True, "none", S * B * H / T * (34 + 5 * A * S / H)),             # tensor + sequence parallel
    (T, False, "selective", S * B * H * (10 + 24 / T)),                   # tensor parallel + selective
    (T, True, "selective", S * B * H / T * 34),                          # tensor + sequence + selective
    (T, False, "full", 2 * S * B * H),                                   # full recomputation
    (T, True, "full", 2 * S * B * H / T),
])
def test_each_row_of_the_papers_table_2(tp, sp, recompute, paper):
    assert megatron.layer_bytes(GPT3, S, B, tp, sp, recompute) == pytest.approx(paper, rel=1e-12)


def test_the_first_stage_holds_every_layers_worth_under_1f1b():
    # section 4.3: p micro-batches of L/p layers, plus the embedding's ids (8 bytes) and dropout mask (sbh)
    # for each in flight; with sequence parallelism all of it split over t
    per_layer = S * B * H * 34 / T
    embedding = (8 * S * B + S * B * H) * 8 / T
    got = megatron.first_stage_bytes(GPT3, S, B, T, pp=8, sp=True, recompute="selective")
    assert got == pytest.approx(GPT3.layers * per_layer + embedding, rel=1e-12)
    # interleaved over v chunks: 1 + (p - 1)/(p v) more in flight
    v = megatron.first_stage_bytes(GPT3, S, B, T, pp=8, sp=True, recompute="selective", virtual=2)
    assert v == pytest.approx(got * (1 + 7 / 16), rel=1e-12)
    # fewer micro-batches than stages: only that many in flight (non-interleaved)
    few = megatron.first_stage_bytes(GPT3, S, B, T, pp=8, sp=True, recompute="selective", micro_batches=2)
    assert few == pytest.approx(got * 2 / 8, rel=1e-12)
    # one stage: the final norm's and the head's inputs and the fp32 logits, 4sbh(1 + V/h)
    one = megatron.first_stage_bytes(GPT3, S, B, T, pp=1, sp=True, recompute="selective")
    assert one == pytest.approx((GPT3.layers * S * B * H * 34 + 8 * S * B + S * B * H
                                 + 4 * S * B * H * (1 + 51200 / H)) / T, rel=1e-12)


def test_the_530b_run_that_trained_in_80_gb_fits_under_megatrons_count():
    # Korthikanti et al. table 3: MT-NLG 530B (h 20480, a 128, L 105) at t 8, p 35 on 280 A100 80GB, micro-batch 1,
    # global batch 280, sequence parallelism and selective recomputation. It ran; plscale's own Llama count
    # (fp32 norms, whole gathered inputs) says it does not fit, Megatron's that it does
    mtnlg = ModelConfig(vocab=51200, hidden=20480, layers=105, heads=128, kv_heads=128, ffn=4 * 20480, max_seq=2048,
                        attention="math")
    fixed = (("tp", 8), ("pp", 35), ("dp", 1), ("zero", 0), ("recompute", "selective"), ("micro_batch", 1),
             ("virtual", 1))
    gpu = GPUS["A100"]
    fits = {who: plan(Job(mtnlg, 280, 2048, 280, fixed=fixed, activations=who), gpu).ranked
            for who in ("plscale", "megatron")}
    assert fits["megatron"] and not fits["plscale"]
    [c] = fits["megatron"]
    assert c.memory < gpu.memory


def test_estimate_memory_prints_megatrons_count_and_refuses_what_it_does_not_know():
    out = run_cli("estimate", "memory", "--model", "7b", "--gpus", "8", "--tp", "8", "--sp", "--seq", "2048",
                  "--recompute", "selective", "--activations", "megatron", "--json")
    assert out.returncode == 0, out.stderr
    # Llama-2-7B at t 8, sequence parallel, selective: sbh(18 + 4f/h)/t a layer (Megatron's form of the 34 for an
    # MLP of width f), 32 layers, the embedding's ids and mask, and the head's 4sbh(1 + V/h), all over t
    sbh, f = 2048 * 4096, 11008
    want = (32 * sbh * (18 + 4 * f / 4096) + 8 * 2048 + sbh + 4 * sbh * (1 + 32000 / 4096)) / 8
    assert json.loads(out.stdout)["terms"]["activations"]["device"] == pytest.approx(want, rel=1e-12)
    bad = run_cli("estimate", "memory", "--model", "7b", "--activations", "megatron", "--recompute", "deepspeed")
    assert bad.returncode == 2 and "Megatron's activation model knows none, selective" in bad.stderr, bad.stderr
    negative = run_cli("estimate", "memory", "--model", "7b", "--stage", "3", "--persistence-threshold", "-5")
    assert negative.returncode == 2 and "--persistence-threshold -5: use 0" in negative.stderr, negative.stderr


def test_gradients_of_megatrons_optimizer_and_deepspeeds_bf16_optimizer():
    """Megatron-LM's docs (api-guide/dist_optimizer.md): with 16-bit weights and fp32 gradients a parameter
    costs 18 bytes, 6 + 12/d with the distributed optimizer over d ranks. DeepSpeed's BF16_Optimizer
    (bf16_optimizer.py) keeps the 16-bit gradients and a flat fp32 buffer of every parameter's
    (fp32_groups_gradients_flat), and shards its master and moments: 2 + 2 + 4 + 12/d."""
    psi, d = 1_000_000_000, 8
    for stage, per_param in ((0, 18), (1, 6 + 12 / d)):
        states = estimate(Setup(params=psi, stage=stage, dp=d, optimizer="megatron"))
        assert sum(t.device for t in states.terms) == pytest.approx(per_param * psi)
    bf16 = estimate(Setup(params=psi, stage=1, dp=d, optimizer="bf16-optimizer"))
    assert sum(t.device for t in bf16.terms) == pytest.approx((2 + 2 + 4 + 12 / d) * psi)
    for bad in (Setup(params=psi, stage=2, dp=d, optimizer="megatron"), Setup(params=psi, optimizer="adam")):
        with pytest.raises(PredictionError, match="optimizer"):
            estimate(bad)
