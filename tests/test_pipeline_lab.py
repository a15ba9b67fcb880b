"""Lab 05 end to end on CPU ranks: every engine (plscale's GPipe and 1F1B, DeepSpeed's
PipelineModule, torch.distributed.pipelining) gives the unpipelined model's loss, the
engines agree with each other, activations in flight follow the schedule, the timeline and
the bubble table come out of the run; bad input is caught before launching."""

import json

import pytest
import torch

from conftest import load_summary, run_cli
from plscale.predict import activations, memory
from plscale.predict.presets import preset
from plscale.rank.census import activations_in_flight, saved_activations
from plscale.rank.models.llama import Llama

FAST = ["--launcher", "torchrun", "--cpu", "--steps", "3", "--set", "model.seq=32", "--set", "bubble.micro_batches=[2,4]",
        "--set", "bubble.steps=2", "--set", "ds.grad_accum=4"]


@pytest.fixture(scope="module")
def plscale_1f1b(tmp_path_factory) -> dict:
    """plscale's 1F1B on 2 stages, the run two tests compare with."""
    runs = tmp_path_factory.mktemp("pipeline")

    def cli(*args):
        return run_cli(*args, env={"PLSCALE_RUNS_DIR": str(runs)})

    cli.runs = runs
    return run_lab(cli, "1f1b")


def run_lab(cli, variant: str, *extra, gpus: int = 2) -> dict:
    out = cli("lab", "run", "pipeline", "--variant", variant, "--gpus", gpus, *FAST, *extra)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    runs = sorted(p for p in cli.runs.iterdir() if p.name.endswith(f"pipeline-{variant}"))
    run_dir = runs[-1]
    assert (run_dir / "timeline.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (run_dir / "bubble.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    return load_summary(run_dir)


def check_summary(s: dict, m: int = 4) -> None:
    checks = {c["name"]: c for c in s["checks"]}
    assert checks["pipelined loss equals the unpipelined model's"]["ok"], checks
    assert s["passed"], s["checks"]
    # activations in flight: the schedule's count of micro-batches times one micro-batch, within 5%
    for row in s["activations"]:
        assert abs(row["measured_bytes"] - row["predicted_bytes"]) <= 0.05 * row["predicted_bytes"], row
    # every stage ran m forwards and m backwards in the timeline's step
    for stage in range(s["stages"] * s["virtual"]):
        for kind in ("F", "B"):
            micro = sorted(o["micro"] for o in s["timeline"] if o["kind"] == kind and o["stage"] == stage)
            assert micro == list(range(m)), (kind, stage, micro)
    assert [r["m"] for r in s["bubble"]] == [2, 4]
    p, v = s["stages"], s["virtual"]
    for row in s["bubble"]:
        assert row["theory"] == (p - 1) / (v * row["m"] + p - 1)
        assert 0 < row["measured"] < 1


@pytest.mark.e2e
def test_plscale_schedules_match_the_unpipelined_model_and_each_other(cli, plscale_1f1b):
    one_f_one_b, gpipe = plscale_1f1b, run_lab(cli, "gpipe")
    for s in (one_f_one_b, gpipe):
        check_summary(s)
    assert one_f_one_b["losses"] == gpipe["losses"]  # same arithmetic, other order
    # GPipe holds all m micro-batches on every stage; 1F1B at most p - s: less on stage 0
    first = lambda s: s["activations"][0]["measured_bytes"]  # noqa: E731
    assert first(gpipe) > 1.5 * first(one_f_one_b)


@pytest.mark.e2e
@pytest.mark.parametrize("variant", ["torch-gpipe", "torch-1f1b", "torch-interleaved"])
def test_torch_pipelining_matches(cli, variant):
    check_summary(run_lab(cli, variant))


@pytest.mark.e2e
def test_pipeline_times_data_parallel_on_four_ranks(cli):
    s = run_lab(cli, "pp-dp", gpus=4)
    check_summary(s)
    assert s["replicas"] == 2 and s["stages"] == 2


@pytest.mark.e2e
def test_plscale_1f1b_on_four_stages(cli):
    """Middle stages both receive and send, in both directions: where a schedule deadlocks."""
    s = run_lab(cli, "1f1b", "--set", "parallel.pp=4", gpus=4)
    check_summary(s)
    # 1F1B: stage s holds p - s micro-batches of two layers at its peak (m = 4 = p)
    held = [row["measured_bytes"] for row in s["activations"]]
    assert held[0] > held[1] > held[2] and abs(held[0] / held[2] - 2) < 0.05


@pytest.mark.e2e
def test_deepspeed_pipeline_module_matches_on_four_stages(cli, plscale_1f1b):
    """DeepSpeed's PipelineModule cut into 4 stages (the middle ones receive and send both ways), its groups
    the mesh's, trains as plscale's 1F1B on 2 stages: the same weights and batches, the same losses."""
    s = run_lab(cli, "deepspeed", "--set", "parallel.pp=4", gpus=4)
    check_summary(s)
    assert {c["name"] for c in s["checks"]} >= {"DeepSpeed's groups are the mesh's"}
    assert s["replicas"] == 1 and len(s["parts"]) == 4
    assert s["parts"][0][0] == 0 and s["parts"][-1][1] == 8 + 3  # embedding first, head last, nothing lost
    assert max(abs(a - b) / b for a, b in zip(s["losses"], plscale_1f1b["losses"])) < 1e-5


@pytest.mark.parametrize("args,message", [
    (["--gpus", "2", "--set", "parallel.pp=3"], "not a multiple of tp 1 x pp 3"),
    (["--gpus", "4", "--set", "parallel.pp=4", "--set", "model.preset=tiny"], "4 pipeline stages for 2 layers"),
    (["--variant", "torch-interleaved", "--set", "ds.grad_accum=3"], "3 micro-batches do not divide into rounds of 2"),
    (["--variant", "deepspeed", "--set", "pipeline.schedule=gpipe"], "is not one the deepspeed engine runs"),
    (["--set", "ds.stage=2"], "ZeRO stage 0 in fp32"),
    (["--set", "bubble.micro_batches=4"], "give a list such as"),
    (["--set", "bubble.steps=2.5"], "bubble.steps 2.5: use a whole number of at least 2"),
    (["--variant", "torch-interleaved", "--set", "parallel.pp=1"], "Interleaving needs a pipeline of 2 or more"),
])
def test_bad_pipeline_settings_fail_before_launch(quick_cli, args, message):
    cli = quick_cli
    out = cli("lab", "run", "pipeline", "--cpu", *args)
    assert out.returncode == 2, out.stdout + out.stderr
    assert message in out.stderr and "Traceback" not in out.stderr
    assert not cli.runs.exists() or not any(cli.runs.iterdir())


def test_ds_config_batch_counts_data_parallel_ranks_only(quick_cli, tmp_path):
    cli = quick_cli  # refused before launch: in this process
    """2 stages x 2 replicas: train_batch_size is micro x accumulation x 2, not x 4."""
    config = tmp_path / "ds.json"
    config.write_text(json.dumps({"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 8,
                                  "train_batch_size": 64, "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}}))
    out = cli("lab", "run", "pp-dp", "--cpu", "--ds-config", config)
    assert out.returncode == 2
    assert "64 != micro batch 2 x accumulation 8 x data-parallel size 2 = 32" in out.stderr


def test_ds_config_micro_batches_must_divide_the_batch(quick_cli, tmp_path):
    cli = quick_cli  # refused before launch: in this process
    config = tmp_path / "ds.json"
    config.write_text(json.dumps({"gradient_accumulation_steps": 4, "train_batch_size": 30,
                                  "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}}))
    out = cli("lab", "run", "pipeline", "--cpu", "--ds-config", config)
    assert out.returncode == 2
    assert "train_batch_size 30 is not divisible by accumulation 4 x data-parallel size 1" in out.stderr


# ---- the pieces the lab's predictions rest on ---------------------------------------------

def test_activations_in_flight_rise_with_each_forward_and_fall_with_each_backward():
    config = preset("tiny")
    torch.manual_seed(0)
    model = Llama(config)
    tokens = torch.randint(0, config.vocab, (2, 33))
    with saved_activations() as one:
        model(tokens[:, :-1], tokens[:, 1:])
    with activations_in_flight() as acts:
        losses = [model(tokens[:, :-1], tokens[:, 1:]) for _ in range(3)]  # GPipe-like: 3 in flight
        # (the token ids are one storage, saved by all three forwards: counted once)
        assert acts.now == acts.peak == pytest.approx(3 * one.bytes, rel=1e-3)
        losses[0].backward()
        assert acts.now == pytest.approx(2 * one.bytes, rel=1e-3)
        for loss in losses[1:]:
            loss.backward()
        assert acts.now == 0 and acts.peak == pytest.approx(3 * one.bytes, rel=1e-3)


def test_stage_activations_add_up_to_the_model():
    config = preset("deep")
    setup = memory.Setup(params=1, precision="fp32", model=config, seq=128, micro_batch=2)
    halves = activations.activation_bytes(setup, layers=4, head=False) + activations.activation_bytes(setup, layers=4, head=True)
    assert halves == activations.activation_bytes(setup)
    assert activations.activation_bytes(setup, layers=0, head=True) == activations.head_activation_bytes(setup)


def test_engines_refuse_micro_batches_whose_shape_changes():
    """Receivers allocate (micro, seq, hidden) before the data arrives: a new shape would hang,
    fail on another rank or abort the process (measured), so every engine refuses it first."""
    from plscale.errors import UserError
    from plscale.strategies.pipeline.stages import one_shape

    pair = lambda b, s: (torch.zeros(b, s, dtype=torch.long), torch.zeros(b, s, dtype=torch.long))  # noqa: E731
    assert one_shape([pair(2, 32)] * 4, None, "x") == (2, 32)
    assert one_shape([pair(2, 32)] * 4, (2, 32), "x") == (2, 32)
    with pytest.raises(UserError, match="different shapes"):
        one_shape([pair(2, 32), pair(1, 32)], None, "x")
    with pytest.raises(UserError, match=r"of \(2, 16\) after \(2, 32\): DeepSpeed keeps"):
        one_shape([pair(2, 16)] * 4, (2, 32), "DeepSpeed")
