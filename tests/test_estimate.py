"""The memory model against the ZeRO paper and DeepSpeed's own estimators; `plscale estimate memory`."""

import contextlib
import io
import json
import re

import pytest
import torch

from conftest import run_cli
from plscale.errors import UserError
from plscale.predict.memory import LABELS, MODEL_STATES, Setup, estimate
from plscale.predict.presets import PRESETS, largest_layer_params, param_count, parse_count
from plscale.predict.zero_partitions import held_elements, tensor_sizes
from plscale.rank.census import saved_activations
from plscale.rank.models.llama import Llama


def states(**kw) -> float:
    return estimate(Setup(**kw)).model_states


# ---- presets: exact parameter counts ---------------------------------------------------

def test_param_count_matches_the_built_model():
    for name in ("tiny", "small", "124m"):
        with torch.device("meta"):
            model = Llama(PRESETS[name])
        assert param_count(PRESETS[name]) == sum(p.numel() for p in model.parameters()), name


def test_presets_reproduce_published_llama_sizes():
    assert param_count(PRESETS["7b"]) == 6_738_415_616      # Llama-2-7B
    assert param_count(PRESETS["1b"]) == 1_235_814_400      # Llama-3.2-1B
    assert 123e6 < param_count(PRESETS["124m"]) < 125e6
    assert parse_count("7b") == 7_000_000_000 and parse_count("350M") == 350_000_000
    assert parse_count("1.3e9") == 1_300_000_000
    with pytest.raises(UserError):
        parse_count("seven")


# ---- the ZeRO paper ----------------------------------------------------------------------

def test_zero_paper_figure_1():
    """Ψ = 7.5B, N = 64, K = 12, mixed precision: 120 GB, 31.4 GB, 16.6 GB, 1.9 GB per GPU.
    The paper's ZeRO-1 holds the full gradients: DeepSpeed does while micro-batches accumulate."""
    psi, n = 7.5e9, 64
    got = [states(params=psi, stage=s, dp=n, precision="fp16", grad_accum=4) / 1e9 for s in range(4)]
    assert got == pytest.approx([120, 31.4, 16.6, 1.875], abs=0.06)
    assert got[0] == (2 + 2 + 12) * psi / 1e9
    assert got[1] == pytest.approx((2 * psi + 2 * psi + 12 * psi / n) / 1e9)
    assert got[2] == pytest.approx((2 * psi + (2 + 12) * psi / n) / 1e9)
    assert got[3] == pytest.approx((2 + 2 + 12) * psi / n / 1e9)


def test_fp32_matches_what_deepspeed_keeps():
    """fp32: no master copy at stage 0 (16Ψ), DeepSpeed's own master copy from stage 1 (K = 12)."""
    psi, n = 20_000_000, 2
    assert [states(params=psi, stage=s, dp=n, precision="fp32", grad_accum=2) for s in range(4)] == [
        16 * psi, 8 * psi + 12 * psi / n, 4 * psi + 16 * psi / n, 20 * psi / n]


def test_zero2_fp32_states_are_what_a_real_run_held():
    """labs/04_zero/reference.json (run 20261124-055238-zero-zero2: preset small, ZeRO-2, fp32, 2 ranks,
    2 micro-batches a step), MiB per rank from the census of DeepSpeed's own tensors: parameters
    20.259, fp32 master 10.129, Adam moments 20.259; gradients 10.569, of which the model leaves
    out 0.44 MiB (within the lab's 5 % tolerance)."""
    e = estimate(Setup(params=param_count(PRESETS["small"]), stage=2, dp=2, precision="fp32", grad_accum=2))
    got = {t.name: t.device / 2**20 for t in e.terms if t.name in MODEL_STATES}
    assert got["parameters"] == pytest.approx(20.259, abs=0.0005)
    assert got["master"] == pytest.approx(10.129, abs=0.0005)
    assert got["moments"] == pytest.approx(20.259, abs=0.0005)
    assert 0.4 <= 10.569 - got["gradients"] <= 0.5


def grads(**kw) -> tuple[float, float]:
    t = estimate(Setup(params=1000, dp=4, **kw)).term("gradients")
    return t.device, t.host


def test_zero1_with_one_micro_batch_holds_partitioned_gradients():
    """Rule 2: DeepSpeed's ZeRO-1 reduces in backward at the accumulation boundary."""
    assert grads(stage=1, precision="fp32", grad_accum=1) == (4 * 1000 / 4, 0)
    assert grads(stage=1, precision="fp32", grad_accum=3) == (4 * 1000, 0)
    assert grads(stage=1, precision="bf16", grad_accum=1) == (2 * 1000 / 4, 0)
    # accumulation changes nothing at the other stages
    for stage in (0, 2, 3):
        assert grads(stage=stage, grad_accum=1) == grads(stage=stage, grad_accum=8)


def test_offloaded_gradients_are_an_fp32_partition_plus_where_micro_batches_accumulate():
    """Rule 3, Ψ = 1000, N = 4: fp32 partition 4Ψ/N = 1000 bytes on the host; p = 2 (bf16)."""
    off = dict(precision="bf16", offload_optimizer=True)
    assert grads(stage=1, grad_accum=1, **off) == (0, 1000)           # straight into the fp32 partition
    assert grads(stage=1, grad_accum=2, **off) == (2000, 1000)        # accumulate in the full 2Ψ on the device
    assert grads(stage=2, grad_accum=1, **off) == (0, 1000)
    assert grads(stage=2, grad_accum=2, **off) == (0, 1000 + 500)     # + 2Ψ/N accumulation partition
    assert grads(stage=3, grad_accum=1, **off) == (0, 1000 + 500)     # ZeRO-3's flat buffer, always
    assert grads(stage=3, grad_accum=2, offload_param=True, **off) == (0, 1000 + 500)


def test_offload_moves_states_to_the_host():
    # bf16, N = 4: parameters 2Ψ/N, gradients (4 + 2)Ψ/N, master 4Ψ/N, moments 8Ψ/N
    e = estimate(Setup(params=1e9, stage=3, dp=4, offload_optimizer=True, offload_param=True))
    assert e.total("device") == 0
    assert e.total("host") == pytest.approx(20e9 / 4)
    # stage 2, one micro-batch per step: parameters 2Ψ on the device; 4Ψ/N gradients, 12Ψ/N on the host
    e = estimate(Setup(params=1e9, stage=2, dp=4, offload_optimizer=True))
    assert e.total("device") == 2e9 and e.total("host") == pytest.approx(16e9 / 4)


def test_tensor_and_pipeline_parallel_divide_the_parameters():
    a = states(params=8e9, stage=1, dp=2, tp=2, pp=2)
    assert a == states(params=2e9, stage=1, dp=2)


# ---- DeepSpeed's estimators, same inputs ---------------------------------------------------

def _deepspeed_printed(fn, model, gpus) -> dict:
    """Run one of DeepSpeed's *_all_live estimators; {options: per-GPU GB} from its table."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        fn(model, num_gpus_per_node=gpus, num_nodes=1)
    rows = re.findall(r"^\s*[\d.]+GB \|\s*([\d.]+)GB \| (.+)$", out.getvalue(), re.M)
    return {options.replace("OffloadDeviceEnum.", "").strip(): float(gb) for gb, options in rows}


def test_deepspeed_estimators_agree():
    from deepspeed.runtime.zero.stage3 import (estimate_zero3_model_states_mem_needs,
                                               estimate_zero3_model_states_mem_needs_all_live, model_to_params)
    from deepspeed.runtime.zero.stage_1_and_2 import model_to_params as zero2_params
    from deepspeed.runtime.zero.stage_1_and_2 import (estimate_zero2_model_states_mem_needs,
                                                      estimate_zero2_model_states_mem_needs_all_live)

    config, gpus = PRESETS["124m"], 4
    model = Llama(config)
    total, largest = model_to_params(model)
    assert (total, largest) == (param_count(config), largest_layer_params(config))
    assert zero2_params(model) == total

    def ours(stage, offload_optimizer=False, offload_param=False):
        return estimate(Setup(params=total, stage=stage, dp=gpus, offload_optimizer=offload_optimizer,
                              offload_param=offload_param, largest_layer=largest,
                              accounting="deepspeed")).total("device")

    # exact bytes against the functions the estimators call
    for offload in (False, True):
        _, gpu = estimate_zero2_model_states_mem_needs(total, gpus, 1, cpu_offload=offload)
        assert ours(2, offload) == pytest.approx(gpu, abs=1)
    for offload, offload_param in ((False, False), (True, False), (True, True)):
        _, gpu, _ = estimate_zero3_model_states_mem_needs(total, largest, gpus, 1, cpu_offload=offload,
                                                          cpu_offload_params=offload_param)
        assert ours(3, offload, offload_param) == pytest.approx(gpu, abs=1)

    # and the tables that the *_all_live estimators print for the real model
    printed = _deepspeed_printed(estimate_zero2_model_states_mem_needs_all_live, model, gpus)
    assert printed["offload_optimizer=none"] == round(ours(2) / 2**30, 2)
    assert printed["offload_optimizer=cpu"] == round(ours(2, True) / 2**30, 2)
    printed = _deepspeed_printed(estimate_zero3_model_states_mem_needs_all_live, model, gpus)
    assert printed["offload_param=none, offload_optimizer=none, zero_init=1"] == round(ours(3) / 2**30, 2)
    assert printed["offload_param=cpu, offload_optimizer=cpu, zero_init=1"] == round(ours(3, True, True) / 2**30, 2)


# ---- activations: the formula against autograd's saved tensors ------------------------------

@pytest.mark.parametrize("batch,seq", [(2, 32), (3, 64)])
def test_activation_formula_counts_what_autograd_saves(batch, seq):
    config = PRESETS["tiny"]
    torch.manual_seed(0)
    model = Llama(config)
    tokens = torch.randint(0, config.vocab, (batch, seq + 1))
    with saved_activations() as acts:
        model(tokens[:, :-1], tokens[:, 1:])
    predicted = estimate(Setup(params=param_count(config), precision="fp32", model=config, seq=seq,
                               micro_batch=batch)).term("activations").device
    # the formula leaves out the token ids, the targets and RoPE's tables (a few KiB)
    assert predicted <= acts.bytes <= predicted * 1.01 + 16_384


# ---- the CLI -------------------------------------------------------------------------------

def test_cli_table_and_help_name_the_formulas():
    out = run_cli("estimate", "memory", "--model", "7b", "--stage", "3", "--gpus", "8")
    assert out.returncode == 0, out.stderr
    for word in ("parameters", "gradients", "optimizer: fp32 master", "optimizer: Adam moments", "activations", "2Ψ/N"):
        assert word in out.stdout
    # 7b, bf16, stage 3, N = 8: (2 + 2 + 12) * 6.74e9 / 8 bytes = 12.55 GiB of model states
    expected = 16 * 6_738_415_616 / 8 / 2**30
    states_gib = sum(float(re.search(rf"{re.escape(LABELS[n])}\s*│\s*([\d.]+)", out.stdout).group(1))
                     for n in MODEL_STATES)
    assert states_gib == pytest.approx(expected, abs=0.02)
    help_text = run_cli("estimate", "memory", "--help").stdout
    assert "stage 2: pΨ + (p+K)Ψ/N" in help_text and "K = 12" in help_text


@pytest.mark.parametrize("args,message", [
    (["--stage", "4"], "ZeRO stage 4 does not exist"),
    (["--stage", "1", "--offload-param"], "Parameter offload needs ZeRO stage 3"),
    (["--stage", "0", "--offload-optimizer"], "Optimizer offload needs ZeRO stage"),
    (["--model", "7b", "--stage", "0", "--gpus", "8", "--budget", "80"], "over the budget of 80 GiB"),
    (["--gpus", "8", "--micro-batch", "2", "--global-batch", "10"], "--global-batch 10 != micro batch 2"),
    (["--gpus", "6", "--tp", "4"], "not a multiple of tp 4"),
    (["--model", "twelve"], "neither a model preset"),
    (["--model", "7e9", "--vocab", "1000"], "--vocab changes a preset's shape"),
    (["--model", "tiny", "--vocab", "0"], "--vocab 0"),
    (["--grad-accum", "0"], "--grad-accum must be at least 1"),
])
def test_cli_bad_input_is_one_line_exit_2(quick_cli, args, message):
    out = quick_cli("estimate", "memory", *args)
    assert out.returncode == 2
    assert message in out.stderr and len(out.stderr.strip().splitlines()) == 1, out.stderr


def test_budget_that_fits_says_so():
    out = run_cli("estimate", "memory", "--model", "1b", "--stage", "3", "--gpus", "8", "--budget", "80")
    assert out.returncode == 0 and "fits:" in out.stdout


def test_cli_json_is_the_model_term_by_term():
    out = run_cli("estimate", "memory", "--model", "small", "--vocab", "5000", "--stage", "2", "--gpus", "4",
                  "--precision", "fp32", "--seq", "64", "--micro-batch", "2", "--grad-accum", "3",
                  "--offload-optimizer", "--json")
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)
    config = PRESETS["small"].with_vocab(5000)
    psi = param_count(config)
    assert got["setup"]["params"] == psi and got["setup"]["model"]["vocab"] == 5000
    assert (got["setup"]["grad_accum"], got["setup"]["micro_batch"], got["setup"]["dp"]) == (3, 2, 4)
    # fp32, stage 2, N = 4, optimizer offloaded, accumulating: 4Ψ; (4 + 4)Ψ/N, 4Ψ/N, 8Ψ/N on the host, the
    # accumulating 4Ψ/N of gradients as the whole tensors of each rank's partition (DeepSpeed's get_partition_info:
    # tests/test_zero_partitions.py), the largest rank's
    by_rank = [4 * psi / 4 + 4 * h for h in held_elements(tensor_sizes(config), 4)]
    assert got["terms"]["gradients"]["by_rank"] == by_rank and max(by_rank) > 8 * psi / 4
    expected = {"parameters": (4 * psi, 0), "gradients": (0, max(by_rank)), "master": (0, 4 * psi / 4),
                "moments": (0, 8 * psi / 4)}
    for name, (device, host) in expected.items():
        term = got["terms"][name]
        assert (term["device"], term["host"], term["label"]) == (pytest.approx(device), pytest.approx(host),
                                                                 LABELS[name]), name
    assert got["terms"]["activations"]["device"] > 0
    assert got["totals"]["model_states"] == pytest.approx(4 * psi + 12 * psi / 4 + max(by_rank))
    assert got["totals"]["host"] == pytest.approx(12 * psi / 4 + max(by_rank))


# ---- `plscale estimate checkpoint` ------------------------------------------------------------

def _young_line(stdout: str) -> tuple[float, float, float, float, float]:
    """(seconds, steps, waste %, steps lost on average, at worst) from the Young line."""
    m = re.search(r"Young sqrt\(2δM\)\s+every ([\d,.]+) s .*?= ([\d,]+) steps: waste ([\d.]+) %, steps lost "
                  r"on a crash ([\d,]+) on average, ([\d,]+) at worst", stdout)
    assert m, stdout
    return tuple(float(g.replace(",", "")) for g in m.groups())


def test_cli_checkpoint_young_interval_by_hand():
    out = run_cli("estimate", "checkpoint", "--model", "tiny", "--stage", "2", "--ranks", "2", "--precision", "fp32",
                  "--stall-s", "30", "--mtbf-hours", "24", "--step-s", "2", "--lag-steps", "10")
    assert out.returncode == 0, out.stderr
    # sqrt(2 * 30 s * 86400 s) = 2277 s = 1138 steps of 2 s; waste 30/2277 + 2307/172800 = 2.65 %
    seconds, steps, waste, lost, worst = _young_line(out.stdout)
    assert (seconds, steps, waste) == (2277, 1138, 2.65)
    assert (lost, worst) == (round(1138.42 / 2 + 10), round(1138.42 + 10))
    assert re.search(r"Daly\s+every 2,257 s", out.stdout)
    # the files of tiny, ZeRO-2, fp32, 2 ranks: 4Ψ weights (2.76 MB) and 12Ψ/2 per rank (4.14 MB)
    for text in ("mp_rank_00_model_states.pt", "zero_pp_rank_r_mp_rank_00_optim_states.pt", "2.76 MB", "4.14 MB",
                 "6.9 MB", "11 MB", "(measured)"):
        assert text in out.stdout, text


def test_cli_checkpoint_stall_from_bytes_and_bandwidth(tmp_path):
    """No --stall-s: δ = bytes rank 0 writes / --write-gbps. 7b, ZeRO-3 bf16, 8 ranks: 12Ψ/8 = 10.1 GB."""
    png = tmp_path / "interval.png"
    out = run_cli("estimate", "checkpoint", "--model", "7b", "--stage", "3", "--ranks", "8", "--write-gbps", "2",
                  "--png", png)
    assert out.returncode == 0, out.stderr
    stall = 12 * param_count(PRESETS["7b"]) / 8 / 2e9
    assert f"δ = {stall:.3g} s" in out.stdout and "10.1 GB / 2 GB/s" in out.stdout
    seconds, *_ = _young_line(out.stdout)
    assert seconds == pytest.approx((2 * stall * 86_400) ** 0.5, abs=1)
    assert png.read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize("args,message", [
    (["--mtbf-hours", "0"], "--mtbf-hours 0: it must be positive"),
    (["--step-s", "-1"], "--step-s -1: it must be positive"),
    (["--write-gbps", "0"], "--write-gbps 0"),
    (["--stall-s", "-5"], "--stall-s -5"),
    (["--precision", "fp8"], "--precision 'fp8'"),
    (["--stage", "4"], "ZeRO stage 4 does not exist"),
    (["--ranks", "0"], "--ranks 0"),
    (["--lag-steps", "-1"], "cannot be negative"),
    (["--model", "twelve"], "neither a model preset"),
])
def test_cli_checkpoint_bad_input_is_one_line_exit_2(quick_cli, args, message):
    out = quick_cli("estimate", "checkpoint", *args)
    assert out.returncode == 2, out.stdout
    assert message in out.stderr and len(out.stderr.strip().splitlines()) == 1, out.stderr


def test_estimate_takes_the_published_shapes_plan_takes(quick_cli):
    """Llama 3 70B as `plscale plan` knows it: 70,553,706,496 parameters, as transformers counts
    meta-llama/Meta-Llama-3-70B."""
    out = quick_cli("estimate", "memory", "--model", "llama3-70b", "--gpus", "64", "--tp", "8", "--stage", "1",
                    "--json")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["setup"]["params"] == 70_553_706_496
    saved = quick_cli("estimate", "checkpoint", "--model", "llama3-70b", "--ranks", "64")
    assert saved.returncode == 0 and "70.6B parameters" in saved.stdout, saved.stderr
