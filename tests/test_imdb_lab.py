"""The IMDB lab end to end on 2 CPU ranks: DDP (torchrun), DeepSpeed (its launcher) and
accelerate with its DeepSpeed plugin (accelerate launch) on a tiny configuration follow the
same loss curve; accumulation gradients equal one big batch; no_sync and accumulate() skip
the all-reduces of the first k-1 micro-batches; bad settings exit 2 before launch."""

import json
from pathlib import Path

import pytest

from conftest import figures, load_summary, run_cli
from plscale.lab import labs
from plscale.run.launch import Options, plan

TINY = ["--gpus", "2", "--cpu", "--steps", "6", "--set", "data.max_len=32", "--set", "data.test_samples=101",
        "--set", "data.train_samples=400"]
ACCUM = {"ddp": ("no-sync", "--set", "train.bucket_cap_mb=0.01"),  # tiny buckets: several all-reduces per step
         "deepspeed": ("imdb-ds-accum",), "accelerate": ("imdb-accelerate-accum",)}


def run_variant(runs: Path, variant, *extra):
    before = set(runs.iterdir()) if runs.exists() else set()
    result = run_cli("lab", "run", variant, *TINY, *extra, env={"PLSCALE_RUNS_DIR": str(runs)})
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    (run_dir,) = set(runs.iterdir()) - before
    return load_summary(run_dir), run_dir


@pytest.fixture(scope="module")
def accum_runs(tmp_path_factory):
    """Each engine once, 4 micro-batches x 8 samples x 2 ranks per step: {engine: (summary, run dir)}."""
    runs = tmp_path_factory.mktemp("imdb") / "runs"
    return {engine: run_variant(runs, *args) for engine, args in ACCUM.items()}


@pytest.mark.e2e
def test_ddp_and_deepspeed_same_curve_accumulation_and_buckets(accum_runs):
    # DDP with tiny buckets (several all-reduces per step) against DeepSpeed ZeRO-0 (one flat one)
    (ddp, ddp_dir), (ds, _) = accum_runs["ddp"], accum_runs["deepspeed"]
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


@pytest.mark.e2e
def test_accelerate_follows_the_same_curve_through_deepspeed(accum_runs):
    (acc, acc_dir), (ddp, _), (ds, _) = accum_runs["accelerate"], accum_runs["ddp"], accum_runs["deepspeed"]
    assert acc["engine"] == "accelerate" and acc["passed"], acc["checks"]
    assert "accelerate launch --use_deepspeed --num_processes 2" in (acc_dir / "command.txt").read_text()
    # accelerate adopted the 2-rank gloo group and drove a real DeepSpeed engine
    assert acc["accelerate"] == {"distributed_type": "DEEPSPEED", "num_processes": 2}
    assert acc["comms"]["all_reduce"], acc["comms"]                     # DeepSpeed's comms logger saw it
    assert len(acc["losses"]) == 6
    assert max(abs(a - b) for a, b in zip(acc["losses"], ddp["losses"])) < 1e-4
    assert max(abs(a - b) for a, b in zip(acc["losses"], ds["losses"])) < 1e-4
    f = figures(acc)
    assert f["grad gap vs one big batch"]["value"] < 1e-6               # read just before DeepSpeed's step
    assert f["reductions in no_sync micro-batches"]["value"] == 0       # accumulate(): 3 of 4 send nothing
    assert f["reductions per step"]["value"] == 1                       # the gradient all-reduce, at the boundary


@pytest.mark.parametrize("nodes, node_rank, argv", [
    (1, None, ["--num_processes", "2", "--num_machines", "1", "--machine_rank", "0"]),
    (2, 1, ["--num_processes", "4", "--num_machines", "2", "--machine_rank", "1"]),  # all nodes' processes
])
def test_accelerate_launcher_argv(nodes, node_rank, argv, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    lab, variant = labs.find("imdb-accelerate")
    p = plan(lab, variant, Options(gpus=2, nodes=nodes, node_rank=node_rank, master_addr="10.0.0.1",
                                   master_port=1234), gpus_present=[]).at(Path("/tmp/run-x"))
    assert Path(p.argv[0]).name == "accelerate" and p.argv[1:3] == ["launch", "--use_deepspeed"]
    assert p.argv[3:9] == argv
    assert p.argv[9:13] == ["--main_process_ip", "10.0.0.1", "--main_process_port", "1234"]
    assert ("--deepspeed_multinode_launcher" in p.argv) == (nodes > 1)   # standard: torchrun on every node
    assert p.argv[-3:] == [str(lab.entry_path), "--run-dir", "/tmp/run-x"]


@pytest.mark.parametrize("variant,setting,message", [
    ("imdb-ddp", "data.train_samples=1", "data.train_samples=1 cannot be shared by 2 ranks"),
    ("imdb-deepspeed", "data.test_samples=1", "data.test_samples=1 cannot be shared by 2 ranks"),
    ("imdb-ddp", "data.max_len=0", "data.max_len=0: a review needs at least 1 token"),
    ("no-sync", "data.train_samples=40", "gives 20 samples per rank, fewer than one step's"),
    ("imdb-ddp", "train.engine=jax", "train.engine='jax': use ddp, deepspeed or accelerate"),
    ("imdb-ddp", "model.heads=5", "model.dim=64 is not divisible by model.heads=5"),
    ("imdb-deepspeed", "ds.comms_logger=false", "train.engine=deepspeed counts reductions with DeepSpeed's comms"),
    ("imdb-accelerate", "ds.comms_logger=false", "train.engine=accelerate counts reductions with DeepSpeed's comms"),
    ("imdb-ddp", "train.steps=-1", "train.steps=-1: use a number of steps"),
    ("imdb-ddp", "train.epochs=0", "train.epochs=0 with train.steps=0 trains nothing"),
    ("imdb-ddp", "train.grad_tolerance=0", "train.grad_tolerance=0.0: the gradient check needs a positive"),
    ("imdb-ddp", "train.eval_every=-1", "train.eval_every=-1: use a number of steps between quick evaluations"),
    ("imdb-ddp", "train.eval_batch=0", "train.eval_batch=0: evaluation needs batches of 1 review or more"),
    ("imdb-ddp", "data.eval_samples=-1", "data.eval_samples=-1: use a number of test reviews"),
    ("imdb-ddp", "train.target_accuracy=80", "train.target_accuracy=80.0: a fraction of reviews right"),
    ("imdb-ddp", "data.test_samples=-1", "data.test_samples=-1: use a number of reviews, or 0 for all"),
])
def test_bad_settings_fail_before_launch(quick_cli, variant, setting, message):
    cli = quick_cli
    result = cli("lab", "run", variant, "--gpus", "2", "--cpu", "--dry-run", "--set", setting)
    assert result.returncode == 2, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], result.stderr
    assert "Traceback" not in result.stderr
    assert not cli.runs.exists() or not any(cli.runs.iterdir())  # nothing launched, nothing written
