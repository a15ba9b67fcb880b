"""Lab 09's precision variants end to end through the real CLI on 2 CPU ranks: fp32, bf16 and fp16
(scaled, and not) side by side with memory by role against the memory model and the loss
scaler's back-off; fp8 casts of real tensors; bad input refused in one line before launch."""

import json

import pytest
from conftest import figures, load_summary

from plscale.predict.presets import preset
from plscale.rank.models.llama import Llama

TINY = ["--launcher", "torchrun", "--cpu", "--gpus", "2", "--set", "model.preset=tiny", "--set", "model.seq=32"]


def run_lab(cli, variant: str, *extra) -> tuple[dict, object]:
    out = cli("lab", "run", variant, *TINY, *extra)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    run_dir = max(p for p in cli.runs.iterdir() if p.name.endswith(f"recompute-{variant}"))
    return load_summary(run_dir), run_dir


@pytest.mark.e2e
def test_precisions_side_by_side(cli):
    # 2^22 overflows the first steps on tiny; window 1: the scale doubles after every clean step
    s, run_dir = run_lab(cli, "precision", "--steps", "5", "--set", "fp16.initial_scale_power=22",
                         "--set", "fp16.loss_scale_window=1")
    assert s["passed"], s["checks"]
    names = {c["name"] for c in s["checks"]}
    for run in ("fp32", "bf16", "fp16", "fp16-unscaled"):
        assert f"{run}: model states match the memory model" in names, names
    assert {"fp32: activations match the memory model", "bf16: activations match the memory model",
            "fp16: the scale follows dynamic loss scaling", "loss scaling keeps small gradients in fp16's range",
            "fp16's range predicts where the gradients fall (flushed, subnormal, overflowed)"} <= names
    memory, f = s["memory"], figures(s)
    counters = 4 * len(list(Llama(preset("tiny")).parameters()))  # Adam's step count: a 4-byte scalar per tensor
    for run in ("fp32", "bf16", "fp16"):  # exact bytes
        got = {t: v["measured_bytes"] - v["predicted_bytes"] for t, v in memory[run].items() if t != "activations"}
        assert got == {"parameters": 0, "gradients": 0, "master": 0, "moments": counters}, (run, got)
    assert memory["bf16"]["parameters"]["measured_bytes"] * 2 == memory["fp32"]["parameters"]["measured_bytes"]
    assert memory["bf16"]["master"]["measured_bytes"] == memory["fp32"]["parameters"]["measured_bytes"]
    assert memory["fp32"]["master"]["measured_bytes"] == 0  # fp32 at ZeRO 0: Adam steps the weights
    assert f["fp16: activations per rank"]["predicted"] is None  # autocast: not predicted, said so
    log = s["scaler"]["fp16"]
    assert log[0]["overflow"] and log[0]["skipped"] and log[0]["scale_after"] == 2.0 ** 21
    assert any(not r["overflow"] for r in log) and any(r["scale_after"] > r["scale_before"] for r in log)
    none, scaled = s["underflow"].values()
    assert none["measured"]["subnormal"] > 0.5 and scaled["measured"]["subnormal"] < 0.01
    clean = max(r["scale_before"] for r in log if not r["overflow"])  # the table's S: the largest that ran clean
    assert scaled["scale"] == clean and not scaled["carried"] and len(scaled["layers"]) == 15
    assert scaled["weights"]["measured"] == scaled["weights"]["predicted"]  # dW x S against 65504, from fp32
    assert s["fp16_path"] == "torch_autocast"
    # the GradScaler that ran, as torch reports it: fp16's settings; none for fp16 with no scaling
    assert s["grad_scaler"] == {"fp16": {"init_scale": 2.0 ** 22, "growth_factor": 2.0, "backoff_factor": 0.5,
                                         "growth_interval": 1}, "fp16-unscaled": None}
    for run in ("fp32", "bf16", "fp16", "fp16-unscaled"):  # timed, never checked
        timed = f[f"{run}: step time (median)"]
        assert timed["value"] == round(s["step_s"][run], 4) > 0 and timed["predicted"] is None
        # MFU against the matmul peak of the run's own precision, measured on this CPU
        dtype = {"fp32": "float32", "bf16": "bfloat16"}.get(run, "float16")
        assert f"GFLOP/s {dtype} (measured matmul" in f[f"{run}: MFU"]["note"] and f[f"{run}: MFU"]["value"] > 0
    assert "torch_autocast" in json.loads((run_dir / "ds_config.fp16.json").read_text())
    assert "bf16" in json.loads((run_dir / "ds_config.bf16.json").read_text())
    for chart in ("losses.png", "memory.png", "loss_scale.png", "underflow.png"):
        assert (run_dir / chart).stat().st_size > 10_000, chart


@pytest.mark.e2e
def test_fp8_casts_of_real_tensors(cli):
    s, run_dir = run_lab(cli, "fp8", "--steps", "2")
    assert s["passed"], s["checks"]
    casts = s["casts"]
    assert casts["gradients, e4m3, unscaled"]["flushed"] > 0.9  # gradients sit below e4m3's 2^-9
    for name, cast in casts.items():
        assert cast["flushed"] == cast["flushed_predicted"] and cast["clipped"] == cast["clipped_predicted"], name
    assert casts["gradients, e4m3, per-tensor"]["flushed"] < 0.01 and casts["gradients, e5m2, per-tensor"]["error"] < 0.125
    assert (run_dir / "fp8.png").stat().st_size > 10_000
    f = figures(s)  # its training steps' utilisation, against the measured matmul peak of fp32
    assert 0 < f["MFU"]["value"] < 100 and "GFLOP/s float32 (measured matmul" in f["MFU"]["note"]
    assert f["HFU"]["value"] == f["MFU"]["value"] and "median of 1 timed steps" in f["throughput"]["note"]
    steps = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [0 < row["mfu"] < 1 for row in steps if "loss" in row] == [True, True]


@pytest.mark.parametrize("args, message", [
    (["precision", "--set", "precision.runs=[fp32,fp8]"], "precision.runs: unknown precision 'fp8'"),
    (["precision", "--set", "fp16.loss_scale=1", "--set", "fp16.initial_scale_power=-8"],
     "while loss_scale 1 turns dynamic scaling off"),
    (["fp16", "--set", "fp16.initial_scale_power=-3"], "starts the loss scale at 2^-3, below 1"),
    (["fp16", "--set", "fp16.loss_scale=128"], "which has no static scale"),
    (["precision", "--set", "ds.stage=2"], "whose loss scale backs off at ZeRO 0 only"),
    # no loss scaling asked for, with a small starting scale that only dynamic scaling would use
    (["fp16", "--set", "fp16.loss_scale=1", "--set", "fp16.initial_scale_power=1"],
     "fp16.initial_scale_power 1 asks for a small starting scale (2^1) while loss_scale 1 turns dynamic scaling off"),
    (["precision", "--set", "fp16.loss_scale=1"], "the fp16 run would be fp16-unscaled twice"),
    (["precision", "--set", "precision.runs=[e4m3]"], "(fp16 with no loss scaling); fp8 has its own variant"),
    (["fp8", "--set", "fp8.formats=[e3m4]"], "fp8.formats: No number format 'e3m4'"),
    (["precision", "--set", "ds.precision=fp64"], "Precision 'fp64' is not one of fp32, bf16, fp16"),
    (["precision", "--set", "fp16.min_loss_scale=4"], ("fp16.min_loss_scale 4: on CPU fp16 runs under torch's "
                                                       "GradScaler, which has no floor")),
    (["fp16", "--set", "fp16.hysteresis=2"], "(hysteresis is DeepSpeed's fp16 section's, on GPUs at ZeRO 1-3)"),
    # DeepSpeed's fp16 section on CPU (the shared rule, any lab): every rank would stop at DeepSpeed's ValueError
    (["fp8", "--set", "ds.precision=fp16"], "ds.precision fp16: DeepSpeed's fp16 section does not run on CPU"),
    (["recompute", "--set", "ds.precision=fp16"], "ds.precision fp16: DeepSpeed's fp16 section does not run on CPU"),
    (["zero2", "--set", "ds.precision=fp16"], "use bf16, or lab 09's fp16 variants (plscale lab run fp16)"),
])
def test_bad_input_is_refused_before_launch(quick_cli, args, message):
    cli = quick_cli
    out = cli("lab", "run", *args, "--cpu")
    assert out.returncode == 2, out.stdout + out.stderr
    text = out.stderr + out.stdout
    assert message in text and len(text.strip().splitlines()) == 1, text
    assert not cli.runs.exists() or not any(cli.runs.iterdir())


def test_a_users_fp16_config_is_refused_on_cpu(quick_cli, tmp_path):
    cli = quick_cli  # refused before launch: in this process
    from plscale.dsconfig.spec import DSSpec, build

    config = tmp_path / "fp16.json"
    config.write_text(json.dumps(build(DSSpec(precision="fp16", micro_batch=4, world_size=2, grad_clip=0))))
    out = cli("lab", "run", "fp8", "--cpu", "--ds-config", config, "--dry-run")
    assert out.returncode == 2 and f"{config}: DeepSpeed's fp16 section does not run on CPU" in out.stderr + out.stdout


@pytest.mark.parametrize("args", [["recompute", "--set", "ds.stage=3"], ["recompute", "--set", "fp16.hysteresis=2"],
                                  ["fp8", "--set", "precision.runs=[fp8]"], ["precision", "--set", "fp8.formats=[e3m4]"]])
def test_each_variant_is_checked_for_what_its_script_runs(cli, args):
    """precision.py's settings bind its variants only, fp8.py's formats its variant only."""
    out = cli("lab", "run", *args, "--cpu", "--dry-run")
    assert out.returncode == 0, out.stdout + out.stderr
