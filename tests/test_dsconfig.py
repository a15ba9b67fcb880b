"""The DeepSpeed config builder, checker, diff and the standard set in ds_configs/."""

import json

import pytest

from plscale.dsconfig import standard
from plscale.dsconfig.check import check, load, rule_problems
from plscale.dsconfig.explain import diff
from plscale.dsconfig.spec import DSSpec, build
from plscale.errors import UserError


def test_batch_triple_is_consistent():
    config = build(DSSpec(micro_batch=4, grad_accum=3, world_size=2))
    assert config["train_batch_size"] == 4 * 3 * 2
    assert "train_batch_size" not in build(DSSpec(micro_batch=4))  # unknown world size: DeepSpeed derives it


def test_gradient_clipping_is_always_explicit():
    # DeepSpeed clips at 1.0 when the key is absent; "off" must be written as 0.
    assert build(DSSpec(grad_clip=0.0))["gradient_clipping"] == 0.0


@pytest.mark.parametrize("spec, zero", [
    (DSSpec(stage=0), {"stage": 0}),
    (DSSpec(stage=2, offload_optimizer=True), {"offload_optimizer": {"device": "cpu", "pin_memory": False}}),
    (DSSpec(stage=3, offload_param=True), {"offload_param": {"device": "cpu", "pin_memory": False}}),
])
def test_zero_sections(spec, zero):
    built = build(spec)["zero_optimization"]
    assert all(built[k] == v for k, v in zero.items())


def test_precisions():
    assert build(DSSpec(precision="bf16"))["bf16"] == {"enabled": True}
    fp16 = build(DSSpec(precision="fp16"))["fp16"]
    assert fp16["enabled"] and fp16["loss_scale"] == 0  # dynamic loss scaling
    assert "fp16" not in build(DSSpec()) and "bf16" not in build(DSSpec())


def test_offloaded_optimizer_uses_deepspeed_cpu_adam():
    assert build(DSSpec(stage=1))["optimizer"]["params"]["torch_adam"] is True
    assert "torch_adam" not in build(DSSpec(stage=2, offload_optimizer=True))["optimizer"]["params"]


@pytest.mark.parametrize("kwargs, match", [
    ({"stage": 4}, "ZeRO stage 4 does not exist"),
    ({"stage": 2, "offload_param": True}, "Parameter offload needs ZeRO stage 3"),
    ({"stage": 0, "offload_optimizer": True}, "Optimizer offload needs ZeRO stage 1, 2 or 3"),
    ({"precision": "fp8"}, "Precision 'fp8'"),
    ({"micro_batch": 0}, "micro_batch must be at least 1"),
    ({"scheduler": "WarmupCosineLR"}, "total_steps"),
])
def test_bad_specs(kwargs, match):
    with pytest.raises(UserError, match=match):
        build(DSSpec(**kwargs))


@pytest.mark.parametrize("zero", [{"stage": 5}, {"stage": 1, "offload_param": True},
                                  {"stage": 0, "offload_optimizer": True}, {"stage": 2, "precision": "fp8"}])
def test_one_set_of_zero_rules(zero):
    """The spec, the memory model and the config checker name the same problem (dsconfig/valid.py)."""
    from plscale.dsconfig import valid
    from plscale.predict.memory import Setup, estimate

    expected = valid.problems(**zero)[0]
    with pytest.raises(UserError) as spec:
        build(DSSpec(**zero))
    with pytest.raises(UserError) as model:
        estimate(Setup(params=1000, **zero))
    assert str(spec.value) == str(model.value) == expected
    if "precision" not in zero:  # a JSON config cannot name a precision that does not exist
        config = build(DSSpec(stage=3, offload_optimizer=zero.get("offload_optimizer", False),
                              offload_param=zero.get("offload_param", False)))
        config["zero_optimization"]["stage"] = zero["stage"]
        assert expected in rule_problems(config, 1)


def test_unknown_spec_key_names_the_nearest():
    with pytest.raises(UserError, match="micro_batch"):
        DSSpec.from_dict({"micro_bach": 4})


def test_checker_names_numbers_and_fix():
    config = {"train_batch_size": 30, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2}
    (problem,) = rule_problems(config, world_size=4)
    assert "30 != micro batch 4 x accumulation 2 x world size 4 = 32" in problem
    assert "set train_batch_size to 32" in problem


def test_checker_catches_typos_and_conflicts():
    problems = check({"train_micro_batch_size_per_gpu": 2, "zero_optimisation": {"stage": 2},
                      "fp16": {"enabled": True}, "bf16": {"enabled": True}}, 1)
    assert any("Did you mean 'zero_optimization'" in p for p in problems)
    assert any("fp16 and bf16 are both enabled" in p for p in problems)


def test_deepspeed_own_parser_runs_with_the_world_size():
    good = build(DSSpec(stage=2, micro_batch=4, world_size=4))
    assert check(good, 4) == []
    # a stage that does not exist is plscale's rule (dsconfig/valid.py), named before DeepSpeed parses
    problems = check({"train_micro_batch_size_per_gpu": 2, "zero_optimization": {"stage": "two"}}, 2)
    assert problems == ["ZeRO stage 'two' does not exist: use 0, 1, 2 or 3."]
    # plscale's rules pass, DeepSpeed's parser rejects an unknown zero_optimization key
    problems = check({"train_micro_batch_size_per_gpu": 2, "zero_optimization": {"stage": 2, "stagee": 1}}, 2)
    assert len(problems) == 1 and problems[0].startswith("DeepSpeed rejects it"), problems


def test_load_errors(tmp_path):
    with pytest.raises(UserError, match="Cannot read"):
        load(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(UserError, match="not valid JSON.*line 1 column 2"):
        load(bad)
    bad.write_text("[1, 2]")
    with pytest.raises(UserError, match="JSON object"):
        load(bad)


def test_standard_set_has_not_drifted():
    assert standard.drifted() == [], "ds_configs/ differs from the builder: run `plscale config sync`"


def test_sync_writes_and_then_reports_no_drift(tmp_path):
    (tmp_path / "stale.json").write_text("{}")
    (tmp_path / "zero2.json").write_text('{"edited": true}')
    changed = standard.sync(tmp_path)
    assert "stale.json" in changed and "zero2.json" in changed
    assert not (tmp_path / "stale.json").exists()
    assert standard.drifted(tmp_path) == []
    assert json.loads((tmp_path / "zero3.json").read_text())["zero_optimization"]["stage"] == 3


def test_diff_explains_each_changed_key():
    rows = diff(build(DSSpec(stage=1)), build(DSSpec(stage=3, offload_param=True)))
    keys = {key: text for key, _, _, text in rows}
    assert "zero_optimization.stage" in keys and "all-gather" in keys["zero_optimization.stage"]
    assert "Parameters live in CPU memory" in keys["zero_optimization.offload_param.device"]
    assert diff(build(DSSpec()), build(DSSpec())) == []


def test_load_universal_reaches_deepspeed():
    from unittest import mock

    assert "checkpoint" not in build(DSSpec(stage=2))
    config = build(DSSpec(stage=2, micro_batch=2, world_size=2, load_universal=True))
    assert config["checkpoint"] == {"load_universal": True}
    assert check(config, 2) == []  # also tells DeepSpeed it runs on the CPU when there is no GPU
    from deepspeed.runtime import config as ds_config

    with mock.patch.object(ds_config.dist, "get_rank", lambda *a, **k: 0), \
         mock.patch.object(ds_config.dist, "get_world_size", lambda *a, **k: 2):
        assert ds_config.DeepSpeedConfig(dict(config)).load_universal_checkpoint is True
        assert ds_config.DeepSpeedConfig(build(DSSpec(stage=2, micro_batch=2, world_size=2))) \
            .load_universal_checkpoint is False


@pytest.mark.parametrize("sections, message", [
    ({"fp16": {"enabled": True, "loss_scale": 0.5}}, "fp16.loss_scale 0.5 is a static scale below 1"),
    ({"fp16": {"enabled": True, "loss_scale": 1, "initial_scale_power": -8}},
     "fp16.initial_scale_power -8 asks for a tiny starting scale (2^-8) while loss_scale 1 turns dynamic scaling off"),
    ({"fp16": {"enabled": True, "min_loss_scale": 0}}, "fp16.min_loss_scale 0: use a whole number, 1 or more"),
    ({"torch_autocast": {"enabled": True, "dtype": "torch.float16"}, "fp16": {"enabled": True}},
     "torch_autocast and the fp16 section are both enabled: keep one"),
    ({"torch_autocast": {"enabled": True}, "bf16": {"enabled": True}},
     "torch_autocast and the bf16 section are both enabled: keep one"),
])
def test_checker_applies_the_precision_rules(sections, message):
    """The rules the spec and the lab's checks use (dsconfig/valid.py), on a config from a file."""
    problems = check({"train_micro_batch_size_per_gpu": 2, **sections}, 1)
    assert len(problems) == 1 and problems[0].startswith(message), problems
    # off, the same section is not checked; DeepSpeed's defaults pass
    assert rule_problems({"train_micro_batch_size_per_gpu": 2, "fp16": {**sections.get("fp16", {}), "enabled": False}},
                         1) == []
    assert check({"train_micro_batch_size_per_gpu": 2, "fp16": {"enabled": True}}, 1) == []


def test_fp16_section_is_refused_on_cpu_only():
    from plscale.dsconfig.valid import fp16_section_problem

    config = build(DSSpec(precision="fp16"))
    problem = fp16_section_problem(config, "cpu")
    assert "oneDNN fp16 kernels" in problem and "use bf16" in problem and "\n" not in problem
    assert fp16_section_problem(config, "cuda") is None
    assert fp16_section_problem(build(DSSpec(precision="fp16", autocast=True)), "cpu") is None  # torch autocast runs


def test_explain_names_torch_autocast():
    from plscale.dsconfig.explain import meaning

    assert "fp32" in meaning("torch_autocast.dtype") and "GradScaler" in meaning("torch_autocast.enabled")
    assert "underflow" in meaning("fp16.loss_scale") and meaning("fp16.enabled").startswith("fp16 mixed precision")
