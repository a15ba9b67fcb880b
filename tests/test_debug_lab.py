"""Lab 12 (debug): each failure variant runs from the CLI on 2 CPU ranks and ends, within its
timeout, with a diagnosis that names the guilty rank and the call; bad settings are refused
before launch. And the diagnosis's reader on Flight Recorder records made by hand, checked
against torch's own analyser (torch.distributed.flight_recorder), an independent reading."""

import pickle
import time

import pytest

from conftest import figures, load_summary, only_run, run_cli
from plscale.run import diagnose


HANG_TIMEOUT_S = 15  # dist.timeout_s of the hang: how long the hung run waits before the timeout ends it


def launch(tmp_path, *args, timeout=240):
    runs = tmp_path / "runs"
    started = time.monotonic()
    done = run_cli("lab", "run", *args, "--gpus", "2", "--cpu", env={"PLSCALE_RUNS_DIR": str(runs), "COLUMNS": "240"},
                   timeout=timeout)
    return done, only_run(runs), time.monotonic() - started


def checks(run_dir) -> dict:
    return {c["name"]: c for c in load_summary(run_dir)["checks"]}


@pytest.mark.e2e
def test_a_skipped_collective_ends_in_a_timeout_that_names_the_rank(tmp_path, quick_cli):
    """Rank 1 skips step 3: nothing fails there (gloo pairs collectives by order), the hang comes at
    the end; the 10 s timeout ends it, and the Flight Recorder names where rank 1 parted. (10 s: the
    run sits idle that long; the ranks' first collectives, started together, meet well within it.)"""
    done, run_dir, seconds = launch(tmp_path, "hang", "--steps", "6", "--set", "debug.step=3",
                                    "--set", f"dist.timeout_s={HANG_TIMEOUT_S}")
    out = done.stdout
    assert done.returncode != 0, out[-3000:]
    assert "collective #" in out and "default_pg (group 0) is where the ranks part: rank(s) 1 issued barrier where the others issued all_gather" in out, out[-4000:]
    assert "labs/12_debug/debug.py" in out and "Culprit rank 1" in out, out[-4000:]
    assert "rank 1: labs/12_debug/debug.py" in (run_dir / "diagnosis.txt").read_text()
    assert sorted(p.name for p in (run_dir / "flight").glob("rank_*.pkl")) == ["rank_0.pkl", "rank_1.pkl"]
    # the first rank to time out exits; the other then reads a closed connection, or times out too
    assert any("Timed out" in p.read_text() for p in run_dir.glob("rank_*.error"))
    assert seconds < HANG_TIMEOUT_S + 150, f"ended {seconds:.0f} s after launch: the timeout did not end it"
    report = quick_cli("report", run_dir)  # later, the report says why it did not finish (read in this process)
    assert report.returncode == 2 and "It failed: collective #" in report.stderr, report.stderr


@pytest.mark.e2e
def test_mismatched_shapes_are_named_in_one_line(tmp_path):
    done, run_dir, _ = launch(tmp_path, "mismatch", "--steps", "3")
    assert done.returncode != 0
    [line] = [l for l in done.stdout.splitlines() if l.startswith("collective #")]
    # the first layer (512 x 784 weights) frozen on rank 1 only: its bucket is that much smaller
    full = 784 * 512 + 512 + 512 * 512 + 512 + 512 * 10 + 10
    assert f"of [{full}]" in line and f"of [{full - 784 * 512}]" in line and "DETAIL" in line, line
    assert "rank 0" in line and "rank 1" in line


@pytest.mark.e2e
def test_a_straggler_is_named_by_the_run_and_by_the_trace(tmp_path):
    done, run_dir, _ = launch(tmp_path, "straggler", "--steps", "6", "--profile", "4")
    assert done.returncode == 1, done.stdout[-3000:]  # the pace check fails; the others pass
    c = checks(run_dir)
    assert not c["ranks keep pace"]["ok"] and "the slowest, rank 1" in c["ranks keep pace"]["detail"]
    assert c["replicas identical"]["ok"] and c["gradients finite before the all-reduce"]["ok"]
    f = figures(load_summary(run_dir))
    assert f["slowest rank"]["value"] == 1
    assert f["slowest rank (the others wait for it)"]["value"] == 1  # from the merged trace alone
    # rank 0 waits for rank 1's 100 ms sleep in the all-reduce
    assert f["others' wait for the averaged gradient"]["value"] > 50
    assert (run_dir / "pace.png").stat().st_size > 5_000 and (run_dir / "profile" / "timeline.png").is_file()


@pytest.mark.e2e
def test_a_nan_from_one_rank_is_caught_before_the_weights(tmp_path):
    done, run_dir, _ = launch(tmp_path, "nan", "--steps", "6", "--set", "debug.step=2")
    assert done.returncode == 1
    c = checks(run_dir)
    finite = c["gradients finite before the all-reduce"]
    assert not finite["ok"] and finite["detail"].startswith("step 2: rank 1:") and "dataset rows" in finite["detail"]
    assert c["weights finite on every rank"]["ok"] and c["replicas identical"]["ok"]
    assert figures(load_summary(run_dir))["non-finite gradient"]["value"] == 1
    assert len((run_dir / "metrics.jsonl").read_text().splitlines()) == 1  # step 1 taken, step 2 not


@pytest.mark.e2e
def test_without_detail_the_same_mismatch_names_nothing(tmp_path):
    """`--set dist.debug=OFF` (YAML reads OFF as false): the bug runs unchecked and gloo fails
    without naming the shapes; the run still ends, non-zero, well before the timeout."""
    done, run_dir, _ = launch(tmp_path, "mismatch", "--steps", "3", "--set", "dist.debug=OFF")
    assert done.returncode != 0 and "Detected mismatch" not in done.stdout
    assert (run_dir / "stacks").is_dir()


@pytest.mark.e2e
def test_out_of_memory_is_predicted_then_refused_by_the_allocator(tmp_path):
    """Each rank may allocate 160 MiB: the memory model says the step needs more, the first step
    passes (no Adam moments yet), the second is refused by torch's CPU allocator, and the diagnosis
    names the ranks, the lab's line and the fixes."""
    done, run_dir, _ = launch(tmp_path, "oom", "--steps", "3")
    out = done.stdout
    assert done.returncode != 0, out[-3000:]
    [this_run] = [line for line in out.splitlines() if line.strip().startswith("this run")]
    assert "does NOT fit" in this_run, this_run
    fixes = [line for line in out.splitlines() if line.strip().startswith(("micro-batch 1", "full recomputation",
                                                                            "states sharded"))]
    assert len(fixes) == 3 and all(line.rstrip().endswith("fits") for line in fixes), fixes
    diagnosis = (run_dir / "diagnosis.txt").read_text()
    assert diagnosis.startswith("out of memory (rank ") and " MiB request refused" in diagnosis.splitlines()[0], diagnosis
    assert "labs/12_debug/oom.py" in diagnosis and "DefaultCPUAllocator: can't allocate memory" in diagnosis
    assert len((run_dir / "metrics.jsonl").read_text().splitlines()) == 1  # step 0 fitted, step 1 did not


@pytest.mark.e2e
def test_each_fix_fits_its_peak_is_the_models_and_the_training_is_the_same(tmp_path):
    """Each fix runs under the limit, its step's peak within 2% of the model (the allocator's
    history), and the replicas' fixes train the same: the same weights, batches and global batch,
    so the same loss (FSDP2 initialises its shards with its own random draws)."""
    losses = {}
    for fix in ("oom-micro-batch", "oom-recompute", "oom-offload", "oom-fsdp2"):
        done, run_dir, _ = launch(tmp_path / fix, fix, "--steps", "3")
        assert done.returncode == 0, (fix, done.stdout[-3000:])
        c = checks(run_dir)
        assert c["the memory model said it would fit"]["ok"], fix
        assert c["the step's peak matches the memory model, every rank"]["ok"], (fix, c)
        f = figures(load_summary(run_dir))
        assert f["step's peak per rank"]["value"] < 160 and f["data used per rank"]["value"] < 160, (fix, f)
        assert len((run_dir / "metrics.jsonl").read_text().splitlines()) == 3
        losses[fix] = f["final loss"]["value"]
        # MFU of the one timed step (neither the first nor the recorded one); full recomputation's rerun in HFU only
        assert 0 < f["MFU"]["value"] < 100 and "median of 1 timed steps" in f["throughput"]["note"], (fix, f)
        assert (f["HFU"]["value"] > f["MFU"]["value"]) == (fix == "oom-recompute"), (fix, f)
    same = [losses[k] for k in ("oom-micro-batch", "oom-recompute", "oom-offload")]
    assert max(same) - min(same) <= 2e-3, losses


@pytest.mark.parametrize("name, setting, message", [("debug", "debug.rank=2", "debug.rank 2: there are 2 ranks"),
                                                    ("debug", "debug.step=99", "debug.step 99"),
                                                    ("debug", "dist.debug=LOUD", "dist.debug 'LOUD'"),
                                                    ("debug", "dist.timeout_s=0", "dist.timeout_s 0"),
                                                    ("oom", "train.steps=2", "the oom runs take 3 or more"),
                                                    ("oom-fsdp2", "oom.recompute=half", "oom.recompute 'half'")])
def test_bad_settings_are_refused_before_launch(quick_cli, name, setting, message):
    done = quick_cli("lab", "run", name, "--gpus", "2", "--cpu", "--set", setting)
    assert done.returncode == 2 and message in done.stderr, done.stderr
    assert not quick_cli.runs.exists() or not list(quick_cli.runs.iterdir())


def test_profiling_an_oom_run_is_refused_before_launch(quick_cli):
    """The oom runs record with torch.profiler themselves, under the limit: one profiler at a time."""
    done = quick_cli("lab", "run", "oom-fsdp2", "--gpus", "2", "--cpu", "--profile", "1")
    assert done.returncode == 2 and "--profile: the oom runs record their last step" in done.stderr, done.stderr
    assert not quick_cli.runs.exists() or not list(quick_cli.runs.iterdir())


def entry(seq, op, sizes, line, pg=("0", "default_pg")):
    return {"collective_seq_id": seq, "profiling_name": f"gloo:{op}", "input_sizes": sizes, "output_sizes": sizes,
            "input_dtypes": ["Float"] * len(sizes), "output_dtypes": ["Float"] * len(sizes), "process_group": pg,
            "pg_id": 0, "record_id": seq - 1, "op_id": seq, "p2p_seq_id": 0, "is_p2p": False, "state": "scheduled",
            "retired": False, "thread_id": "1", "thread_name": "python3", "time_created_ns": seq,
            "time_discovered_started_ns": None, "time_discovered_completed_ns": None, "timeout_ms": 10000,
            "frames": [{"name": op, "filename": "/venv/lib/python3.11/site-packages/torch/distributed/c10d.py",
                        "line": 1}, {"name": "<module>", "filename": "/lab/train.py", "line": line}]}


def dump(entries, world=3):
    return {"version": "2.10", "comm_lib_version": "gloo", "entries": entries,
            "pg_config": {"": {"name": "", "desc": "", "ranks": str(list(range(world)))}},
            "pg_status": {"0": {"last_enqueued_collective": entries[-1]["collective_seq_id"],
                                "last_started_collective": -1, "last_completed_collective": -1}}}


def test_the_reader_names_the_rank_that_parts_and_agrees_with_torch(tmp_path):
    """3 ranks, 4 all-reduces each; rank 2 skipped one, so its #4 is the barrier after the loop
    while ranks 0 and 1 issue their 4th all-reduce. torch's analyser finds the same collective and
    the same mismatch; it blames relative to the rank it reads first, the reader by majority."""
    loop = [entry(s, "all_reduce", [[100]], 10) for s in range(1, 5)]
    recs = {0: dump(loop), 1: dump(loop), 2: dump(loop[:3] + [entry(4, "barrier", [], 20)])}
    (tmp_path / "flight").mkdir()
    for rank, rec in recs.items():
        (tmp_path / "flight" / f"rank_{rank}.pkl").write_bytes(pickle.dumps(rec))
    lines = diagnose.lines(tmp_path, None)
    assert lines[0] == ("collective #4 of default_pg (group 0) is where the ranks part: rank(s) 2 issued barrier "
                        "where the others issued all_reduce of [100]")
    assert "  rank 2: barrier at /lab/train.py:20 (<module>)" in lines
    assert "  Collective sequence number: 4 has errors" in lines
    assert any("COLLECTIVE_TYPE_MISMATCH" in line and "'barrier'" in line and "'all_reduce'" in line
               for line in lines), lines
    # a live run where rank 2 has simply not issued #4 yet is not a disagreement
    behind = {**recs, 2: dump(loop[:3])}
    assert diagnose.disagreement(behind, live=True) == []
    assert "rank 2: never issued it (its last was #3)" in "\n".join(diagnose.disagreement(behind))


def test_two_groups_a_silent_rank_and_a_rank_that_never_issued(tmp_path):
    """Sub-groups are told apart by name (every new_group() is described "undefined"); a rank that
    never issued the parting collective is said so; a rank that left no record is named."""
    sub = ("1", "undefined")
    a = [entry(1, "all_reduce", [[8]], 10), entry(1, "all_gather", [[4]], 30, pg=sub), entry(2, "all_reduce", [[8]], 11)]
    b = [entry(1, "all_reduce", [[8]], 10), entry(1, "all_gather", [[4]], 30, pg=sub)]
    recs = {0: dump(a, 3), 1: dump(b, 3)}
    lines = diagnose.disagreement(recs)
    assert lines[0] == ("collective #2 of default_pg (group 0) is where the ranks part: rank(s) 1 issued nothing "
                        "where the others issued all_reduce of [8]")
    assert "  rank 1: never issued it (its last was #1)" in lines
    assert not any("group 1" in line for line in lines)  # the sub-group agrees
    (tmp_path / "flight").mkdir()
    (tmp_path / "pids").mkdir()
    for rank in (0, 1, 2):
        (tmp_path / "pids" / f"rank_{rank}").write_text("1 host\n")
    for rank, rec in recs.items():
        (tmp_path / "flight" / f"rank_{rank}.pkl").write_bytes(pickle.dumps(rec))
    assert "no Flight Recorder record from rank(s) 2" in "\n".join(diagnose.lines(tmp_path, None))


def test_a_record_that_is_not_plain_data_is_refused(tmp_path):
    """A run directory may come from elsewhere (plscale runpod fetch): unpickling never builds objects."""
    (tmp_path / "flight").mkdir()
    (tmp_path / "flight" / "rank_0.pkl").write_bytes(pickle.dumps({"entries": [], "path": tmp_path}))
    (tmp_path / "flight" / "rank_1.pkl").write_bytes(pickle.dumps(dump([entry(1, "barrier", [], 1)], 2)))
    assert set(diagnose.records(tmp_path)) == {1}


@pytest.mark.parametrize("message, said", [
    ("RuntimeError: [enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate memory: you tried "
     "to allocate 1081344 bytes. Error code 12 (Cannot allocate memory)", "rank 1: a 1.03 MiB request refused"),
    ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.10 GiB",
     "rank 1: a 2.00 GiB request refused"),
    ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 512 bytes. GPU 0", "rank 1: a 512 bytes request"),
    ("Traceback (most recent call last):\nMemoryError", "rank 1: MemoryError, no size said"),
    ("terminate called after throwing an instance of 'std::bad_alloc'\n  what():  std::bad_alloc",
     "rank 1: std::bad_alloc, no size said"),
])
def test_each_allocators_refusal_reads_as_out_of_memory(tmp_path, message, said):
    """torch's CPU and CUDA allocators (the CUDA wording from torch's c10/cuda/CUDACachingAllocator.cpp),
    Python's and C++'s own: each read as out of memory, with the request's size where it is said."""
    (tmp_path / "rank_1.error").write_text(message)
    (tmp_path / "rank_0.error").write_text("RuntimeError: Connection closed by peer")
    [line] = diagnose.out_of_memory(tmp_path)
    assert line.startswith(f"out of memory ({said}") and "rank 0" not in line, line
    (tmp_path / "rank_1.error").write_text("RuntimeError: Timed out waiting 20000ms")
    assert diagnose.out_of_memory(tmp_path) == []
