"""`plscale lab run LAB --profile STEP`: one step recorded on every rank with torch.profiler,
merged into one trace (plscale/rank/profile.py, plscale/rank/trace.py).

First the reader, on traces written by hand whose overlap is known by construction; then the
real CLI on 2 CPU ranks for the three steps the lessons show: DDP's bucketed all-reduces against
the backward (lab 02), ZeRO-3's gathers (lab 04), the pipeline's sends, receives and bubble (lab 05).
Each trace is valid trace-event JSON with every rank's compute and collectives in it.
"""

import json

import pytest

from conftest import figures, load_summary, only_run, run_cli
from plscale.rank import trace


def x(name, ts, dur, tid=1, pid=1, cat="cpu_op", **args):
    return {"ph": "X", "name": name, "ts": ts, "dur": dur, "pid": pid, "tid": tid, "cat": cat, "args": args}


def test_overlap_of_a_hand_made_cpu_trace():
    """Main thread (tid == pid) busy 0-100 us with an all-reduce call at 60-62; gloo's thread runs the
    all-reduce 60-150: 40 us of it hidden behind compute, 50 exposed; nothing idle until 150, then
    a last op at 170-180 leaves 20 us idle."""
    events = [x("aten::mm", 0, 60), x("c10d::allreduce_", 60, 2), x("aten::mm", 62, 38),
              x("gloo:all_reduce", 60, 90, tid=7, cat="user_annotation"), x("aten::add_", 170, 10)]
    s = trace.stats(trace.parts({"traceEvents": events}))
    assert (s["compute_ms"], s["comm_ms"], s["hidden_ms"], s["exposed_ms"]) == (0.108, 0.09, 0.038, 0.052)
    assert (s["step_ms"], s["idle_ms"]) == (0.18, 0.02)
    assert s["hidden_fraction"] == round(38 / 90, 4)


def test_a_receive_on_the_main_thread_is_waiting_not_compute():
    """gloo's send and recv block the caller: a stage waiting for its input (the bubble) is not busy."""
    events = [x("aten::mm", 0, 10), x("gloo:recv", 10, 80, cat="user_annotation"), x("aten::mm", 90, 10)]
    s = trace.stats(trace.parts({"traceEvents": events}))
    assert (s["compute_ms"], s["comm_ms"], s["hidden_ms"], s["idle_ms"]) == (0.02, 0.08, 0.0, 0.0)


def test_gpu_kernels_decide_on_a_gpu_trace():
    """With kernels in the trace, compute is the non-NCCL kernels and communication the NCCL ones."""
    events = [x("aten::mm", 0, 5), x("sm90_gemm", 10, 100, tid=7, cat="kernel"),
              x("ncclDevKernel_AllReduce_Sum_f32_RING_LL", 50, 100, tid=8, cat="kernel")]
    s = trace.stats(trace.parts({"traceEvents": events}))
    assert (s["compute_ms"], s["comm_ms"], s["hidden_ms"]) == (0.1, 0.1, 0.06)


def test_merge_names_each_rank_and_labels_bytes():
    a = {"traceEvents": [x("aten::mm", 1000, 10, pid=11, tid=11),
                         x("gloo:all_reduce", 1005, 10, pid=11, tid=12, **{"Input Dims": [[256]],
                                                                            "Input type": ["float"]})]}
    b = {"traceEvents": [x("aten::mm", 1002, 10, pid=22, tid=22)]}
    merged = trace.merge({0: a, 1: b})
    names = {e["pid"]: e["args"]["name"] for e in merged["traceEvents"] if e.get("name") == "process_name"}
    assert names == {0: "rank 0", 1: "rank 1"}
    [gloo] = [e for e in merged["traceEvents"] if e["name"] == "gloo:all_reduce"]
    assert gloo["args"]["bytes"] == 1024 and gloo["ts"] == 5.0 and gloo["pid"] == 0


def test_the_flight_recorder_names_each_collectives_group():
    """The profiler's events carry no process group; the Flight Recorder's record of the same step
    does, in the order the rank issued them: the runs (gloo's names, as the record's) and the calls."""
    a = {"traceEvents": [x("c10d::allreduce_", 1000, 3, pid=1, tid=1), x("gloo:all_reduce", 1001, 9, pid=1, tid=7),
                         x("c10d::_allgather_base_", 1004, 3, pid=1, tid=1), x("gloo:all_gather", 1010, 5, pid=1, tid=7)]}
    issued = [{"op": "gloo:all_reduce", "group": ["0", "default_pg"], "seq": 7, "sizes": [[4]]},
              {"op": "gloo:all_gather", "group": ["1", "undefined"], "seq": 3, "sizes": [[2]]}]
    assert trace.label_groups(a, issued) == 4
    labels = [(e["name"], e["args"]["group"], e["args"]["seq"]) for e in a["traceEvents"]]
    assert labels == [("c10d::allreduce_", "default_pg (group 0)", 7), ("gloo:all_reduce", "default_pg (group 0)", 7),
                      ("c10d::_allgather_base_", "group 1", 3), ("gloo:all_gather", "group 1", 3)]
    b = {"traceEvents": [x("gloo:all_gather", 1001, 9, pid=1, tid=7), x("gloo:all_reduce", 1010, 5, pid=1, tid=7)]}
    assert trace.label_groups(b, issued) == 0 and not any("group" in e["args"] for e in b["traceEvents"])


def profiled(tmp_path, lab: str, *args) -> tuple[dict, dict, dict]:
    runs = tmp_path / "runs"
    done = run_cli("lab", "run", lab, "--gpus", "2", "--cpu", "--profile", "2", *args, env={"PLSCALE_RUNS_DIR": str(runs)})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    run_dir = only_run(runs)
    merged = json.loads((run_dir / "profile" / "trace.json").read_text())
    assert (run_dir / "profile" / "timeline.png").stat().st_size > 10_000
    assert not list((run_dir / "profile").glob("rank*.json"))  # merged, not left beside it
    per_rank = json.loads((run_dir / "profile" / "profile.json").read_text())["ranks"]
    return merged, per_rank, figures(load_summary(run_dir))


def rank_events(merged: dict, rank: int) -> list[dict]:
    return [e for e in merged["traceEvents"] if e.get("pid") == rank and e.get("ph") == "X"]


def check_every_rank(merged: dict, collective: str) -> None:
    """Valid trace-event JSON: each rank a process, its compute ops and its collectives in it."""
    for rank in (0, 1):
        evs = rank_events(merged, rank)
        assert all(isinstance(e["ts"], (int, float)) and e["dur"] >= 0 for e in evs)
        assert any(e["name"].startswith("aten::") for e in evs), rank
        comm = [e for e in evs if e["name"].startswith(collective)]
        assert comm and all(e["args"].get("bytes", 0) > 0 for e in comm), (rank, collective)


@pytest.mark.e2e
def test_ddp_buckets_overlap_the_backward(tmp_path, shared_data):
    """Small buckets: the first all-reduces start while the backward still runs, so some of the
    communication is hidden behind it (the lesson of DDP's buckets), on every rank."""
    merged, per_rank, f = profiled(tmp_path, "imdb-ddp", "--steps", "4", "--data-dir", shared_data("imdb").parent,
                                   "--set", "train.bucket_cap_mb=0.05", "--set", "data.train_samples=512",
                                   "--set", "data.test_samples=128", "--set", "data.max_len=64")
    check_every_rank(merged, "gloo:all_reduce")
    assert all(r["hidden_ms"] > 0 for r in per_rank.values()), per_rank
    assert 0 < f["communication hidden behind compute"]["value"] <= 100
    assert f["profiled step"]["value"] == 2


@pytest.mark.e2e
def test_zero3_gathers_are_in_the_trace(tmp_path):
    merged, per_rank, f = profiled(tmp_path, "zero3", "--steps", "4", "--set", "model.preset=tiny",
                                   "--set", "model.seq=64", "--set", "data.val_blocks=16")
    check_every_rank(merged, "gloo:all_gather")
    # each collective labelled with its group from the Flight Recorder; both ranks issued the same ones
    issued = [sorted((e["args"]["seq"], e["args"]["group"], e["name"]) for e in rank_events(merged, r)
                     if e["name"].startswith("gloo:")) for r in (0, 1)]
    assert issued[0] and issued[0] == issued[1], issued   # the same collective under each number on both ranks
    assert {group for _, group, _ in issued[0]} == {"default_pg (group 0)"}
    seqs = [seq for seq, _, _ in issued[0]]
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))   # one group: every number of the step, once


@pytest.mark.e2e
def test_the_pipeline_bubble_is_waiting_in_the_trace(tmp_path):
    """2 stages of 1F1B: each stage's receives are in its trace, and the waiting (exposed communication
    and idle) is a real part of its step: the bubble."""
    merged, per_rank, f = profiled(tmp_path, "1f1b", "--launcher", "torchrun", "--steps", "3", "--set", "model.seq=32",
                                   "--set", "bubble.micro_batches=[2]", "--set", "bubble.steps=2",
                                   "--set", "ds.grad_accum=4")
    check_every_rank(merged, "gloo:")
    assert any(e["name"] == "gloo:recv" for e in rank_events(merged, 0) + rank_events(merged, 1))
    # the pipeline's own groups name its collectives; its sends and receives (not in gloo's recorder) have bytes only
    collectives = [e for r in (0, 1) for e in rank_events(merged, r)
                   if e["name"].startswith("gloo:") and e["name"] not in ("gloo:send", "gloo:recv")]
    assert collectives and all(e["args"]["group"].startswith(("group ", "default_pg")) for e in collectives)
    for r in per_rank.values():
        assert r["exposed_ms"] + r["idle_ms"] > 0.02 * r["step_ms"], per_rank


@pytest.mark.parametrize("args, words", [
    (["zero3", "--steps", "4", "--profile", "4"], "steps are 0 to 3"),
    (["zero3", "--steps", "4", "--profile", "0"], "step 0 holds the setup"),
    (["jax-gspmd", "--profile", "1"], "jax.profiler"),
])
def test_bad_profile_step_is_refused_before_launch(quick_cli, args, words):
    done = quick_cli("lab", "run", *args, "--gpus", "2", "--cpu")   # refused before launch: in this process
    assert done.returncode == 2 and words in done.stderr and done.stderr.count("error:") == 1, done.stderr
    assert not quick_cli.runs.exists() or not any(quick_cli.runs.iterdir())
