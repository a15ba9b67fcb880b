"""Recomputation and precision predictions: the activations each strategy keeps against the
allocator's history of a real forward, the FLOPs it costs, `plscale estimate memory --recompute`
and `plscale estimate precision` against torch.finfo."""

import gc
import json
from dataclasses import replace

import pytest
import torch
from torch.profiler import ProfilerActivity, profile, record_function
from torch.utils.checkpoint import checkpoint

from conftest import run_cli
from plscale.errors import UserError
from plscale.predict import recompute as rc
from plscale.predict.activations import (activation_bytes, head_activation_bytes, layer_activation_bytes,
                                         layer_input_bytes, layer_kept_bytes, layer_parts, rebuilt_bytes)
from plscale.predict.formats import FORMATS
from plscale.predict.memory import Setup, estimate
from plscale.predict.presets import PRESETS, flops_per_token, layer_params
from plscale.rank.models.llama import Llama

TINY = PRESETS["tiny"]                      # h 128, a 4, L 2, f 384, V 2048
TINY_GQA = replace(TINY, kv_heads=2)        # h_kv 64: the math core repeats k and v to every head
SEQ, BATCH = 32, 2
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


# ---- activations kept at the end of the forward, measured ----------------------------------------

def with_recomputation(model: Llama, strategy: str) -> Llama:
    """torch.utils.checkpoint around each layer (full) or each attention core (selective). No RNG
    state is kept (no dropout here): by default each checkpoint also holds the CPU generator's 5 KB."""
    for layer in model.layers:
        if strategy == "full":
            layer.forward = lambda x, cos, sin, f=layer.forward: checkpoint(
                f, x, cos, sin, use_reentrant=False, preserve_rng_state=False)
        elif strategy == "selective":
            layer.self_attn.attend = lambda q, k, v, f=layer.self_attn.attend: checkpoint(
                f, q, k, v, use_reentrant=False, preserve_rng_state=False)
    return model


def forward_kept_bytes(model: Llama, tokens: torch.Tensor) -> int:
    """Bytes allocated during the forward and still held at its end (the allocator's history:
    torch.utils.checkpoint keeps its inputs where no saved-tensors hook sees them)."""
    gc.collect()  # a previous model's reference cycles must not be freed inside the forward
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        with record_function("phase:forward"):
            loss = model(tokens[:, :-1], tokens[:, 1:])
        loss.backward()
    events = prof.profiler.kineto_results.events()
    start, end = next((e.start_ns(), e.end_ns()) for e in events if e.name() == "phase:forward")
    return sum(e.nbytes() for e in events if e.name() == "[memory]" and start <= e.start_ns() <= end)


CASES = [(TINY, core, strategy, precision) for precision in DTYPES for core in ("fused", "math")
         for strategy in ("none", "selective", "full")]
CASES += [(TINY_GQA, core, strategy, "fp32") for core in ("fused", "math") for strategy in ("none", "selective", "full")]


@pytest.mark.parametrize("config,core,strategy,precision", CASES,
                         ids=[f"{'gqa-' if c.kv_heads < c.heads else ''}{a}-{s}-{p}" for c, a, s, p in CASES])
def test_kept_activations_match_the_allocator_to_the_rope_tables(config, core, strategy, precision):
    """Measured minus predicted is the same few KiB for every strategy: RoPE's cos and sin
    (s x d/2 fp32 each), the targets' copy and the loss; every activation byte is predicted."""
    config = replace(config, attention=core)
    torch.manual_seed(0)
    model = with_recomputation(Llama(config).to(DTYPES[precision]), strategy)
    tokens = torch.randint(0, config.vocab, (BATCH, SEQ + 1))
    measured = forward_kept_bytes(model, tokens)
    predicted = activation_bytes(Setup(params=1, model=config, seq=SEQ, micro_batch=BATCH, precision=precision,
                                       recompute=strategy))
    rope, targets = 2 * SEQ * config.head_dim // 2 * 4, BATCH * SEQ * 8
    assert rope + targets <= measured - predicted <= rope + targets + 32
    assert measured - predicted < 0.01 * predicted


def test_parts_of_a_layer_and_what_each_strategy_keeps():
    s = Setup(params=1, model=replace(TINY, attention="math"), seq=SEQ, micro_batch=BATCH, precision="bf16")
    parts, sb, h, e = layer_parts(s), BATCH * SEQ, TINY.hidden, 2
    assert sum(parts.values()) == layer_activation_bytes(s)
    assert parts["norms"] == 2 * sb * ((2 * h + 1) * 4 + h * e)      # fp32 inside the norm whatever p is
    assert parts["core"] == sb * TINY.heads * SEQ * e                # the probabilities (no GQA)
    assert layer_kept_bytes(replace(s, recompute="selective")) == layer_activation_bytes(s) - parts["core"]
    assert layer_kept_bytes(replace(s, recompute="full")) == layer_input_bytes(s) == sb * h * e
    assert layer_kept_bytes(replace(s, recompute="full"), recomputed=False) == layer_activation_bytes(s)
    assert rebuilt_bytes(s) == 0
    assert rebuilt_bytes(replace(s, recompute="selective")) == parts["core"]
    assert rebuilt_bytes(replace(s, recompute="full")) == layer_activation_bytes(s)


def test_strategies_order_and_the_peak_adds_what_backward_rebuilds():
    """7b's shape, math core, seq 4096: the probabilities (a x s a token) dwarf the rest."""
    base = Setup(params=1, model=replace(PRESETS["7b"], attention="math"), seq=4096)
    kept = {r: activation_bytes(replace(base, recompute=r)) for r in ("none", "selective", "full")}
    assert kept["full"] < kept["selective"] < kept["none"]
    assert kept["selective"] < kept["none"] / 2                       # the probabilities are most of it
    for r in kept:
        s = replace(base, recompute=r)
        assert estimate(s).term("activations").device == kept[r] + rebuilt_bytes(s)


def test_recompute_layers_interpolates_between_none_and_all():
    base = Setup(params=1, model=PRESETS["small"], seq=128, micro_batch=2)
    none, L = activation_bytes(base), PRESETS["small"].layers
    for strategy in ("selective", "full"):
        every = activation_bytes(replace(base, recompute=strategy))
        saved = (none - every) / L
        for k in range(1, L + 1):
            assert activation_bytes(replace(base, recompute=strategy, recompute_layers=k)) == none - k * saved
        assert activation_bytes(replace(base, recompute=strategy, recompute_layers=L)) == every
    # a pipeline stage of 2 layers recomputes its first k of them
    stage = replace(base, recompute="full", recompute_layers=1)
    assert activation_bytes(stage, layers=2, head=False) == layer_input_bytes(stage) + layer_activation_bytes(stage)
    assert activation_bytes(stage, layers=0) == head_activation_bytes(stage)


@pytest.mark.parametrize("change,message", [
    (dict(recompute="fulll"), "recompute 'fulll': use none, selective, full. Did you mean: full?"),
    (dict(recompute=True), "recompute True: use none, selective, full."),
    (dict(recompute="full", recompute_layers=9), "recompute_layers 9: the model has 4 layers"),
    (dict(recompute_layers=2), "recompute_layers 2 with recompute none"),
    (dict(model=replace(PRESETS["small"], attention="flash")), "attention 'flash': use fused"),
])
def test_setup_rejects_bad_recomputation(change, message):
    with pytest.raises(UserError) as info:
        estimate(replace(Setup(params=1, model=PRESETS["small"]), **change))
    assert message in str(info.value)


# ---- FLOPs ---------------------------------------------------------------------------------------

def test_step_flops_split_and_time_ratio_by_hand():
    c, s = TINY, 64
    layer = 2 * (layer_params(c) - 2 * c.hidden) + 4 * s * c.hidden     # one layer's forward per token
    forward = c.layers * layer + 2 * c.vocab * c.hidden
    plain = rc.step_flops(c, s)
    assert (plain.forward, plain.backward, plain.recompute) == (forward, 2 * forward, 0)
    assert plain.step == flops_per_token(c, s)
    assert rc.time_ratio(c, s, "full") == (3 * forward + c.layers * layer) / (3 * forward)
    assert rc.time_ratio(c, s, "selective") == (3 * forward + c.layers * 4 * s * c.hidden) / (3 * forward)
    assert rc.time_ratio(c, s, "full", layers=1) - 1 == pytest.approx((rc.time_ratio(c, s, "full") - 1) / 2)
    assert rc.time_ratio(c, s, "none") == 1.0
    assert rc.time_ratio(PRESETS["7b"], 4096, "full") == pytest.approx(1.33, abs=0.005)
    assert 1 < rc.time_ratio(PRESETS["7b"], 4096, "selective") < 1.05
    with pytest.raises(UserError, match="recompute_layers 3: the model has 2 layers"):
        rc.time_ratio(c, s, "full", layers=3)


# ---- the CLI -------------------------------------------------------------------------------------

@pytest.mark.parametrize("args,message", [
    (["--recompute", "fulll"], "--recompute 'fulll': use none, selective, full. Did you mean: full?"),
    (["--model", "small", "--recompute", "full", "--recompute-layers", "9"],
     "--recompute-layers 9: the model has 4 layers; use 0 (every layer) to 4."),
    (["--recompute-layers", "2"], "--recompute-layers 2 with --recompute none"),
    (["--attention", "flash"], "--attention 'flash': use fused"),
])
def test_cli_bad_recomputation_is_one_line_exit_2(args, message):
    out = run_cli("estimate", "memory", *args)
    assert out.returncode == 2
    assert message in out.stderr and len(out.stderr.strip().splitlines()) == 1, out.stderr


def test_cli_recompute_prints_its_flops_and_json_carries_them():
    out = run_cli("estimate", "memory", "--model", "7b", "--seq", "4096", "--recompute", "full")
    assert out.returncode == 0, out.stderr
    assert f"step time x{rc.time_ratio(PRESETS['7b'], 4096, 'full'):.3f} by FLOPs" in out.stdout
    assert "recompute full" in out.stdout and "one layer rebuilt" in out.stdout
    out = run_cli("estimate", "memory", "--model", "small", "--seq", "128", "--attention", "math", "--recompute",
                  "selective", "--recompute-layers", "2", "--json")
    got, config = json.loads(out.stdout), replace(PRESETS["small"], attention="math")
    s = Setup(params=1, model=config, seq=128, recompute="selective", recompute_layers=2)
    assert got["terms"]["activations"]["device"] == activation_bytes(s) + rebuilt_bytes(s)
    assert got["flops_per_token"]["time_ratio"] == rc.time_ratio(config, 128, "selective", 2)
    assert (got["setup"]["recompute"], got["setup"]["recompute_layers"]) == ("selective", 2)


def test_estimate_precision_matches_torch_finfo_and_casts():
    out = run_cli("estimate", "precision", "--json")
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)
    assert [f["name"] for f in got["formats"]] == list(FORMATS)
    for f in got["formats"]:
        dtype = getattr(torch, f["torch_dtype"])
        info = torch.finfo(dtype)
        assert (f["bits"], f["max"], f["min_normal"], f["epsilon"]) == (info.bits, info.max, info.smallest_normal,
                                                                        info.eps), f["name"]
        assert f["min_subnormal"] == info.smallest_normal * 2.0 ** -f["mantissa_bits"]
        cast = lambda x, dtype=dtype: torch.tensor([x], dtype=torch.float64).to(dtype).double().item()  # noqa: E731
        assert cast(f["min_subnormal"]) == f["min_subnormal"] and cast(f["min_subnormal"] / 2) == 0.0
        assert cast(f["max"]) == f["max"]
        beyond = cast(f["max"] * (1 + f["epsilon"]))
        assert beyond != beyond or beyond in (float("inf"), f["max"]), (f["name"], beyond)  # NaN, inf or saturated
        values = torch.linspace(1, 2, 1001, dtype=torch.float64)
        error = ((values.to(dtype).double() - values).abs() / values).max().item()
        assert 0.5 * f["rounding_error"] < error <= f["rounding_error"], f["name"]
    assert got["bytes_per_parameter"]["fp32"] == {"parameters": 4, "gradients": 4, "master": 0, "moments": 8,
                                                  "total": 16}
    for p in ("bf16", "fp16"):  # the ZeRO paper's mixed precision: 2 + 2 + K = 12
        assert got["bytes_per_parameter"][p] == {"parameters": 2, "gradients": 2, "master": 4, "moments": 8,
                                                 "total": 16}
