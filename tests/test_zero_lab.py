"""Lab 04 end to end: the ZeRO sweep on 2 CPU ranks (memory against the model, loss parity,
the charts), and bad input caught before launching."""

import json
from pathlib import Path

import pytest

from conftest import load_summary, only_run, run_cli
from plscale.dsconfig.spec import DSSpec, build
from plscale.predict import memory
from plscale.predict.presets import preset
from plscale.lab.labs import find
from plscale.lab.settings import resolve

TINY = ["--set", "model.preset=tiny", "--set", "model.seq=64", "--set", "data.val_blocks=16"]
# torchrun starts the ranks: the deepspeed launcher would add its runner and launch.py, each importing DeepSpeed
# (about 3 s of CPU and 5 s of waiting a run); lab 01's tests run it (test_lab_mnist.py)
TORCHRUN = ["--launcher", "torchrun"]


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    """The ZeRO sweep (stages 0-3) on 2 CPU ranks, 5 steps of the tiny preset: (stdout, sweep dir, summaries)."""
    runs = tmp_path_factory.mktemp("zero") / "runs"
    out = run_cli("lab", "run", "zero", "--sweep", "--gpus", "2", "--cpu", "--steps", "5", *TINY, *TORCHRUN,
                  env={"PLSCALE_RUNS_DIR": str(runs)})
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    sweep_dir = next(p for p in runs.iterdir() if p.name.endswith("zero-sweep"))
    found = [Path(r) for r in json.loads((sweep_dir / "sweep.json").read_text())["runs"]]
    return out, sweep_dir, [load_summary(r) for r in found]


@pytest.mark.e2e
def test_sweep_memory_parity_and_charts(sweep, quick_cli):
    out, sweep_dir, summaries = sweep
    assert [s["stage"] for s in summaries] == [0, 1, 2, 3]

    # model states per rank within 5% of the ZeRO paper, every stage, every rank
    for s in summaries:
        assert s["passed"], s["checks"]
        states = s["memory"]["model_states"]
        for measured in states["measured_bytes"]:
            assert abs(measured - states["predicted_bytes"]) <= 0.05 * states["predicted_bytes"], s["stage"]
    # ... and the prediction is what `plscale estimate memory` says for that run
    for s in summaries:
        estimate = estimate_json(quick_cli, s["preset"], s["model"]["vocab"], s["world_size"], s["stage"],
                                 s["precision"], s["offload_optimizer"], s["offload_param"], s["micro_batch"],
                                 s["grad_accum"], s["seq"])
        assert estimate["setup"]["params"] == s["params"]
        for name in (*memory.MODEL_STATES, "activations"):
            assert s["memory"][name]["predicted_bytes"] == estimate["terms"][name]["total"], (s["stage"], name)
        assert s["memory"]["model_states"]["predicted_bytes"] == estimate["totals"]["model_states"]
    measured = [max(s["memory"]["model_states"]["measured_bytes"]) for s in summaries]
    assert measured[0] > measured[1] > measured[2] > measured[3]
    psi = summaries[0]["params"]
    # fp32 stage 0: 4 + 4 + 8 bytes per parameter, plus Adam's step counters (a float per tensor)
    assert 0 <= measured[0] - 16 * psi <= 4 * 64

    # the same loss curve at every stage (same seed, same data)
    base = summaries[0]["losses"]
    assert len(base) == 5
    for s in summaries[1:]:
        assert max(abs(a - b) for a, b in zip(s["losses"], base)) < 1e-4, s["stage"]

    # ZeRO-3 gathers parameters: more bytes per step than ZeRO-2
    comm = [sum(op["bytes"] for op in s["comms_per_step"].values()) for s in summaries]
    assert comm[3] > comm[2] > 0
    # ZeRO-2 reduces after each of the 2 micro-batches per step, ZeRO-1 once at the boundary
    assert summaries[2]["comms_per_step"]["all_reduce"]["calls"] > summaries[1]["comms_per_step"]["all_reduce"]["calls"]

    # throughput from the median timed step: the comms logger's first fifth (1 of 5) and the census step (1) left out
    for run, s in zip(json.loads((sweep_dir / "sweep.json").read_text())["runs"], summaries):
        lines = [json.loads(line) for line in (Path(run) / "metrics.jsonl").read_text().splitlines()]
        timed = sorted(line["step_time_s"] for line in lines[2:])
        figures = {f["name"]: f for f in s["figures"]}
        assert figures["throughput"]["value"] == pytest.approx(s["tokens_per_step"] / timed[1], abs=0.1)
        assert "median of 3 timed steps" in figures["throughput"]["note"]
        # MFU against the measured matmul peak of a CPU rank: a share of it, each step and in the summary
        assert 0 < figures["MFU"]["value"] < 100 and "measured matmul" in figures["MFU"]["note"]
        assert figures["HFU"]["value"] == figures["MFU"]["value"]                     # no recomputation
        assert all(0 < line["mfu"] < 1 and line["hfu"] == line["mfu"] for line in lines)
        assert "MFU (datasheet)" not in figures                                       # no datasheet for a CPU

    for png in ("memory_by_stage.png", "loss_by_stage.png"):
        data = (sweep_dir / png).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000
    assert "model states MiB" in out.stdout


@pytest.mark.e2e
def test_fsdp2_trains_as_zero3_with_a_fifth_less_memory(sweep, cli):
    # the same weights, batches and AdamW (torch's, with DeepSpeed's clipping) sharded by FSDP2 instead
    out = cli("lab", "run", "fsdp2", "--gpus", "2", "--cpu", "--steps", "5", *TINY, *TORCHRUN)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    f, zero3 = load_summary(only_run(cli.runs)), sweep[2][3]
    assert f["passed"], f["checks"]
    assert {"the model built on meta and filled from rank 0 equals the eager model",
            "model states match the FSDP2 model, every term, every rank",
            "parameters held between forward and backward as predicted",
            "FSDP2's collectives per step as predicted, every rank",
            "FSDP2 follows the dense model's loss"} <= {c["name"] for c in f["checks"]}
    assert f["params"] == zero3["params"] and len(f["losses"]) == 5
    assert max(abs(a - b) / b for a, b in zip(f["losses"], zero3["losses"])) < 1e-6   # measured: 0 over 3 steps
    # DeepSpeed keeps a 4Ψ/N fp32 master beside fp32 weights (20Ψ/N), FSDP2 steps its fp32 shards (16Ψ/N);
    # both measured, each rank's census
    mine, theirs = (max(s["memory"]["model_states"]["measured_bytes"]) for s in (f, zero3))
    assert mine == pytest.approx(0.8 * theirs, rel=0.01)
    assert f["memory"]["master"]["measured_bytes"] == [0, 0]


@pytest.mark.e2e
def test_hsdp_without_reshard_on_four_ranks(cli):
    # a 2 x 2 mesh: reduce-scatter inside each pair, all-reduce across; the gathered weights kept for the backward
    out = cli("lab", "run", "hsdp", "--cpu", "--steps", "2", "--set", "fsdp.reshard=false", *TINY, *TORCHRUN)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    s = load_summary(only_run(cli.runs))
    assert s["passed"], s["checks"]
    assert (s["world_size"], s["replicate"], s["reshard"]) == (4, 2, False)
    assert "all_reduce backward" in out.stdout and "all_gather backward" not in out.stdout


@pytest.mark.parametrize("args,message", [
    (["hsdp", "--gpus", "2"], "fsdp.replicate 2: HSDP's mesh is replicate x shard over 2 ranks"),
    (["hsdp", "--gpus", "4", "--set", "fsdp.replicate=3"], "use a divisor of 4 below it"),
    (["fsdp2", "--set", "fsdp.reshard=2"], "'fsdp.reshard' takes true or false"),
    (["fsdp2", "--set", "ds.precision=fp16"], "FSDP2's variants run fp32 or bf16"),
    (["fsdp2", "--set", "ds.offload_optimizer=true"], "the FSDP2 variants do not offload here"),
    (["zero2", "--set", "fsdp.replicate=2"], "the ZeRO variants' sharding is ds.stage"),
    (["zero3", "--set", "fsdp.compile=true"], "fsdp.compile compiles the FSDP2 variants' layers"),
    (["fsdp2", "--set", "fsdp.compile=true"], "torch.compile's inductor builds C++ and no compiler is on PATH"),
])
def test_fsdp2_bad_input_is_one_line_before_launch(quick_cli, args, message, tmp_path):
    no_compiler = {"PATH": str(tmp_path), "CXX": ""}   # a machine without g++ or clang++
    out = quick_cli("lab", "run", *args, "--cpu", env=no_compiler if "compiler" in message else None)
    assert out.returncode == 2 and message in out.stderr, out.stderr
    assert len(out.stderr.strip().splitlines()) == 1 and not quick_cli.runs.exists()


def estimate_json(cli, model, vocab, gpus, stage, precision, offload_optimizer, offload_param, micro, accum,
                  seq) -> dict:
    """`plscale estimate memory --json` with the flags a user would type for a run (quick_cli: the same main())."""
    out = cli("estimate", "memory", "--model", model, "--vocab", vocab, "--gpus", gpus, "--stage", stage,
              "--precision", precision, "--micro-batch", micro, "--grad-accum", accum, "--seq", seq,
              *(["--offload-optimizer"] if offload_optimizer else []),
              *(["--offload-param"] if offload_param else []), "--json")
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


ZERO = find("zero")[0]


@pytest.mark.parametrize("variant", [v for v in ZERO.variants if not ZERO.variants[v].entry])   # DeepSpeed's
def test_lab_prediction_is_plscale_estimate_memory(variant, quick_cli):
    """Every variant: the lab's own call on its DeepSpeed config (2 ranks) against the CLI."""
    settings = resolve(ZERO.settings, ZERO.variants[variant].overrides)
    ds_config = build(DSSpec.from_dict({**settings["ds"], "world_size": 2}))
    vocab = preset(settings["model"]["preset"]).vocab - 37  # a local tokenizer's own vocabulary
    config = preset(settings["model"]["preset"]).with_vocab(vocab)
    lab = memory.estimate(memory.setup_from_ds_config(ds_config, 2, config, settings["model"]["seq"])).to_dict()
    ds = {**DSSpec().to_dict(), **settings["ds"]}  # the spec's defaults (fp32) where lab.yaml says nothing
    cli = estimate_json(quick_cli, settings["model"]["preset"], vocab, 2, ds["stage"], ds["precision"], ds["offload_optimizer"],
                        ds["offload_param"], ds["micro_batch"], ds["grad_accum"], settings["model"]["seq"])
    assert cli["setup"] == json.loads(json.dumps(lab["setup"]))
    assert set(cli["terms"]) == {*memory.MODEL_STATES, "activations"}
    for name, term in lab["terms"].items():
        assert (cli["terms"][name]["device"], cli["terms"][name]["host"]) == (term["device"], term["host"]), name
    assert cli["totals"] == lab["totals"]


@pytest.mark.parametrize("args,message", [
    (["zero", "--set", "ds.stage=5"], "ZeRO stage 5 does not exist"),
    (["zero1", "--set", "ds.offload_param=true"], "Parameter offload needs ZeRO stage 3"),
    (["zero0", "--set", "ds.offload_optimizer=true"], "Optimizer offload needs ZeRO stage"),
    (["zero2", "--data-dir", "/nonexistent/wikitext"], "is not a folder"),
])
def test_bad_input_is_one_line_exit_2(quick_cli, args, message):
    cli = quick_cli
    out = cli("lab", "run", *args, "--gpus", "2", "--dry-run")
    assert out.returncode == 2, out.stdout + out.stderr
    assert message in out.stderr and len(out.stderr.strip().splitlines()) == 1, out.stderr


def test_missing_data_files_exit_2(quick_cli, tmp_path):
    cli = quick_cli  # refused before launch: in this process
    (tmp_path / "empty").mkdir()
    out = cli("lab", "run", "zero2", "--gpus", "2", "--data-dir", tmp_path / "empty", "--dry-run")
    assert out.returncode == 2 and "has no WikiText-2 files" in out.stderr


def test_inconsistent_batch_triple_exit_2(quick_cli, tmp_path):
    cli = quick_cli  # refused before launch: in this process
    config = tmp_path / "ds.json"
    config.write_text(json.dumps({"train_batch_size": 10, "train_micro_batch_size_per_gpu": 4,
                                  "gradient_accumulation_steps": 2, "zero_optimization": {"stage": 2}}))
    out = cli("lab", "run", "zero2", "--gpus", "2", "--ds-config", config, "--dry-run")
    assert out.returncode == 2 and "train_batch_size 10 != micro batch 4" in out.stderr
