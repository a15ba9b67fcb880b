"""Run directories are claimed atomically: runs started in the same second never share one."""

from concurrent.futures import ThreadPoolExecutor

from plscale.run import rundir


def test_same_second_runs_get_distinct_directories(tmp_path, monkeypatch):
    monkeypatch.setattr(rundir.time, "strftime", lambda fmt: "20260101-000000")
    named = rundir.new_run_dir("lab", "v", tmp_path, create=False)
    with ThreadPoolExecutor(8) as pool:
        claimed = list(pool.map(lambda _: rundir.new_run_dir("lab", "v", tmp_path), range(8)))
    assert len(set(claimed)) == 8 and all(p.is_dir() for p in claimed)
    assert named in claimed  # a name only reserves nothing; the first claim takes it
    assert rundir.new_run_dir("lab", "v", tmp_path, create=False) not in claimed
