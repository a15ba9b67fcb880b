"""Mixed precision and fp8, below the lab: DeepSpeed's precision sections from the spec, the loss
scaler's log on a real GradScaler inside a DeepSpeed engine (halved and skipped on every overflow,
the weights untouched), fp16's underflow and overflow with and without scaling (the gradients at the
linears' outputs up to the first inf, the weights' gradients beyond them), fp8 casts against the formats'
predictions, and fp32/bf16 model states counted on 2 gloo ranks against the memory model. DeepSpeed's
own fp16 section (a GPU's path) runs here too, with the CPU accelerator told it has fp16 kernels, after
a torch_autocast engine in the same process (the state DeepSpeed leaks between them, cleared)."""

from dataclasses import replace

import pytest
import torch
from helpers.ranks import run_ranks

from plscale.dsconfig import valid
from plscale.dsconfig.check import check
from plscale.dsconfig.spec import DSSpec, build
from plscale.dsconfig.valid import zero_settings
from plscale.errors import UserError
from plscale.predict import memory
from plscale.predict.formats import FORMATS
from plscale.predict.presets import ModelConfig
from plscale.strategies.precision import fp8, loss_scaling
from plscale.rank import taps

TINY = ModelConfig(vocab=256, hidden=64, layers=2, heads=4, kv_heads=4, ffn=128, max_seq=64)
E4M3, E5M2, FP16 = FORMATS["e4m3"], FORMATS["e5m2"], FORMATS["fp16"]


def test_autocast_writes_deepspeeds_torch_autocast_section_and_keeps_fp32_weights():
    config = build(DSSpec(precision="fp16", autocast=True, micro_batch=2, world_size=2))
    assert config["torch_autocast"] == {"enabled": True, "dtype": "torch.float16"}
    assert "fp16" not in config and "bf16" not in config
    assert zero_settings(config)["precision"] == "fp32"  # the weights stay fp32: model states as fp32's
    states = memory.estimate(memory.setup_from_ds_config(config, 2, TINY, 32))
    psi = states.setup.params
    assert [states.term(t).total for t in memory.MODEL_STATES] == [4 * psi, 4 * psi, 0, 8 * psi]
    assert check(config, 2) == []  # DeepSpeed's own parser takes the section
    assert build(DSSpec(precision="bf16", autocast=True))["torch_autocast"]["dtype"] == "torch.bfloat16"


def test_fp16_section_carries_the_loss_scaling_settings():
    fp16 = build(DSSpec(precision="fp16", initial_scale_power=24, loss_scale_window=5, hysteresis=1,
                        min_loss_scale=2))["fp16"]
    assert fp16 == {"enabled": True, "loss_scale": 0.0, "initial_scale_power": 24, "loss_scale_window": 5,
                    "hysteresis": 1, "min_loss_scale": 2}
    assert zero_settings({"fp16": fp16})["precision"] == "fp16"


@pytest.mark.parametrize("kwargs, message", [
    ({"precision": "fp32", "autocast": True}, "autocast runs bf16 or fp16 ops on fp32 weights"),
    ({"loss_scale": 0.5}, "loss_scale 0.5 is a static scale below 1"),
    ({"loss_scale": -1}, "loss_scale -1: use 0 (dynamic loss scaling)"),
    ({"initial_scale_power": -4}, "starts the loss scale at 2^-4, below 1"),
    ({"loss_scale": 1, "initial_scale_power": -8}, "while loss_scale 1 turns dynamic scaling off"),
    # only dynamic scaling starts from initial_scale_power: with none, a power below DeepSpeed's 16 is a contradiction
    ({"loss_scale": 1, "initial_scale_power": 1}, ("asks for a small starting scale (2^1) while loss_scale 1 turns "
                                                   "dynamic scaling off")),
    ({"loss_scale": 128, "initial_scale_power": 15}, "scale dynamically from 2^15"),
    ({"loss_scale_window": 0}, "loss_scale_window 0: use a whole number of steps"),
    ({"min_loss_scale": 0.5}, "min_loss_scale 0.5: use a whole number, 1 or more"),  # DeepSpeed takes an int
])
def test_bad_precision_settings_are_one_line(kwargs, message):
    with pytest.raises(UserError, match=message.replace("(", r"\(").replace(")", r"\)").replace("^", r"\^")) as err:
        build(DSSpec(**{"precision": "fp16", **kwargs}))
    assert "\n" not in str(err.value)


def test_a_static_scale_keeps_a_default_or_larger_initial_scale_power():
    for power in (16, 24):  # DeepSpeed's default, lab 09's: left over from dynamic scaling, ignored
        assert valid.loss_scaling_problems(loss_scale=1, initial_scale_power=power) == []


def test_fp16_path_asks_the_device_and_the_stage():
    """One rule (dsconfig/valid.py) for the host's checks and the ranks: DeepSpeed's fp16 section
    on GPUs at ZeRO 1-3, torch_autocast on CPUs and at ZeRO 0."""
    assert valid.fp16_path(2, "cuda") == (True, ("cuda runs fp16: DeepSpeed's fp16 section (fp16 weights, fp32 "
                                                 "master copy, its loss scaler)"))
    native, why = valid.fp16_path(0, "cuda")
    assert not native and "deepspeedai/DeepSpeed#8393" in why
    for stage in (0, 2):
        native, why = valid.fp16_path(stage, "cpu")
        assert not native and "oneDNN fp16 kernels" in why and "torch_autocast" in why


def test_format_thresholds_classify_values():
    assert FP16.flush_limit == 2.0 ** -25 and E4M3.flush_limit == 2.0 ** -10 and E5M2.flush_limit == 2.0 ** -17
    assert round(E4M3.binades) == 18 and round(E5M2.binades) == 32  # what fp8.py's docstrings say


def _grads(entries):
    return {"layer": torch.tensor(entries, dtype=torch.float32)}


def test_underflow_fractions_follow_fp16s_range():
    # 2^-26 rounds to 0; 2^-20 is subnormal; 1 is normal; 70000 is past 65504; 0 is not counted
    grads32 = _grads([2.0 ** -26, 2.0 ** -20, 1.0, 70000.0, 0.0])
    want = loss_scaling.predicted_underflow(grads32, 1.0)
    assert (want.entries, want.flushed, want.subnormal, want.overflowed) == (4, 0.25, 0.25, 0.25)
    got = loss_scaling.measured_underflow(grads32, {"layer": grads32["layer"].half()})
    assert got == want
    scaled = loss_scaling.predicted_underflow(grads32, 2.0 ** 8)  # 2^-18 subnormal, 2^-12 normal now
    assert (scaled.flushed, scaled.subnormal) == (0.0, 0.25)


def test_fp16_gradients_fall_where_fp32_times_s_predicts_until_the_first_inf():
    from plscale.rank.models.llama import Llama

    torch.manual_seed(0)
    model = Llama(TINY)
    x = torch.randint(0, TINY.vocab, (4, 65))
    _, probes = loss_scaling.probe(model, x[:, :-1], x[:, 1:], [1.0, 2.0 ** 12, 1.1 * 2.0 ** 21, 2.0 ** 24])
    plain, scaled, weights_only, carried = probes
    for pr in probes:  # every column, over the layers the backward reached up to the first inf
        for column in ("flushed", "subnormal", "overflowed"):
            assert abs(getattr(pr.measured, column) - getattr(pr.predicted, column)) < 0.01, (pr.scale, column)
    lost = lambda pr: pr.measured.flushed + pr.measured.subnormal
    assert lost(plain) > 0.2 and lost(scaled) < lost(plain) / 10 and scaled.measured.overflowed == 0
    # dW sums dL/dy x input over the tokens: at 1.1 x 2^21 no dL/dy overflows, yet weight gradients do, as fp32 predicts
    assert not weights_only.carried and weights_only.measured.overflowed == 0
    assert weights_only.weights.measured == weights_only.weights.predicted > 0
    assert weights_only.weights.largest > FP16.max and plain.weights.measured == plain.weights.predicted == 0
    # at 2^24 a dL/dy overflows; the backward carries the inf on into nearly every entry after it
    assert carried.carried and len(carried.layers) + len(carried.carried) == 15 and carried.carried_nonfinite > 0.9
    assert carried.measured.overflowed > 0 and abs(carried.measured.overflowed - carried.predicted.overflowed) < 1e-3


def test_split_at_overflow_keeps_the_layers_up_to_the_first_inf():
    grads16 = {"head": torch.tensor([1.0, float("inf")]), "mid": torch.tensor([float("nan"), 1.0]),
               "low": torch.tensor([2.0, 3.0])}
    assert loss_scaling.split_at_overflow(grads16) == (["head"], ["mid", "low"])
    assert loss_scaling.split_at_overflow({"a": torch.ones(2), "b": torch.ones(2)}) == (["a", "b"], [])
    assert loss_scaling.nonfinite(grads16[n] for n in ("mid", "low")) == 0.25


def test_per_tensor_scaling_keeps_fp8_casts_within_the_rounding_error():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(50_000, generator=g) * 1e-6  # gradient-sized: below both formats without scaling
    for fmt in (E4M3, E5M2):
        s = fp8.per_tensor_scale(x, fmt)
        assert x.abs().max() * s <= fmt.max and x.abs().max() * s >= fmt.max * (1 - 2.0 ** -22)  # lands on max
        plain, scaled = fp8.cast(x, fmt, scaled=False), fp8.cast(x, fmt, scaled=True)
        assert plain.flushed == plain.flushed_predicted and plain.flushed > 0.9 * plain.entries
        assert scaled.flushed == scaled.flushed_predicted and scaled.clipped == scaled.clipped_predicted == 0
        assert 0 < scaled.worst_error <= fmt.rounding_error and scaled.error < fmt.rounding_error < plain.error


def test_fp8_flush_and_overflow_counts_are_the_predicted_ones():
    # e4m3: 2^-10 is half its smallest (a tie: to even, 0); 500 and 1e5 saturate at 448.
    # e5m2: 60000 rounds to 57344 (within half a step), 1e5 becomes inf.
    x = torch.tensor([2.0 ** -10, 2.0 ** -9, 1.0, 500.0, 60000.0, 1e5])
    e4m3 = fp8.cast(x, E4M3, scaled=False)
    assert (e4m3.flushed, e4m3.flushed_predicted, e4m3.clipped, e4m3.clipped_predicted, e4m3.infinite) == (1, 1, 3, 3, 0)
    e5m2 = fp8.cast(x, E5M2, scaled=False)
    assert (e5m2.flushed, e5m2.clipped, e5m2.clipped_predicted, e5m2.infinite) == (0, 2, 2, 1)
    assert e5m2.error == float("inf")
    # The counts come from the cast, q: a format whose model disagrees with its dtype is caught. An
    # IEEE-style e4m3 (largest 240) predicts 300 clipped; torch's e4m3fn casts it to 288, finite.
    wrong = replace(E4M3, name="e4m3-ieee", finite_only=False)
    cast = fp8.cast(torch.tensor([1.0, 300.0]), wrong, scaled=False)
    assert (wrong.max, cast.clipped_predicted, cast.clipped) == (240.0, 1, 0)
    hist = taps.log2_histogram([torch.tensor([0.0, 0.5, 1.0, 3.0])], lo=-4, hi=4, per_binade=1)
    assert hist["zeros"] == 1 and sum(hist["counts"]) == 3 and hist["counts"][3:6] == [1, 1, 1]


def test_a_wrong_per_tensor_scale_shows_as_clipping(monkeypatch):
    """The scaled cast is not clamped into range: a scale 4 times too large pushes 1 and 0.5
    past e4m3's 448, where torch saturates them; measured in q, predicted from x s."""
    monkeypatch.setattr(fp8, "per_tensor_scale", lambda t, fmt: 4 * fmt.max / t.abs().max().item())
    cast = fp8.cast(torch.tensor([1.0, 0.5, 0.1]), E4M3, scaled=True)
    assert cast.clipped == cast.clipped_predicted == 2 and cast.worst_error <= E4M3.rounding_error


def _engine(config, initial_scale_power=None, forget=True):
    import deepspeed

    from plscale.rank.models.llama import Llama

    torch.manual_seed(0)
    model = Llama(TINY)
    if forget:
        loss_scaling.forget_autocast(config)
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    if initial_scale_power is not None:
        loss_scaling.configure(engine, DSSpec(precision="fp16", initial_scale_power=initial_scale_power,
                                              loss_scale_window=2))
    return engine


def _cases(rank, world):
    """Census vs memory model for fp32 and bf16; a GradScaler run that starts too high (2^24); then,
    in the same process, ZeRO-2 engines after it: with DeepSpeed's leaked autocast state, and
    DeepSpeed's own fp16 section with it cleared."""
    from plscale.rank.census import census, zero_states

    out, x = {}, torch.randint(0, TINY.vocab, (2, 33), generator=torch.Generator().manual_seed(rank))
    for precision in ("fp32", "bf16"):
        config = build(DSSpec(precision=precision, micro_batch=2, world_size=world, grad_clip=0))
        engine = _engine(config)
        for step in range(2):
            engine.backward(engine(x[:, :-1], x[:, 1:]))
            if step == 1:
                measured = census(zero_states(engine))
            engine.step()
        want = memory.estimate(memory.setup_from_ds_config(config, world, TINY, 32))
        out[precision] = {t: [measured[t], want.term(t).total] for t in memory.MODEL_STATES}
    engine = _engine(build(DSSpec(precision="fp16", autocast=True, micro_batch=2, world_size=world, grad_clip=0)),
                     initial_scale_power=24)
    out["grad_scaler"] = loss_scaling.grad_scaler_settings(engine)
    out["autocast"] = _scaler_run(engine, x)
    # DeepSpeed left TORCH_AUTOCAST_INITIALIZED set: a ZeRO-2 engine built now gets a GradScaler
    zero2 = build(DSSpec(stage=2, micro_batch=2, world_size=world, grad_clip=0))
    try:
        loss_scaling.configure(_engine(zero2, forget=False), DSSpec())
        out["leak"] = "accepted"
    except RuntimeError as exc:
        out["leak"] = str(exc)
    out["cleared"] = _engine(zero2).optimizer.torch_autocast_gradscaler is None
    # DeepSpeed's own fp16 section and DynamicLossScaler, as a GPU runs them at ZeRO 1-3: told the
    # CPU has fp16 kernels (it has none, only slow fp16 ops), DeepSpeed runs it here too.
    from deepspeed.accelerator import get_accelerator

    accelerator = get_accelerator()
    accelerator.is_fp16_supported = lambda: True
    native = _engine(build(DSSpec(stage=2, precision="fp16", micro_batch=2, world_size=world, grad_clip=0,
                                  initial_scale_power=24, loss_scale_window=2, hysteresis=1)))
    loss_scaling.configure(native, DSSpec())  # nothing leaked into it: no GradScaler, no error
    out["native"] = _scaler_run(native, x)
    del accelerator.is_fp16_supported  # the class's own answer again
    return out


def _scaler_run(engine, x, steps: int = 12) -> dict:
    """The scaler's log over `steps` steps, and whether each step moved any weight."""
    log, moved = loss_scaling.ScalerLog(engine), []
    for step in range(steps):
        before = [p.detach().clone() for p in engine.module.parameters()]
        engine.backward(engine(x[:, :-1], x[:, 1:]))
        with log.step(step):
            engine.step()
        moved.append(any(not torch.equal(a, p) for a, p in zip(before, engine.module.parameters())))
    return {"log": log.to_list(), "moved": moved, "broken": log.broken_rule(2), "lines": loss_scaling.describe(log.rows)}


def _setup():
    import deepspeed

    from plscale.rank.distributed import _skip_shm_build

    _skip_shm_build()
    deepspeed.init_distributed(dist_backend="gloo", verbose=False)


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    return run_ranks(_cases, (2,), tmp_path_factory.mktemp("ranks"), setup=_setup)


def test_fp32_and_bf16_model_states_are_the_memory_models(two_ranks):
    from plscale.rank.models.llama import Llama

    counters = 4 * len(list(Llama(TINY).parameters()))  # Adam's step count: one fp32 scalar per tensor
    for rank in range(2):
        for precision in ("fp32", "bf16"):
            for term, (got, want) in two_ranks[(2, rank)][precision].items():
                assert got == want + (counters if term == "moments" else 0), (rank, precision, term, got, want)
    bf16 = two_ranks[(2, 0)]["bf16"]
    assert bf16["parameters"][0] * 2 == bf16["master"][0]  # 2 bytes a weight, a 4-byte master copy


@pytest.mark.parametrize("path", ["autocast", "native"])
def test_the_scaler_halves_and_skips_on_overflow_then_grows(two_ranks, path):
    """torch's GradScaler (DeepSpeed's torch_autocast, ZeRO 0) and DeepSpeed's fp16 optimizer
    (ZeRO 2), read by one ScalerLog."""
    out = two_ranks[(2, 0)][path]
    log, moved = out["log"], out["moved"]
    assert log[0]["scale_before"] == 2.0 ** 24 and log[0]["overflow"]  # fp16's largest is 65504
    for row, stepped in zip(log, moved):
        assert row["skipped"] == row["overflow"] == (not stepped), row  # a skipped step leaves every weight
        if row["overflow"]:
            assert row["scale_after"] == row["scale_before"] / 2
    first_clean = next(i for i, row in enumerate(log) if not row["overflow"])
    assert first_clean >= 3  # one halving per step, from 2^24 to where the gradients fit (2^19 here)
    assert any(row["scale_after"] == 2 * row["scale_before"] for row in log[first_clean:]), log  # window 2
    assert out["broken"] == [] and out["lines"][0].startswith("step   0: scale   2^24  overflow, step skipped")
    assert two_ranks[(2, 1)][path]["log"] == log  # every rank reads the same scale: the gradients are reduced first


def test_deepspeeds_leaked_autocast_state_is_refused_then_cleared(two_ranks):
    out = two_ranks[(2, 0)]
    assert "left DeepSpeed's TORCH_AUTOCAST_INITIALIZED set" in out["leak"] and out["cleared"]


def test_the_grad_scaler_that_ran_follows_the_spec(two_ranks):
    assert two_ranks[(2, 0)]["grad_scaler"] == {"init_scale": 2.0 ** 24, "growth_factor": 2.0,
                                               "backoff_factor": 0.5, "growth_interval": 2}


def test_broken_rule_names_steps_that_break_dynamic_scaling():
    log, row = loss_scaling.ScalerLog.__new__(loss_scaling.ScalerLog), loss_scaling.ScalerStep
    log.rows = [row(0, 8.0, 4.0, True, False), row(1, 4.0, 8.0, False, False)]
    assert log.broken_rule(2) == ["step 0: overflow, skipped False, scale x0.5",
                                  "step 1: clean (1 in a row), skipped False, scale x2"]
    log.rows = [row(0, 8.0, 8.0, True, True), row(1, 8.0, 8.0, True, True)]  # a scale stuck at overflows
    assert log.broken_rule(2) == ["step 0: overflow, skipped True, scale x1", "step 1: overflow, skipped True, scale x1"]
    assert log.broken_rule(2, hysteresis=2) == ["step 1: overflow, skipped True, scale x1"]
