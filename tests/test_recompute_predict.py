"""Recomputation and precision predictions: the activations each strategy keeps, and what the
backward's recomputation holds when its rerun ends, against the allocator's history of a real
step; the FLOPs it costs, `plscale estimate memory --recompute` and `plscale estimate precision`
against torch.finfo."""

import json
from dataclasses import replace
from functools import cache

import pytest
import torch
from conftest import run_cli
from test_recompute import one_rank_group  # noqa: F401  (a fixture: a 1-rank group for DeepSpeed's checkpointing)

from plscale.errors import UserError
from plscale.predict import recompute as rc
from plscale.predict.activations import (
    activation_bytes,
    head_activation_bytes,
    layer_activation_bytes,
    layer_input_bytes,
    layer_kept_bytes,
    layer_parts,
    rebuilt_bytes,
)
from plscale.predict.formats import FORMATS
from plscale.predict.memory import Setup, estimate
from plscale.predict.presets import PRESETS, flops_per_token, layer_params
from plscale.rank import allocations
from plscale.strategies.recompute import llama as recompute
from plscale.rank.models.llama import Llama

TINY = PRESETS["tiny"]                      # h 128, a 4, L 2, f 384, V 2048
TINY_GQA = replace(TINY, kv_heads=2)        # h_kv 64: the math core repeats k and v to every head
SEQ, BATCH = 32, 2
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
CPU = torch.device("cpu")
# What the math core's rerun holds beyond rebuilt_bytes, in every case: its scale d^-0.5, a 0-dim
# fp64 tensor `q * scale` saves for backward (the forward's census leaves it out too)
SCALE = 8
# What DeepSpeed's CheckpointFunction keeps a layer beyond the model on CPU: the RNG states it restores
# for the rerun, torch's and the accelerator's, both the CPU generator's there (5,056 bytes each). On
# a GPU both are host tensors: no device memory, so the model leaves them out (activations' doc).
DEEPSPEED_RNG_STATES = 2 * torch.get_rng_state().numel()


# ---- one recorded step: kept at the end of the forward, held at the end of each rerun ------------

def setup_of(config, strategy: str, precision: str) -> Setup:
    return Setup(params=1, model=config, seq=SEQ, micro_batch=BATCH, precision=precision, recompute=strategy)


@cache
def measured(config, strategy: str, precision: str) -> tuple[int, tuple[int, ...]]:
    """One forward and backward of a Llama under plscale.strategies.recompute.llama, as the lab runs it:
    the bytes the forward allocated and still held at its end (torch.utils.checkpoint keeps its
    inputs where no saved-tensors hook sees them), and per layer what its rerun inside the backward
    allocated and still held when it ended (plscale.strategies.recompute.llama.measured_layers)."""
    torch.manual_seed(0)
    ds = {"train_micro_batch_size_per_gpu": BATCH, "activation_checkpointing": {
        "partition_activations": False, "contiguous_memory_optimization": False, "cpu_checkpointing": False}}
    model = recompute.apply(Llama(config).to(DTYPES[precision]), strategy, ds_config=ds)
    tokens = torch.randint(0, config.vocab, (BATCH, SEQ + 1), generator=torch.Generator().manual_seed(1))
    with allocations.record(CPU) as rec:
        with allocations.phase("forward"):
            loss = model(tokens[:, :-1], tokens[:, 1:])
        with allocations.phase("backward"):
            loss.backward()
    rows = recompute.measured_layers(rec.history, config.layers)
    assert [r["recomputed"] for r in rows] == [{"none": None, "selective": "core"}.get(strategy, "layer")] * len(rows)
    return rec.history.kept(), tuple(r["rebuilt"] for r in rows)


CASES = [(TINY, core, strategy, precision) for precision in DTYPES for core in ("fused", "math")
         for strategy in ("none", "selective", "full", "deepspeed")]
CASES += [(TINY_GQA, core, strategy, "fp32") for core in ("fused", "math") for strategy in ("none", "selective", "full")]
IDS = [f"{'gqa-' if c.kv_heads < c.heads else ''}{a}-{s}-{p}" for c, a, s, p in CASES]
SMALL_GQA = replace(PRESETS["small"], kv_heads=2)  # h 256, a 4, h_kv 128, f 704, L 4: the lab's shape
SHAPES = [(SMALL_GQA, "math", "selective", "bf16"), (SMALL_GQA, "fused", "full", "bf16"),
          (SMALL_GQA, "math", "full", "fp32")]


@pytest.fixture
def case(request):
    """The case's measurement, under a process group when DeepSpeed's checkpointing runs it."""
    config, core, strategy, precision = request.param
    if strategy == "deepspeed":
        request.getfixturevalue("one_rank_group")
    config = replace(config, attention=core)
    return config, strategy, precision, measured(config, strategy, precision)


@pytest.mark.parametrize("case", CASES, ids=IDS, indirect=True)
def test_kept_activations_match_the_allocator_to_the_rope_tables(case):
    """Measured minus predicted is the same few KiB for every strategy: RoPE's cos and sin
    (s x d/2 fp32 each), the targets' copy and the loss, and DeepSpeed's RNG states on CPU;
    every activation byte is predicted."""
    config, strategy, precision, (kept, _) = case
    predicted = activation_bytes(setup_of(config, strategy, precision))
    rope, targets = 2 * SEQ * config.head_dim // 2 * 4, BATCH * SEQ * 8
    rng = config.layers * DEEPSPEED_RNG_STATES if strategy == "deepspeed" else 0
    assert rope + targets <= kept - rng - predicted <= rope + targets + 32
    assert kept - rng - predicted < 0.01 * predicted


@pytest.mark.parametrize("case", CASES + SHAPES, ids=IDS + [f"small-gqa-{a}-{s}-{p}" for _, a, s, p in SHAPES],
                         indirect=True)
def test_rebuilt_matches_what_each_rerun_holds_at_its_end(case):
    """Every recomputed layer's rerun holds rebuilt_bytes exactly, but for the math core's scale:
    selective the core's (fused: output and log-sum-exp; math: probabilities, scaled q, v and, under
    GQA, k copies, the causal mask), full the layer's saved tensors less its input (fp32) or plus
    the residual its frame still names (bf16), deepspeed's the layer's output in place of either."""
    config, strategy, precision, (_, rebuilt) = case
    extra = SCALE if config.attention == "math" and strategy != "none" else 0
    assert [held - rebuilt_bytes(setup_of(config, strategy, precision)) for held in rebuilt] == [extra] * config.layers


def test_selective_drops_exactly_the_probabilities():
    config = replace(TINY, attention="math")
    (none, _), (selective, _) = (measured(config, s, "fp32") for s in ("none", "selective"))
    assert none - selective == config.layers * BATCH * config.heads * SEQ * SEQ * 4


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
    # the core's rerun: probabilities, the scaled q, v copied, the causal mask (no GQA: k is a view)
    assert rebuilt_bytes(replace(s, recompute="selective")) == sb * (TINY.heads * SEQ + 2 * h) * e + SEQ * SEQ * e
    gqa = replace(s, model=replace(TINY_GQA, attention="math"), recompute="selective")
    assert rebuilt_bytes(gqa) == sb * (TINY.heads * SEQ + 3 * h) * e + SEQ * SEQ * e      # k repeated too
    fused = replace(s, model=TINY, recompute="selective")
    assert rebuilt_bytes(fused) == layer_parts(fused)["core"] == sb * h * e + 4 * TINY.heads * sb
    # the layer's rerun: bf16, all it saves and the residual; fp32, all it saves but its input
    assert rebuilt_bytes(replace(s, recompute="full")) == layer_activation_bytes(s) + sb * h * e
    fp32 = replace(s, precision="fp32", recompute="full", recompute_layers=1)
    assert rebuilt_bytes(fp32) == layer_activation_bytes(fp32) - sb * h * 4
    # DeepSpeed's: what full keeps; its rerun runs on to the layer's output: fp32, all the layer
    # saves (one h over torch's); bf16, all it saves and the output (as much as torch's)
    deepspeed = replace(fp32, recompute="deepspeed")
    assert activation_bytes(deepspeed) == activation_bytes(fp32)
    assert rebuilt_bytes(deepspeed) == layer_activation_bytes(fp32) == rebuilt_bytes(fp32) + sb * h * 4
    assert rebuilt_bytes(replace(s, recompute="deepspeed")) == rebuilt_bytes(replace(s, recompute="full"))
    # and the term's formula says so
    assert "one core rebuilt [a·s·sbp + 2sbhp] + s²p + head" in estimate(replace(s, recompute="selective")).term(
        "activations").formula
    assert "one layer rebuilt ([" in estimate(fp32).term("activations").formula
    assert estimate(fp32).term("activations").formula.endswith("] - sbhp) + head")
    assert estimate(deepspeed).term("activations").formula.startswith("1·sbhp + (L-1)·layer + one layer rebuilt [")
    assert estimate(replace(deepspeed, precision="bf16")).term("activations").formula.endswith("] + sbhp) + head")


def test_strategies_order_and_the_peak_adds_what_backward_rebuilds():
    """7b's shape, math core, seq 4096: the probabilities (a x s a token) dwarf the rest."""
    base = Setup(params=1, model=replace(PRESETS["7b"], attention="math"), seq=4096)
    kept = {r: activation_bytes(replace(base, recompute=r)) for r in ("none", "selective", "full", "deepspeed")}
    assert kept["full"] == kept["deepspeed"] < kept["selective"] < kept["none"]
    assert kept["selective"] < kept["none"] / 2                       # the probabilities are most of it
    for r in kept:
        s = replace(base, recompute=r)
        assert estimate(s).term("activations").device == kept[r] + rebuilt_bytes(s)


# labs/09_recompute_precision/reference.json (variant strategies: preset small, math core, seq 256,
# micro-batch 4, fp32, one rank), MiB: what the forward kept (the census) and what one rerun held
# when it ended (the allocator). The model leaves out RoPE's tables and the targets (0.07 MiB here)
# and, for DeepSpeed, the two RNG states a layer it keeps on the host (4 x 10,112 bytes, 0.04 MiB).
@pytest.mark.parametrize("strategy, kept, unmodelled, rebuilt", [
    ("none", 135.106, 0.071, 0.0), ("selective", 119.106, 0.071, 6.25),
    ("full", 39.074, 0.071, 24.008), ("deepspeed", 39.113, 0.110, 25.008)])
def test_lab_09s_measured_activations(strategy, kept, unmodelled, rebuilt):
    s = Setup(params=1, model=replace(PRESETS["small"], attention="math"), seq=256, micro_batch=4,
              precision="fp32", recompute=strategy)
    assert kept - activation_bytes(s) / 2**20 == pytest.approx(unmodelled, abs=0.002)
    assert rebuilt_bytes(s) / 2**20 == pytest.approx(rebuilt, abs=0.0005)


def test_recompute_layers_interpolates_between_none_and_all():
    base = Setup(params=1, model=PRESETS["small"], seq=128, micro_batch=2)
    none, L = activation_bytes(base), PRESETS["small"].layers
    for strategy in ("selective", "full", "deepspeed"):
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
    (dict(recompute="fulll"), "recompute 'fulll': use none, selective, full, deepspeed. Did you mean: full?"),
    (dict(recompute=True), "recompute True: use none, selective, full, deepspeed."),
    (dict(recompute="full", recompute_layers=9), "recompute_layers 9: the model has 4 layers"),
    (dict(recompute="full", recompute_layers=1.5), "recompute_layers 1.5: the model has 4 layers"),
    (dict(recompute_layers=2), "recompute_layers 2 with recompute none: pick one of selective, full, deepspeed"),
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
    assert rc.time_ratio(c, s, "deepspeed", layers=1) == rc.time_ratio(c, s, "full", layers=1)  # the same rerun
    assert rc.time_ratio(PRESETS["7b"], 4096, "full") == pytest.approx(1.33, abs=0.005)
    assert 1 < rc.time_ratio(PRESETS["7b"], 4096, "selective") < 1.05
    with pytest.raises(UserError, match="recompute_layers 3: the model has 2 layers"):
        rc.time_ratio(c, s, "full", layers=3)


# ---- the CLI -------------------------------------------------------------------------------------

@pytest.mark.parametrize("args,message", [
    (["--recompute", "fulll"], "--recompute 'fulll': use none, selective, full, deepspeed. Did you mean: full?"),
    (["--model", "small", "--recompute", "full", "--recompute-layers", "9"],
     "--recompute-layers 9: the model has 4 layers; use 0 (every layer) to 4."),
    (["--recompute-layers", "2"], "--recompute-layers 2 with --recompute none"),
    (["--attention", "flash"], "--attention 'flash': use fused (PyTorch's flash kernel"),
    (["--attention", "flsh"], "--attention 'flsh': use fused (PyTorch's flash kernel) or math"),
])
def test_cli_bad_recomputation_is_one_line_exit_2(quick_cli, args, message):
    out = quick_cli("estimate", "memory", *args)
    assert out.returncode == 2
    assert message in out.stderr and len(out.stderr.strip().splitlines()) == 1, out.stderr
    if "flash" in args:  # the fused core is PyTorch's flash kernel: no guess at a spelling
        assert "Did you mean" not in out.stderr and "math" not in out.stderr, out.stderr


def test_cli_recompute_prints_its_flops_and_json_carries_them():
    out = run_cli("estimate", "memory", "--model", "7b", "--seq", "4096", "--recompute", "deepspeed")
    assert out.returncode == 0, out.stderr
    text = " ".join(out.stdout.split())  # rich wraps long lines
    assert f"step time x{rc.time_ratio(PRESETS['7b'], 4096, 'full'):.3f} by FLOPs" in text  # full's rerun
    assert "recompute deepspeed" in text and "one layer rebuilt" in text
    assert "GFLOPs again per token, on a step's 46.1 GFLOPs per token (forward 15.4 GFLOPs" in text, text
    out = run_cli("estimate", "memory", "--model", "small", "--seq", "128", "--attention", "math", "--recompute",
                  "selective", "--recompute-layers", "2", "--json")
    got, config = json.loads(out.stdout), replace(PRESETS["small"], attention="math")
    s = Setup(params=1, model=config, seq=128, recompute="selective", recompute_layers=2)
    assert got["terms"]["activations"]["device"] == activation_bytes(s) + rebuilt_bytes(s)
    assert got["flops_per_token"]["time_ratio"] == rc.time_ratio(config, 128, "selective", 2)
    assert (got["setup"]["recompute"], got["setup"]["recompute_layers"]) == ("selective", 2)
    assert got["activations"] == {"kept_at_forward_end": activation_bytes(s), "one_rerun": rebuilt_bytes(s)}


def test_cli_note_splits_the_activations_row_into_kept_and_one_rerun():
    """The activations row is kept + one rerun; the note under the table gives both, in the row's unit,
    and names the math core's s²p (the causal mask the rerun holds). Lab 09 measures the first."""
    args = ["--model", "small", "--seq", "256", "--micro-batch", "4", "--precision", "fp32", "--stage", "0",
            "--gpus", "2", "--attention", "math"]
    config = replace(PRESETS["small"], attention="math")
    for strategy, region in (("selective", "core's"), ("full", "layer's")):
        out = run_cli("estimate", "memory", *args, "--recompute", strategy)
        assert out.returncode == 0, out.stderr
        s = Setup(params=1, model=config, seq=256, micro_batch=4, precision="fp32", recompute=strategy)
        text = " ".join(out.stdout.split())  # rich wraps long lines
        assert (f"activations: {activation_bytes(s) / 2**20:.2f} MiB kept at the end of the forward + "
                f"{rebuilt_bytes(s) / 2**20:.2f} MiB while one {region} rerun runs in the backward") in text, text
        assert (f"{(activation_bytes(s) + rebuilt_bytes(s)) / 2**20:.2f}" in text)  # the row: their sum
        assert ("s²p: the causal mask, [s, s]" in text) == (strategy == "selective"), text
    out = run_cli("estimate", "memory", *args)  # nothing rebuilt: the row is what is kept, no note
    assert "kept at the end of the forward" not in out.stdout


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
