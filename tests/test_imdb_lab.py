"""The IMDB lab end to end on 2 CPU ranks: DDP (torchrun) and DeepSpeed (its launcher) on
a tiny configuration follow the same loss curve; accumulation gradients equal one big
batch; no_sync skips the all-reduces of the first k-1 micro-batches; bad input exits 2."""

import json

import pytest

from conftest import figures, load_summary

TINY = ["--gpus", "2", "--steps", "6", "--set", "data.max_len=32", "--set", "data.test_samples=101",
        "--set", "data.train_samples=400"]


def run_variant(cli, variant, *extra):
    before = set(cli.runs.iterdir()) if cli.runs.exists() else set()
    result = cli("lab", "run", variant, *TINY, *extra)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    (run_dir,) = set(cli.runs.iterdir()) - before
    return load_summary(run_dir), run_dir


@pytest.mark.e2e
def test_ddp_and_deepspeed_same_curve_accumulation_and_buckets(cli):
    # DDP with tiny buckets (several all-reduces per step) against DeepSpeed ZeRO-0 (one flat one)
    ddp, ddp_dir = run_variant(cli, "no-sync", "--set", "train.bucket_cap_mb=0.01")
    ds, _ = run_variant(cli, "imdb-ds-accum")
    assert ddp["engine"] == "ddp" and ds["engine"] == "deepspeed"
    assert ddp["passed"] and ds["passed"], (ddp["checks"], ds["checks"])
    assert len(ddp["losses"]) == len(ds["losses"]) == 6
    assert max(abs(a - b) for a, b in zip(ddp["losses"], ds["losses"])) < 1e-4
    assert ddp["losses"][-1] < ddp["losses"][0]
    for summary in (ddp, ds):
        f = figures(summary)
        assert f["grad gap vs one big batch"]["value"] < 1e-6          # 4 micro-batches x 2 ranks
        assert f["reductions in no_sync micro-batches"]["value"] == 0   # k-1 = 3 skipped
        assert "OFFLINE FALLBACK" in summary["data"] and summary["real_data"] is False
    assert figures(ddp)["reductions per step"]["value"] > 1             # one per (small) bucket
    assert figures(ds)["reductions per step"]["value"] == 1             # ZeRO-0: one flat all-reduce
    steps = [json.loads(line) for line in (ddp_dir / "metrics.jsonl").read_text().splitlines()]
    per_step = [s["reductions"] for s in steps if s["phase"] == "train"]
    assert per_step[1:] == [figures(ddp)["reductions per step"]["value"]] * 5   # the same buckets every step
    assert (ddp_dir / "loss.png").stat().st_size > 1000


@pytest.mark.parametrize("variant,setting,message", [
    ("imdb-ddp", "data.train_samples=1", "data.train_samples=1 cannot be shared by 2 ranks"),
    ("imdb-deepspeed", "data.test_samples=1", "data.test_samples=1 cannot be shared by 2 ranks"),
    ("imdb-ddp", "data.max_len=0", "data.max_len=0: a review needs at least 1 token"),
    ("no-sync", "data.train_samples=40", "gives 20 samples per rank, fewer than one step's"),
])
def test_bad_settings_fail_before_launch(cli, variant, setting, message):
    result = cli("lab", "run", variant, "--gpus", "2", "--set", setting)
    assert result.returncode == 2
    assert message in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert not cli.runs.exists() or not any(cli.runs.iterdir())  # nothing launched, nothing written
