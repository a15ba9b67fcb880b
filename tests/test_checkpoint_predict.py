"""The checkpointing model: Young/Daly intervals, the waste, steps lost, and the bytes DeepSpeed writes."""

import math

import pytest

from plscale.errors import UserError
from plscale.charts.plots import interval_chart
from plscale.predict.checkpoint import (checkpoint_bytes, daly_interval, expected_steps_lost, tensor_sizes,
                                        waste_fraction, worst_steps_lost, young_interval)
from plscale.predict.presets import PRESETS, param_count

DAY = 86_400.0


# ---- how often: Young, Daly and the waste ------------------------------------------------------

def test_young_interval_by_hand():
    # δ = 30 s, M = 24 h: sqrt(2 * 30 * 86400) = sqrt(5,184,000) = 2276.84 s, 38 minutes
    assert young_interval(30, DAY) == pytest.approx(2276.8399, abs=1e-3)
    assert young_interval(2, 50) == pytest.approx(math.sqrt(200))


def test_daly_interval_by_hand():
    # x = δ/(2M) = 30/172800; sqrt(2δM)·(1 + sqrt(x)/3 + x/9) − δ = 2276.84·1.0044112 − 30
    x = 30 / (2 * DAY)
    assert daly_interval(30, DAY) == pytest.approx(math.sqrt(5_184_000) * (1 + math.sqrt(x) / 3 + x / 9) - 30, rel=1e-12)
    assert daly_interval(30, DAY) == pytest.approx(2256.8838, abs=1e-3)
    # a stall at least 2M long: Daly says checkpoint every M
    assert daly_interval(200, 100) == 100 and daly_interval(200.0, 100.0) == 100


@pytest.mark.parametrize("stall,mtbf", [(1, DAY), (30, DAY), (300, 6 * 3600), (10, 3600)])
def test_daly_is_shorter_than_young_for_a_small_stall(stall, mtbf):
    young, daly = young_interval(stall, mtbf), daly_interval(stall, mtbf)
    assert daly < young
    # sqrt(2δM)·sqrt(δ/(2M))/3 = δ/3, so Daly is about δ − δ/3 = 2δ/3 shorter while δ << M
    assert young - daly == pytest.approx(2 * stall / 3, rel=0.05)


def test_waste_by_hand():
    # τ = 1 h, δ = 60 s, M = 24 h, R = 10 min: 60/3600 + 3660/172800 + 600/86400 = 4.479 %
    assert waste_fraction(3600, 60, DAY, 600) == pytest.approx(0.0166667 + 0.0211806 + 0.0069444, abs=1e-6)
    # at Young's interval overhead and rework are equal, and waste ≈ sqrt(2δ/M)
    tau = young_interval(30, DAY)
    assert 30 / tau == pytest.approx(tau / (2 * DAY))
    assert waste_fraction(tau, 30, DAY) == pytest.approx(math.sqrt(60 / DAY), rel=0.01)


@pytest.mark.parametrize("stall,mtbf", [(30, DAY), (5, 3600), (600, 7 * DAY), (0.2, 600)])
def test_waste_is_least_near_young_on_a_grid(stall, mtbf):
    grid = [10 ** (i / 400) for i in range(-800, 3201)]       # 0.01 s .. 1e8 s, 0.6 % apart
    best = min(grid, key=lambda tau: waste_fraction(tau, stall, mtbf))
    assert best == pytest.approx(young_interval(stall, mtbf), rel=0.01)
    # and a restart time shifts the waste, not the optimum
    best_r = min(grid, key=lambda tau: waste_fraction(tau, stall, mtbf, restart_s=120))
    assert best_r == best


# ---- what a crash costs --------------------------------------------------------------------------

def test_steps_lost_by_hand():
    assert expected_steps_lost(100) == 50 and worst_steps_lost(100) == 100
    assert expected_steps_lost(100, 10) == 60 and worst_steps_lost(100, 10) == 110
    assert expected_steps_lost(1) == 0.5


@pytest.mark.parametrize("interval,lag", [(100, 0), (100, 30), (40, 90), (7, 7)])
def test_steps_lost_match_a_simulated_crash(interval, lag):
    """Checkpoints taken at steps 0, k, 2k, ..., each durable l steps later; a crash at time t
    restarts from the newest durable one. Sweep t over many periods, finely."""
    start, periods, per = 10 * (interval + lag), 20, 200
    lost = []
    for i in range(periods * per):
        t = start + i * interval / per
        durable = max(c for c in range(0, math.ceil(t) + 1, interval) if c + lag <= t)
        lost.append(t - durable)
    assert sum(lost) / len(lost) == pytest.approx(expected_steps_lost(interval, lag), rel=0.01)
    assert max(lost) == pytest.approx(worst_steps_lost(interval, lag), rel=0.01)
    assert max(lost) <= worst_steps_lost(interval, lag)


@pytest.mark.parametrize("call", [
    lambda: young_interval(30, 0), lambda: young_interval(-1, DAY), lambda: daly_interval(0, DAY),
    lambda: waste_fraction(0, 30, DAY), lambda: waste_fraction(100, 30, DAY, restart_s=-1),
    lambda: expected_steps_lost(0), lambda: worst_steps_lost(10, -1),
    lambda: checkpoint_bytes(1000, precision="fp8"), lambda: checkpoint_bytes(1000, stage=4),
    lambda: checkpoint_bytes(1000, ranks=0), lambda: checkpoint_bytes(1000, model=PRESETS["tiny"]),
])
def test_bad_input_is_a_user_error(call):
    with pytest.raises(UserError):
        call()


# ---- bytes: the formula against what DeepSpeed wrote ------------------------------------------------

# Measured: DeepSpeed 0.19.8, torch 2.13 (CPU), plscale's Llama, AdamW (torch_adam), after one step,
# `engine.save_checkpoint(dir, tag="t")` on CPU ranks over gloo (torchrun --nproc_per_node N, a throwaway
# script: build(DSSpec(stage, precision, micro_batch=2, world_size=N, bucket_size=500_000))). Bytes of
# each file in dir/t. tiny and small fitted the metadata constants; deep and 3-4 ranks check them.
MEASURED = {
    ("tiny", "fp32", 0, 2): {"mp_rank_00_model_states.pt": 8291859},
    ("tiny", "fp32", 1, 2): {"mp_rank_00_model_states.pt": 2762009, "zero_pp_rank_0_mp_rank_00_optim_states.pt": 4137299,
                             "zero_pp_rank_1_mp_rank_00_optim_states.pt": 4137555},
    ("tiny", "fp32", 2, 2): {"mp_rank_00_model_states.pt": 2762073, "zero_pp_rank_0_mp_rank_00_optim_states.pt": 4137299,
                             "zero_pp_rank_1_mp_rank_00_optim_states.pt": 4137555},
    ("tiny", "fp32", 3, 2): {"zero_pp_rank_0_mp_rank_00_model_states.pt": 11341,
                             "zero_pp_rank_0_mp_rank_00_optim_states.pt": 4136659,
                             "zero_pp_rank_1_mp_rank_00_model_states.pt": 11277,
                             "zero_pp_rank_1_mp_rank_00_optim_states.pt": 4136659},
    ("tiny", "bf16", 0, 2): {"mp_rank_00_model_states.pt": 9675287},
    ("tiny", "bf16", 1, 2): {"bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt": 4137349,
                             "bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt": 4137669, "mp_rank_00_model_states.pt": 1384537},
    ("tiny", "bf16", 2, 2): {"bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt": 4137349,
                             "bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt": 4137669, "mp_rank_00_model_states.pt": 1384537},
    ("tiny", "bf16", 3, 2): {"bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt": 4136709,
                             "bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt": 4136709,
                             "zero_pp_rank_0_mp_rank_00_model_states.pt": 11341,
                             "zero_pp_rank_1_mp_rank_00_model_states.pt": 11277},
    ("small", "fp32", 0, 2): {"mp_rank_00_model_states.pt": 63778223},
    ("small", "fp32", 1, 2): {"mp_rank_00_model_states.pt": 21254489, "zero_pp_rank_0_mp_rank_00_optim_states.pt": 31869075,
                              "zero_pp_rank_1_mp_rank_00_optim_states.pt": 31870419},
    ("small", "fp32", 2, 2): {"mp_rank_00_model_states.pt": 21254489, "zero_pp_rank_0_mp_rank_00_optim_states.pt": 31869075,
                              "zero_pp_rank_1_mp_rank_00_optim_states.pt": 31870419},
    ("small", "fp32", 3, 2): {"zero_pp_rank_0_mp_rank_00_model_states.pt": 19845,
                              "zero_pp_rank_0_mp_rank_00_optim_states.pt": 31868371,
                              "zero_pp_rank_1_mp_rank_00_model_states.pt": 19781,
                              "zero_pp_rank_1_mp_rank_00_optim_states.pt": 31868371},
    ("small", "bf16", 0, 2): {"mp_rank_00_model_states.pt": 74411203},
    ("small", "bf16", 1, 2): {"bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt": 31869189,
                              "bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt": 31870533,
                              "mp_rank_00_model_states.pt": 10633049},
    ("small", "bf16", 2, 2): {"bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt": 31869189,
                              "bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt": 31870533,
                              "mp_rank_00_model_states.pt": 10633113},
    ("small", "bf16", 3, 2): {"bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt": 31868421,
                              "bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt": 31868421,
                              "zero_pp_rank_0_mp_rank_00_model_states.pt": 19845,
                              "zero_pp_rank_1_mp_rank_00_model_states.pt": 19781},
    # out of sample: a deeper model, 3 and 4 ranks (padding to 2N at stages 1-2, per tensor at stage 3)
    ("deep", "fp32", 0, 2): {"mp_rank_00_model_states.pt": 83508687},
    ("deep", "fp32", 2, 2): {"mp_rank_00_model_states.pt": 27825113, "zero_pp_rank_0_mp_rank_00_optim_states.pt": 41713555,
                             "zero_pp_rank_1_mp_rank_00_optim_states.pt": 41713747},
    ("deep", "fp32", 3, 2): {"zero_pp_rank_0_mp_rank_00_model_states.pt": 36469,
                             "zero_pp_rank_0_mp_rank_00_optim_states.pt": 41711059,
                             "zero_pp_rank_1_mp_rank_00_model_states.pt": 36469,
                             "zero_pp_rank_1_mp_rank_00_optim_states.pt": 41711059},
    ("tiny", "bf16", 1, 3): {"bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt": 2759301,
                             "bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt": 2759877,
                             "bf16_zero_pp_rank_2_mp_rank_00_optim_states.pt": 2759941, "mp_rank_00_model_states.pt": 1384537},
    ("tiny", "bf16", 3, 3): {"bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt": 2759301,
                             "bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt": 2759301,
                             "bf16_zero_pp_rank_2_mp_rank_00_optim_states.pt": 2759301,
                             "zero_pp_rank_0_mp_rank_00_model_states.pt": 11341,
                             "zero_pp_rank_1_mp_rank_00_model_states.pt": 11277,
                             "zero_pp_rank_2_mp_rank_00_model_states.pt": 11277},
    ("small", "fp32", 2, 4): {"mp_rank_00_model_states.pt": 21254489, "zero_pp_rank_0_mp_rank_00_optim_states.pt": 15936403,
                              "zero_pp_rank_1_mp_rank_00_optim_states.pt": 15936915,
                              "zero_pp_rank_2_mp_rank_00_optim_states.pt": 15937491,
                              "zero_pp_rank_3_mp_rank_00_optim_states.pt": 15937171},
    ("small", "fp32", 3, 4): {**{f"zero_pp_rank_{r}_mp_rank_00_model_states.pt": 19781 for r in range(1, 4)},
                              **{f"zero_pp_rank_{r}_mp_rank_00_optim_states.pt": 15936211 for r in range(4)},
                              "zero_pp_rank_0_mp_rank_00_model_states.pt": 19845},
}


@pytest.mark.parametrize("key", list(MEASURED), ids=lambda k: "-".join(map(str, k)))
def test_checkpoint_bytes_match_what_deepspeed_wrote(key):
    name, precision, stage, ranks = key
    config = PRESETS[name]
    predicted = checkpoint_bytes(param_count(config), stage, ranks, precision, config)
    measured = MEASURED[key]
    assert predicted.by_name().keys() == measured.keys()          # the same files, by DeepSpeed's names
    for file, nbytes in measured.items():
        assert predicted.by_name()[file] == pytest.approx(nbytes, rel=0.02), file
    assert predicted.total == pytest.approx(sum(measured.values()), rel=0.001)
    rank0 = sum(v for k, v in measured.items() if "zero_pp_rank" not in k or "rank_0_" in k)
    assert predicted.per_rank == pytest.approx(rank0, rel=0.001)


def test_checkpoint_bytes_at_scale_are_the_payload():
    """7b: metadata vanishes; Ψ = 6,738,415,616, N = 8, p = 2 (bf16)."""
    psi, c = param_count(PRESETS["7b"]), PRESETS["7b"]
    assert checkpoint_bytes(psi, 0, 8, "fp32", c).total == pytest.approx(12 * psi, rel=1e-4)
    assert checkpoint_bytes(psi, 0, 8, "bf16", c).total == pytest.approx(14 * psi, rel=1e-4)
    s2 = checkpoint_bytes(psi, 2, 8, "bf16", c)
    assert s2.total == pytest.approx(14 * psi, rel=1e-4)
    assert s2.per_rank == pytest.approx(2 * psi + 12 * psi / 8, rel=1e-4)  # rank 0 also writes the weights
    s3 = checkpoint_bytes(psi, 3, 8, "bf16", c)
    assert s3.total == pytest.approx(12 * psi, rel=1e-4) and s3.per_rank == pytest.approx(12 * psi / 8, rel=1e-4)
    # without a shape the same to within the metadata and padding
    assert checkpoint_bytes(psi, 3, 8, "bf16").total == pytest.approx(s3.total, rel=1e-4)


def test_tensor_sizes_add_up_to_the_parameter_count():
    for name, config in PRESETS.items():
        assert sum(tensor_sizes(config)) == param_count(config), name
    assert len(tensor_sizes(PRESETS["tiny"])) == 9 * 2 + 2 and len(tensor_sizes(PRESETS["7b"])) == 9 * 32 + 3


# ---- the chart -------------------------------------------------------------------------------------

def test_interval_chart_writes_a_png(tmp_path):
    path = tmp_path / "interval.png"
    interval_chart([("sync", 30.0, 2.0), ("async", 3.0, 2.0), ("ZeRO-3 local", 0.5, 1.0)], DAY, path,
                   title="three strategies", restart_s=60)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 10_000


def test_job_mtbf_scales_inversely_with_gpus_from_an_observed_rate():
    from plscale.predict.checkpoint import job_mtbf_hours
    from plscale.predict.published import LLAMA3_DAYS, LLAMA3_GPUS, LLAMA3_INTERRUPTIONS

    at_llama3 = job_mtbf_hours(LLAMA3_GPUS, LLAMA3_INTERRUPTIONS, LLAMA3_DAYS, LLAMA3_GPUS)
    assert at_llama3 == pytest.approx(54 * 24 / 419)  # one interruption about every 3.1 h, as the paper reports
    assert job_mtbf_hours(LLAMA3_GPUS // 2, LLAMA3_INTERRUPTIONS, LLAMA3_DAYS, LLAMA3_GPUS) == pytest.approx(2 * at_llama3)
