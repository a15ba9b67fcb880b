"""Run directories are claimed atomically: runs started in the same second never share one."""

from concurrent.futures import ThreadPoolExecutor

from plscale.lab import rundir


def test_same_second_runs_get_distinct_directories(tmp_path, monkeypatch):
    monkeypatch.setattr(rundir.time, "strftime", lambda fmt: "20260101-000000")
    named = rundir.new_run_dir("lab", "v", tmp_path, create=False)
    with ThreadPoolExecutor(8) as pool:
        claimed = list(pool.map(lambda _: rundir.new_run_dir("lab", "v", tmp_path), range(8)))
    assert len(set(claimed)) == 8 and all(p.is_dir() for p in claimed)
    assert named in claimed  # a name only reserves nothing; the first claim takes it
    assert rundir.new_run_dir("lab", "v", tmp_path, create=False) not in claimed


def test_node_scratch_is_per_run_and_cleared(tmp_path):
    from plscale.lab.rundir import clear_node_scratch, node_scratch

    a, b = tmp_path / "x" / "20260101-000000-ckpt-basic", tmp_path / "y" / "20260101-000000-ckpt-basic"
    assert node_scratch(a) != node_scratch(b)  # same name, other runs folder: never shared
    node_scratch(a).mkdir(parents=True)
    (node_scratch(a) / "fast").mkdir()
    clear_node_scratch(a)
    assert not node_scratch(a).exists()
