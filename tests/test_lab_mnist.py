"""Lab 01 end to end through the real CLI on 2 CPU ranks: the parity it teaches must hold."""

import json

import numpy as np
import pytest

from conftest import figures, load_summary, only_run
from plscale.datafiles.mnist import find_mnist
from plscale.rank.data import mnist as mnist_data
from plscale.rank.data.digits import synthetic_digits

pytestmark = pytest.mark.e2e


def _check_run(run, steps):
    summary = load_summary(run)
    assert summary["passed"] and all(c["ok"] for c in summary["checks"]), summary["checks"]
    f = figures(summary)
    assert f["shard-average vs full-batch grad"]["value"] < 1e-5
    assert f["accumulated vs full-batch grad"]["value"] < 1e-5
    assert f["replica divergence"]["value"] == 0.0
    assert f["DeepSpeed vs simulated loss"]["value"] < 1e-3
    assert f["unequal shards, plain average"]["value"] > 100 * f["unequal shards, weighted"]["value"]
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    ds_rows = [r for r in rows if r["phase"] == "deepspeed"]
    assert len(ds_rows) == steps and len(ds_rows[0]["memory_mib_per_rank"]) == 2
    # throughput is the global batch (64 samples x 2 ranks, the lab's default) over the step's time
    assert all(r["samples_per_s"] * r["step_time_s"] == pytest.approx(128) for r in ds_rows)
    for name in ("command.txt", "env.json", "ds_config.json", "settings.json", "system.json", "rank_0.log",
                 "rank_1.log", "loss.png"):
        assert (run / name).is_file(), name
    assert json.loads((run / "system.json").read_text())["backend"] == "gloo"
    return summary, f


def test_offline_run_is_labelled_and_parity_holds(cli):
    result = cli("lab", "run", "mnist-dp", "--gpus", "2", "--cpu", "--steps", "30")
    assert result.returncode == 0, result.stdout[-3000:]
    assert "running 2 CPU ranks over gloo" in result.stdout
    summary, f = _check_run(only_run(cli.runs), 30)
    assert summary["real_data"] is False and "OFFLINE FALLBACK" in summary["data"]
    assert "OFFLINE FALLBACK" in result.stdout
    assert f["test accuracy (DeepSpeed)"]["value"] > 50  # 30 steps on an easy task: well above chance (10%)


def test_accumulation_variant_under_torchrun(cli):
    result = cli("lab", "run", "mnist-dp", "--cpu", "--variant", "accum", "--launcher", "torchrun", "--steps", "20")
    assert result.returncode == 0, result.stdout[-3000:]
    summary, _ = _check_run(only_run(cli.runs), 20)
    config = json.loads((only_run(cli.runs) / "ds_config.json").read_text())
    assert config["gradient_accumulation_steps"] == 4 and config["train_batch_size"] == 16 * 4 * 2


def test_real_mnist(cli, shared_data):
    folder = shared_data("mnist")
    # torchrun: the deepspeed launcher (its runner and launch.py each import DeepSpeed) is the offline test's
    result = cli("lab", "run", "mnist-dp", "--gpus", "2", "--cpu", "--launcher", "torchrun", "--data-dir", folder)
    assert result.returncode == 0, result.stdout[-3000:]
    summary, f = _check_run(only_run(cli.runs), 400)
    assert summary["real_data"] is True
    assert f["test accuracy (DeepSpeed)"]["value"] > 94.0  # measured 95.7% in 400 steps


def test_idx_reader_on_real_files(shared_data):
    files = find_mnist(shared_data("mnist"))
    data = mnist_data.from_folder(files["train_images"].parent)
    assert data.train.images.shape == (60000, 28, 28) and data.test.images.shape == (10000, 28, 28)
    assert np.bincount(data.test.labels).tolist() == [980, 1135, 1032, 1010, 982, 892, 958, 1028, 974, 1009]


def test_idx_reader_on_small_local_files(tmp_path):
    import gzip
    import struct

    images, labels = synthetic_digits(20, seed=3)
    for prefix, n in (("train", 20), ("t10k", 20)):
        (tmp_path / f"{prefix}-images-idx3-ubyte.gz").write_bytes(
            gzip.compress(struct.pack(">IIII", 2051, n, 28, 28) + images.tobytes()))
        (tmp_path / f"{prefix}-labels-idx1-ubyte").write_bytes(
            struct.pack(">II", 2049, n) + labels.astype(np.uint8).tobytes())
    data = mnist_data.from_folder(tmp_path)
    assert (data.train.images == images).all() and (data.test.labels == labels).all()
