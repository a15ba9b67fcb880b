"""Lab 04 end to end: the ZeRO sweep on 2 CPU ranks (memory against the model, loss parity,
the charts), and bad input caught before launching."""

import json
from pathlib import Path

import pytest

from conftest import load_summary

TINY = ["--set", "model.preset=tiny", "--set", "model.seq=64", "--set", "data.val_blocks=16"]


@pytest.mark.e2e
def test_sweep_memory_parity_and_charts(cli):
    out = cli("lab", "run", "zero", "--sweep", "--gpus", "2", "--steps", "5", *TINY)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    sweep_dir = next(p for p in cli.runs.iterdir() if p.name.endswith("zero-sweep"))
    runs = [Path(r) for r in json.loads((sweep_dir / "sweep.json").read_text())["runs"]]
    summaries = [load_summary(r) for r in runs]
    assert [s["stage"] for s in summaries] == [0, 1, 2, 3]

    # model states per rank within 5% of the ZeRO paper, every stage, every rank
    for s in summaries:
        assert s["passed"], s["checks"]
        states = s["memory"]["model states"]
        for measured in states["measured_bytes"]:
            assert abs(measured - states["predicted_bytes"]) <= 0.05 * states["predicted_bytes"], s["stage"]
    measured = [max(s["memory"]["model states"]["measured_bytes"]) for s in summaries]
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
    comm = [sum(s["comm_bytes_per_step"].values()) for s in summaries]
    assert comm[3] > comm[2] > 0

    for png in ("memory_by_stage.png", "loss_by_stage.png"):
        data = (sweep_dir / png).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000
    assert "model states MiB" in out.stdout


@pytest.mark.parametrize("args,message", [
    (["zero", "--set", "ds.stage=5"], "ZeRO stage 5 does not exist"),
    (["zero1", "--set", "ds.offload_param=true"], "Parameter offload needs ZeRO stage 3"),
    (["zero0", "--set", "ds.offload_optimizer=true"], "Optimizer offload needs ZeRO stage"),
    (["zero2", "--data-dir", "/nonexistent/wikitext"], "is not a folder"),
])
def test_bad_input_is_one_line_exit_2(cli, args, message):
    out = cli("lab", "run", *args, "--gpus", "2", "--dry-run")
    assert out.returncode == 2, out.stdout + out.stderr
    assert message in out.stderr and len(out.stderr.strip().splitlines()) == 1, out.stderr


def test_missing_data_files_exit_2(cli, tmp_path):
    (tmp_path / "empty").mkdir()
    out = cli("lab", "run", "zero2", "--gpus", "2", "--data-dir", tmp_path / "empty", "--dry-run")
    assert out.returncode == 2 and "has no WikiText-2 files" in out.stderr


def test_inconsistent_batch_triple_exit_2(cli, tmp_path):
    config = tmp_path / "ds.json"
    config.write_text(json.dumps({"train_batch_size": 10, "train_micro_batch_size_per_gpu": 4,
                                  "gradient_accumulation_steps": 2, "zero_optimization": {"stage": 2}}))
    out = cli("lab", "run", "zero2", "--gpus", "2", "--ds-config", config, "--dry-run")
    assert out.returncode == 2 and "train_batch_size 10 != micro batch 4" in out.stderr
