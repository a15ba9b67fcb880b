"""Lab 06 end to end on CPU ranks: a killed-and-restarted run equals an uninterrupted one at
every step (ZeRO stages 0-3, each strategy), a corrupted newest checkpoint is skipped, a
full disk leaves earlier checkpoints alone, a run resumes at another world size through a
universal checkpoint; bad input is caught before launching."""

import json
import os
import shutil
import subprocess
import sys

import pytest

from conftest import ROOT, figures, load_summary, run_cli
from plscale.ckpt import store

FAST = ["--launcher", "torchrun", "--cpu", "--steps", "8", "--set", "model.preset=tiny", "--set", "model.seq=32", "--set", "ds.micro_batch=2",
        "--set", "ckpt.every=2", "--set", "ckpt.full_every=6", "--set", "ckpt.durable_every=6"]


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """Run the lab under a module-wide runs folder; returns the run directory."""
    runs = tmp_path_factory.mktemp("ckpt") / "runs"

    def call(variant, *extra, expect=0, env=None, prefix=None):
        before = set(runs.iterdir()) if runs.exists() else set()
        args = ["lab", "run", "ckpt", "--variant", variant, *FAST, *extra]
        environment = {"PLSCALE_RUNS_DIR": str(runs), **(env or {})}
        if prefix:  # a shell around the CLI (ulimit)
            out = subprocess.run(["bash", "-c", prefix + ' && exec "$@"', "-", sys.executable, "-m", "plscale.cli.main",
                                  *map(str, args)], env={**os.environ, "HF_HUB_OFFLINE": "1", "COLUMNS": "200",
                                                         **environment},
                                 cwd=ROOT, capture_output=True, text=True, timeout=600)
        else:
            out = run_cli(*args, env=environment)
        assert (out.returncode == expect) if expect is not None else out.returncode != 0, \
            out.stdout[-3000:] + out.stderr[-3000:]
        (run_dir,) = set(runs.iterdir()) - before
        return run_dir, out

    return call


def losses_by_attempt(run_dir) -> dict:
    """{attempt: {step: loss}} from metrics.jsonl."""
    found = {}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        row = json.loads(line)
        found.setdefault(row["attempt"], {})[row["step"]] = row["loss"]
    return found


@pytest.fixture(scope="module")
def goldens(lab):
    """Uninterrupted runs, one per ZeRO stage (the strategy does not touch training)."""
    return {stage: lab("basic", "--set", f"ds.stage={stage}")[0] for stage in (0, 1, 2, 3)}


@pytest.mark.e2e
@pytest.mark.parametrize("stage, strategy", [(0, "basic"), (1, "multilevel"), (2, "incremental"), (3, "async")])
def test_killed_and_restarted_run_equals_the_uninterrupted_one(lab, goldens, stage, strategy):
    run_dir, out = lab("fault", "--set", f"ds.stage={stage}", "--set", f"ckpt.strategy={strategy}",
                       "--set", "fault.step=5", "--set", "fault.rank=1")
    golden = losses_by_attempt(goldens[stage])[0]
    attempts = losses_by_attempt(run_dir)
    assert sorted(attempts) == [0, 1], "torchrun restarted the group once"
    assert attempts[0] == {s: golden[s] for s in range(5)}  # the first attempt, until rank 1 died at step 5
    assert attempts[1] == {s: golden[s] for s in attempts[1]}  # bit for bit, every resumed step
    assert max(attempts[1]) == 7 and min(attempts[1]) <= 4
    s = load_summary(run_dir)
    assert s["passed"] and s["fault"]["step"] == 5
    f = figures(s)
    assert f["steps lost"]["value"] == 5 - s["resumed_step"] <= f["steps lost"]["predicted"]
    assert f["time to recover"]["value"] > 0
    if strategy == "incremental":  # every 2 steps, full every 6: step 4 is a delta
        assert s["resumed_from"] == "step000004"
    if strategy == "multilevel":  # steps 2 and 4 went to the fast tier only
        assert s["resumed_from"] == "step000004"
    assert "Traceback" not in (run_dir / "rank_0.log").read_text().split("attempt 1")[-1]


@pytest.mark.e2e
def test_strategies_measure_what_they_cost(goldens, lab, tmp_path):
    s = load_summary(goldens[2])
    f = figures(s)
    # bytes of a full checkpoint against plscale estimate checkpoint (the RNG files and manifest on top)
    assert abs(f["bytes per full checkpoint"]["value"] - f["bytes per full checkpoint"]["predicted"]) \
        <= 0.02 * f["bytes per full checkpoint"]["predicted"]
    assert [c["step"] for c in s["checkpoints"]] == [2, 4, 6, 8]
    # a crashed attempt's half-written checkpoint, with its marker: must not count for the new one
    root = tmp_path / "checkpoints"
    stale = store.partial_dir(root, "step000008")
    stale.mkdir(parents=True)
    (stale / ".done-1").touch()
    (stale / "junk.pt").write_bytes(b"half")
    run_dir, _ = lab("async", "--set", "ds.stage=2", "--set", f"ckpt.dir={root}")
    a = load_summary(run_dir)
    for c in a["checkpoints"]:  # the stall is the snapshot; durable comes later
        assert 0 < c["stall_s"] < c["durable_s"]
    for entry in store.entries(root):  # every rank's files, nothing else
        assert entry.valid and "junk.pt" not in entry.manifest["files"]
        assert {"zero_pp_rank_0_mp_rank_00_optim_states.pt", "zero_pp_rank_1_mp_rank_00_optim_states.pt",
                "mp_rank_00_model_states.pt", "rank_0_rng.pt", "rank_1_rng.pt"} == set(entry.manifest["files"])
    assert (run_dir / "interval.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.e2e
def test_a_corrupted_newest_checkpoint_is_skipped_and_a_restart_prefers_its_own(lab, goldens, tmp_path):
    root = tmp_path / "checkpoints"
    shutil.copytree(goldens[2] / "checkpoints", root)
    victim = root / "step000008" / "mp_rank_00_model_states.pt"
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0xFF  # one flipped byte, same size: DeepSpeed alone would load it
    victim.write_bytes(bytes(data))
    # resume from the damaged folder, save step 8 anew, die at step 9, restart
    run_dir, out = lab("fault", "--set", "ds.stage=2", "--set", f"ckpt.resume={root}", "--steps", "10",
                       "--set", "fault.step=9")
    assert "skipped checkpoints/step000008" in out.stdout and "corrupted" in out.stdout
    attempts = losses_by_attempt(run_dir)
    golden = losses_by_attempt(goldens[2])[0]
    assert attempts[0] == {6: golden[6], 7: golden[7], 8: attempts[0][8]}  # resumed at 6, bit for bit
    s = load_summary(run_dir)
    assert s["resumed_from"] == "step000008" and s["resumed_step"] == 8  # its own, not the damaged one
    assert attempts[1] == {8: attempts[0][8], 9: attempts[1][9]}
    assert store.latest_tag(root) == "step000008" and not store.entries(root)[0].valid  # the source untouched


@pytest.mark.e2e
def test_a_full_disk_leaves_earlier_checkpoints_untouched(lab, goldens, tmp_path):
    root = tmp_path / "checkpoints"
    shutil.copytree(goldens[2] / "checkpoints", root)
    before = {e.tag: e.manifest for e in store.entries(root)}
    # files may not grow past 1 MiB: the first checkpoint write fails like a full disk would
    run_dir, out = lab("basic", "--set", "ds.stage=2", "--set", f"ckpt.dir={root}", "--set", f"ckpt.resume={root}",
                       "--steps", "10", expect=None, prefix="ulimit -f 1024")
    assert "Could not write checkpoint step000010" in out.stdout + out.stderr
    after = store.entries(root)
    assert {e.tag: e.manifest for e in after} == before and all(e.valid for e in after)
    assert store.latest_tag(root) == "step000008"


def same_batch(ranks: int) -> list:
    """The same global batch of 4 blocks on 1 or 2 ranks, no dropout, a checkpoint every 3 steps."""
    return ["--gpus", ranks, "--set", f"ds.grad_accum={2 // ranks}", "--set", "model.dropout=0",
            "--set", "ckpt.every=3"]


@pytest.mark.e2e
def test_resume_at_another_world_size_through_a_universal_checkpoint(lab, quick_cli):
    """Saved by 2 ranks, resumed on 1 (step 9); that run's own checkpoint (step 12) resumed on 2 again."""
    first, _ = lab("basic", *same_batch(2), "--steps", 11)
    for ranks, resumed in ((1, 9), (2, 12)):
        refused = quick_cli("lab", "run", "ckpt", *FAST, *same_batch(ranks), "--steps", 14,
                            "--set", f"ckpt.resume={first / 'checkpoints'}")
        assert refused.returncode == 2 and "--to universal" in refused.stderr, refused.stderr
        # in this process (the same main() as a subprocess; DeepSpeed's converter runs in its own either way)
        out = quick_cli("ckpt", "convert", first / "checkpoints", "--to", "universal", env={"DS_ACCELERATOR": "cpu"})
        assert out.returncode == 0, out.stdout + out.stderr
        second, _ = lab("basic", *same_batch(ranks), "--steps", 14,
                        "--set", f"ckpt.resume={first / 'checkpoints-universal'}", "--set", "ds.load_universal=true")
        assert load_summary(second)["resumed_step"] == resumed
        before, after = losses_by_attempt(first)[0], losses_by_attempt(second)[0]
        for step in (resumed, resumed + 1):  # the same global batch on 1 or 2 ranks; another summation order
            assert after[step] == pytest.approx(before[step], rel=1e-5), (ranks, step)
        first = second


@pytest.mark.e2e
def test_dcp_killed_and_restarted_run_equals_the_uninterrupted_one(lab, quick_cli):
    # FSDP2 checkpointed by torch.distributed.checkpoint, dropout on: model, AdamW, WarmupLR and each rank's streams
    golden, _ = lab("dcp")
    run_dir, _ = lab("fault", "--set", "engine=fsdp2", "--set", "fault.step=5", "--set", "fault.rank=1")
    before, attempts = losses_by_attempt(golden)[0], losses_by_attempt(run_dir)
    assert sorted(attempts) == [0, 1] and attempts[0] == {s: before[s] for s in range(5)}
    assert attempts[1] == {s: before[s] for s in attempts[1]} and min(attempts[1]) == 4   # resumed at step 4, bit for bit
    s = load_summary(run_dir)
    assert s["passed"] and s["resumed_from"] == "step000004"
    assert (golden / "checkpoints" / "step000008" / ".metadata").is_file()
    f = figures(load_summary(golden))["bytes per full checkpoint"]   # 12Ψ + the tied head again, + 0.6% of records
    assert f["predicted"] <= f["value"] <= 1.05 * f["predicted"]
    # a DeepSpeed run is told what the folder holds, before launch
    refused = quick_cli("lab", "run", "ckpt", *FAST, "--set", f"ckpt.resume={golden / 'checkpoints'}")
    assert refused.returncode == 2 and "add --set engine=fsdp2" in refused.stderr


@pytest.mark.e2e
def test_dcp_resumes_at_another_world_size_as_it_is(lab):
    """Saved by 2 ranks, resumed on 1 (step 9); that run's own checkpoint (step 12) resumed on 2 again."""
    first, _ = lab("dcp", *same_batch(2), "--steps", 11)
    for ranks, resumed in ((1, 9), (2, 12)):
        second, _ = lab("dcp", *same_batch(ranks), "--steps", 14, "--set", f"ckpt.resume={first / 'checkpoints'}")
        s = load_summary(second)
        assert s["passed"] and s["resumed_step"] == resumed
        before, after = losses_by_attempt(first)[0], losses_by_attempt(second)[0]
        for step in (resumed, resumed + 1):  # the same global batch of 4 blocks, each rank's rows read from the other's
            assert after[step] == pytest.approx(before[step], rel=1e-5), (ranks, step)
        first = second


@pytest.mark.parametrize("args, message", [
    (["--set", "fault.step=8"], "fault.step 8 is beyond the run's 8 steps"),
    (["--set", "fault.step=3", "--set", "fault.rank=2"], "fault.rank 2: this run has ranks 0 to 1"),
    (["--set", "ckpt.strategy=lazy"], "Unknown ckpt.strategy 'lazy'"),
    (["--set", "ckpt.every=0"], "ckpt.every 0"),
    (["--set", "ckpt.strategy=incremental", "--set", "ckpt.full_every=5"],
     "ckpt.full_every 5 is not a multiple of ckpt.every 2"),
    (["--set", "ckpt.resume=/nonexistent/checkpoints"], "No checkpoint folder at /nonexistent/checkpoints"),
    (["--set", "ckpt.dir=/dev/null/checkpoints"], "Cannot write checkpoints to /dev/null/checkpoints"),
    (["--max-restarts", "1", "--launcher", "deepspeed"], "torchrun"),
    (["--set", "ds.load_universal=true"], "add --set ckpt.resume=FOLDER"),
    (["--set", "engine=fsdp3"], "engine 'fsdp3': use deepspeed"),
    (["--variant", "dcp", "--set", "ds.precision=bf16"], "engine fsdp2 runs fp32"),
    (["--set", "ds.load_universal=true", "--set", "ds.stage=0", "--set", "ckpt.resume=x"],
     "Universal checkpoints load at ZeRO stages 1-3"),
])
def test_bad_checkpoint_settings_fail_before_launch(quick_cli, args, message):
    cli = quick_cli
    out = cli("lab", "run", "ckpt", *FAST, *args)
    assert out.returncode == 2, out.stdout + out.stderr
    assert message in out.stderr and "Traceback" not in out.stderr
    assert not cli.runs.exists() or not any(cli.runs.iterdir())


@pytest.mark.e2e
def test_resume_refuses_another_model_or_stage_or_a_folder_without_latest(lab, goldens, quick_cli, tmp_path):
    cli = quick_cli  # refused before launch: in this process
    root = goldens[2] / "checkpoints"
    other_model = cli("lab", "run", "ckpt", *FAST, "--set", "model.preset=small", "--set", f"ckpt.resume={root}")
    assert other_model.returncode == 2 and "another model" in other_model.stderr
    other_stage = cli("lab", "run", "ckpt", *FAST, "--set", "ds.stage=3", "--set", f"ckpt.resume={root}")
    assert other_stage.returncode == 2 and "saved at ZeRO-2, this run is ZeRO-3" in other_stage.stderr
    bare = tmp_path / "bare"
    shutil.copytree(root, bare)
    (bare / "latest").unlink()
    no_latest = cli("lab", "run", "ckpt", *FAST, "--set", f"ckpt.resume={bare}")
    assert no_latest.returncode == 2 and "no `latest` file" in no_latest.stderr
    run_dir_given = cli("lab", "run", "ckpt", *FAST, "--set", f"ckpt.resume={goldens[2]}")
    assert run_dir_given.returncode == 2 and "is a run directory" in run_dir_given.stderr
    busy_dir = cli("lab", "run", "ckpt", *FAST, "--gpus", "1", "--set", "ds.grad_accum=2", "--set", f"ckpt.dir={root}")
    assert busy_dir.returncode == 2 and "already holds checkpoints of ZeRO-2 on 2 ranks" in busy_dir.stderr
    assert store.latest_tag(root) == "step000008"  # nothing written where we resumed from
