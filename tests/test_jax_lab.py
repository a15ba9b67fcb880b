"""Lab 10 end to end through the real CLI: one process with simulated CPU devices trains the
mini-GPT four ways (dp, fsdp, fsdp_tp, pipeline) from the PyTorch model's weights; every layout
follows one loss curve, the first loss is PyTorch's, each device holds what the memory model
says; the collectives variant checks every primitive. Bad settings fail in one line."""

import pytest

from conftest import load_summary, only_run
from plscale.predict import sharding
from plscale.predict.presets import preset

pytest.importorskip("jax", reason="JAX is an optional extra: pip install -e '.[jax]'")

TINY = ["--cpu", "--steps", "3", "--set", "model.preset=tiny", "--set", "model.seq=32"]


@pytest.mark.e2e
def test_four_layouts_one_loss_curve_and_the_memory_model(cli):
    out = cli("lab", "run", "jax", *TINY)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "one process with 4 simulated CPU devices" in out.stdout
    run_dir = only_run(cli.runs)
    s = load_summary(run_dir)
    assert s["passed"], [c for c in s["checks"] if not c["ok"]]
    assert s["world_size"] == 4 and s["backend"] == "xla-cpu"
    names = {c["name"] for c in s["checks"]}
    assert {"the first loss is the PyTorch model's on the same weights and batch",
            "every layout follows dp's loss curve", "fsdp_tp: Megatron's g, an all-reduce over model after "
            "attention and after the MLP", "pipeline: XLA reduces each gradient once over data",
            "pipeline: each of the m + p - 1 = 5 ticks passes one micro-batch on (backward)"} <= names
    dp = s["losses"]["dp"]
    assert set(s["losses"]) == set(sharding.LAYOUTS)
    for losses in s["losses"].values():
        assert losses == pytest.approx(dp, rel=1e-5)
    assert dp[0] == pytest.approx(s["pytorch_losses"][0], rel=1e-5)
    config = preset("tiny").with_vocab(s["vocab"])
    for name, held in s["held"].items():  # measured from the arrays' shards, predicted on the host
        assert held == sharding.states_per_device(config, sharding.mesh(name, 4)), name
    for plot in s["plots"]:
        assert (run_dir / plot).read_bytes()[:4] == b"\x89PNG"
    # MFU of each layout against the measured JAX matmul peak the simulated devices share: the process's
    f = {x["name"]: x for x in s["figures"]}
    for name in sharding.LAYOUTS:
        assert 0 < f[f"{name}: MFU"]["value"] < 100 and "measured jax matmul" in f[f"{name}: MFU"]["note"], name
    assert "shared by the simulated devices: MFU is the process's" in out.stdout


@pytest.mark.e2e
def test_two_devices_leave_a_data_axis_of_one(cli):
    """fsdp_tp on 2 devices is data 1 x model 2, the pipeline stage 2 x data 1: nothing to
    gather or reduce over data, and the lab expects nothing there."""
    out = cli("lab", "run", "jax", *TINY, "--gpus", "2", "--set", "layouts=[fsdp_tp,pipeline]", "--steps", "2")
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    s = load_summary(only_run(cli.runs))
    assert s["passed"] and s["world_size"] == 2
    config = preset("tiny").with_vocab(s["vocab"])
    assert s["held"]["fsdp_tp"] == sharding.states_per_device(config, sharding.mesh("fsdp_tp", 2))


@pytest.mark.e2e
def test_collectives_by_definition_on_two_devices(cli):
    out = cli("lab", "run", "jax-collectives", "--cpu", "--gpus", "2")
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    s = load_summary(only_run(cli.runs))
    assert s["passed"] and s["world_size"] == 2
    assert {"psum", "all_gather", "psum_scatter", "ppermute", "all_to_all"} <= {c["name"].split(":")[0].split()[0]
                                                                              for c in s["checks"]}


@pytest.mark.parametrize("setting, words", [
    ("layouts=[dp,zero3]", "layouts: unknown layout 'zero3'"),
    ("mesh.tp=3", "mesh.tp 3 on 4 devices"),
    ("ds.precision=bf16", "trains in fp32"),
    ("ds.grad_clip=1.0", "does not clip gradients"),
    ("pipeline.micro_batches=0", "pipeline.micro_batches 0: use a whole number"),
    ("parity.tolerance=2", "parity.tolerance 2"),
])
def test_bad_settings_fail_in_one_line(quick_cli, setting, words):
    cli = quick_cli  # refused before launch: in this process (it imports no JAX)
    out = cli("lab", "run", "jax", "--cpu", "--set", setting)
    assert out.returncode == 2, out.stdout + out.stderr
    assert words in out.stderr and len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert not cli.runs.exists() or not any(cli.runs.iterdir())


def test_a_ds_config_file_is_held_to_the_same_rules(quick_cli, tmp_path):
    """The lab reads Adam and the micro batch from the DeepSpeed config; a user's --ds-config that
    asks for what it would ignore (ZeRO-3, bf16, clipping) is refused in one line, naming the file."""
    cli = quick_cli  # refused before launch: in this process
    out = cli("lab", "run", "jax", "--cpu", "--ds-config", "ds_configs/zero3.json")
    assert out.returncode == 2 and out.stderr.strip().splitlines() == [
        "error: ds_configs/zero3.json: The JAX lab shards by layout, not by ZeRO stage: use ZeRO stage 0 without "
        "offload (ds.stage=0; pick fsdp in layouts for ZeRO-3's sharding)."], out.stderr
    assert not cli.runs.exists() or not any(cli.runs.iterdir())
