"""The collectives lab end to end on 2 CPU ranks: the tour, the ring, the benchmark (CSV, PNG,
nccl-tests table), bad input (exit 2 before anything runs) and `plscale doctor --distributed`."""

import socket

import pytest

from conftest import figures, load_summary, only_run
from plscale.predict import busbw


@pytest.mark.e2e
def test_tour_shows_every_rank_before_and_after(cli):
    result = cli("lab", "run", "collectives", "--gpus", "2", "--cpu")
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    for name in ("broadcast", "reduce", "all_reduce", "all_gather", "reduce_scatter", "all_to_all", "scatter",
                 "gather", "barrier"):
        assert f"\n{name}: " in out
    assert "DDP" in out and "ZeRO-3" in out and "expert parallelism" in out  # what each is used for
    assert "│ 1    │ 11 12  │ 1 2 11 12 │" in out  # all_gather: rank 1 had 11 12, now has everyone's
    summary = load_summary(only_run(cli.runs))
    assert summary["passed"]
    assert {c["name"] for c in summary["checks"]} == {
        "broadcast", "reduce", "all_reduce", "all_gather", "reduce_scatter", "all_to_all", "scatter", "gather",
        "barrier", "all_reduce == reduce_scatter + all_gather"}
    assert figures(summary)["primitives that match their definition"]["value"] == 8


@pytest.mark.e2e
def test_ring_variant_traces_and_checks_the_ring(cli):
    result = cli("lab", "run", "ring-allreduce", "--gpus", "2", "--cpu", "--set", "ring.sizes=1,7,1001",
                 "--set", "ring.dtypes=float32,bfloat16,int8")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "reduce-scatter 1 │ 1 11" in result.stdout  # rank 0's second chunk already holds both parts
    summary = load_summary(only_run(cli.runs))
    assert summary["passed"]
    found = figures(summary)
    assert found["parity cases equal to dist.all_reduce"]["value"] == 9
    assert found["ring: bytes sent per rank / S"]["value"] == 1.0  # 2(N-1)/N with N = 2


@pytest.mark.e2e
def test_bench_prints_nccl_tests_table_and_writes_csv_and_png(cli, tmp_path):
    result = cli("bench", "collectives", "--gpus", "2", "--cpu", "--sizes", "32K-64K", "--ops", "all_reduce,all_gather",
                 "--iters", "3", "--budget", "0.2", "--out", tmp_path / "figs")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "# all_reduce on 2 ranks over gloo: busbw = algbw x 1" in result.stdout
    assert "# all_gather on 2 ranks over gloo: busbw = algbw x 0.5" in result.stdout
    assert "#wrong" in result.stdout and "ring/lib" in result.stdout
    rows = busbw.read_csv(tmp_path / "figs" / "busbw.csv")
    assert [(r["op"], r["size"]) for r in rows] == [("all_reduce", 32768), ("all_reduce", 65536),
                                                     ("all_gather", 32768), ("all_gather", 65536)]
    for r in rows:
        assert r["wrong"] == 0 and 1 <= r["iters"] <= 3
        assert 0 < r["time_us"] < 5e6  # a guard against a hang, not a speed target
        # nccl-tests' bus factors for 2 ranks: all_reduce 2(N-1)/N = 1, all_gather (N-1)/N = 1/2
        assert r["busbw"] / r["algbw"] == pytest.approx({"all_reduce": 1.0, "all_gather": 0.5}[r["op"]], rel=0.02)
        # algbw is bytes per second of one call: GB/s x microseconds x 1e3 gives the message size back
        assert r["algbw"] * r["time_us"] * 1e3 == pytest.approx(r["size"], rel=0.02)
    assert all(r["ring_time_us"] > 0 and r["naive_time_us"] > 0 for r in rows[:2])  # timed beside the library
    assert (tmp_path / "figs" / "busbw.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("args, message", [
    (["--sizes", "12Q"], "Size '12Q' does not parse"),
    (["--sizes", "32K-1T"], "Messages of 1T need about"),
    (["--ops", "all_reduce,allgather"], "Unknown collective 'allgather'"),
    (["--sizes", "64M-32K"], "runs backwards"),
    (["--dtype", "float8"], "Unknown dtype"),
])
def test_bench_bad_input_exits_2_with_one_line_and_runs_nothing(quick_cli, args, message):
    cli = quick_cli
    result = cli("bench", "collectives", "--gpus", "2", "--cpu", *args)
    assert result.returncode == 2
    assert message in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert not cli.runs.exists()


@pytest.mark.e2e
def test_doctor_distributed_reports_every_rank(cli):
    result = cli("doctor", "--distributed", "--gpus", "2", "--cpu", "--timeout", "120")
    assert result.returncode == 0, result.stdout + result.stderr
    rows = [line for line in result.stdout.splitlines() if line.startswith("│ ")]
    assert len(rows) == 2 and all(socket.gethostname() in r and "gloo" in r and "done" in r for r in rows)
    assert "all 2 ranks answered" in result.stdout


@pytest.mark.e2e
def test_doctor_distributed_names_the_rank_that_hangs(cli):
    result = cli("doctor", "--distributed", "--gpus", "3", "--cpu", "--timeout", "15",
                 env={"PLSCALE_SANITY_HANG_RANK": "1"})
    assert result.returncode == 1
    assert "no answer within 15 s" in result.stdout
    assert "Look at rank(s) 1 first: stopped after joined, outside any collective" in result.stdout
    assert result.stdout.count("inside all_reduce") == 2  # ranks 0 and 2 wait for it
