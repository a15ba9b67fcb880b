"""Pipeline schedules on paper: the bubble of each schedule against its formula, the orders
against Megatron's and picotron's, the dependencies in every simulated timeline, the
activations in flight, the drawings, and `plscale viz pipeline` through the real CLI."""

import os
import subprocess
import sys
from collections import Counter

import pytest

from conftest import run_cli
from plscale.charts import timeline
from plscale.predict import pipeline as pp
from plscale.predict.errors import PredictionError

PNG = b"\x89PNG\r\n\x1a\n"
SHAPES = [(p, m) for p in (1, 2, 3, 4, 8) for m in (1, 2, 3, 4, 5, 8, 12, 16)]


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_gpipe_and_1f1b_bubble_is_the_formula(schedule):
    for p, m in SHAPES:
        assert pp.bubble_of(pp.simulate(schedule, p, m)) == pytest.approx((p - 1) / (m + p - 1), abs=1e-12)
        assert pp.bubble_of(pp.simulate(schedule, p, m, f=1.0, b=3.0)) == pytest.approx((p - 1) / (m + p - 1))
    assert pp.bubble_fraction(4, 8) == 3 / 11


def test_interleaved_bubble_shrinks_by_v():
    # Megatron's exact order gives exactly (p-1)/(v*m+p-1) here, m == p included: communication
    # is free and never blocks. (Megatron itself runs all forwards first when m == p; the
    # warm-up formula used here reaches the same bubble.)
    checked = 0
    for p in (1, 2, 3, 4, 8):
        for v in (2, 3, 4):
            for m in (p, 2 * p, 3 * p, 4 * p):
                ops = pp.simulate("interleaved", p, m, v)
                assert pp.bubble_of(ops) == pytest.approx(pp.bubble_fraction(p, m, v), abs=1e-12), (p, m, v)
                checked += 1
    assert checked == 60 and pp.bubble_fraction(4, 8, 2) == 3 / 19
    with pytest.raises(PredictionError, match="v >= 2"):  # one chunk per rank is plain 1F1B
        pp.order("interleaved", 4, 8, 0, 1)


def test_zero_bubble_h1_cuts_1f1b_idle_time_to_a_third():
    for p, m in SHAPES:
        zb, one_f_one_b = pp.bubble_of(pp.simulate("zb", p, m)), pp.bubble_of(pp.simulate("1f1b", p, m))
        if p > 1:
            assert zb < one_f_one_b - 0.02, (p, m)
        if m >= p:  # f = B = W = 1: (p-1) idle per rank against 1F1B's 3(p-1)
            assert zb == pytest.approx((p - 1) / (3 * m + p - 1), abs=1e-12), (p, m)
    # the paper's (p-1)(f+B-W) while W <= f and W <= B; else (p-1)max(f, B, f+B-W)
    for f, b, w in [(1, 2, 1), (1, 3, 1), (2, 3, 1), (1, 1.5, 0.5), (1, 4, 2), (2, 2.5, 1.5), (1, 3, 2)]:
        for p, m in [(2, 4), (4, 8), (4, 12), (8, 16)]:
            ops = pp.simulate("zb", p, m, f=f, b=b, w=w)
            span = max(op.end for op in ops)
            idle = (p - 1) * max(f, b - w, f + b - 2 * w)
            assert span == pytest.approx(m * (f + b) + idle), (f, b, w, p, m)
            assert pp.bubble_of(ops) == pytest.approx(pp.bubble_theory("zb", p, m, f=f, b=b, w=w))


def test_orders_follow_picotron_and_megatron():
    assert pp.order("gpipe", 2, 3, 1) == [("F", 0, 0), ("F", 1, 0), ("F", 2, 0), ("B", 0, 0), ("B", 1, 0), ("B", 2, 0)]
    kinds = lambda order: " ".join(f"{k}{i}" for k, i, _ in order)  # noqa: E731
    assert kinds(pp.order("1f1b", 4, 8, 1)) == "F0 F1 F2 B0 F3 B1 F4 B2 F5 B3 F6 B4 F7 B5 B6 B7"
    assert kinds(pp.order("1f1b", 4, 2, 0)) == "F0 F1 B0 B1"                    # warm-up capped at m
    # Megatron's interleaved order, p = 2, v = 2, m = 4, rank 0: warm-up (2-0-1)*2 + (2-1)*2 = 4
    F, B = "F", "B"
    assert pp.order("interleaved", 2, 4, 0, v=2) == [
        (F, 0, 0), (F, 1, 0), (F, 0, 1), (F, 1, 1),
        (F, 2, 0), (B, 0, 1), (F, 3, 0), (B, 1, 1), (F, 2, 1), (B, 0, 0), (F, 3, 1), (B, 1, 0),
        (B, 2, 1), (B, 3, 1), (B, 2, 0), (B, 3, 0)]
    # ZB-H1: the last rank keeps up to p-1 W's waiting, rank 0 none
    assert kinds(pp.order("zb", 3, 4, 0)) == "F0 F1 F2 B0 W0 F3 B1 W1 B2 W2 B3 W3"
    assert kinds(pp.order("zb", 3, 4, 2)) == "F0 B0 F1 B1 F2 B2 W0 F3 B3 W1 W2 W3"


@pytest.mark.parametrize("schedule, v", [("gpipe", 1), ("1f1b", 1), ("interleaved", 2), ("interleaved", 3), ("zb", 1)])
def test_every_timeline_does_each_piece_once_and_keeps_the_dependencies(schedule, v):
    for p, m in [(1, 3), (2, 4), (3, 6), (4, 8), (4, 12)]:
        ops = pp.simulate(schedule, p, m, v)
        stages = p * v
        kinds = ("F", "B", "W") if schedule == "zb" else ("F", "B")
        pieces = Counter((op.kind, op.stage, op.micro) for op in ops)
        assert pieces == Counter({(k, s, i): 1 for k in kinds for s in range(stages) for i in range(m)})
        at = {(op.kind, op.stage, op.micro): op for op in ops}
        for (kind, s, i), op in at.items():
            assert op.rank == s % p
            assert op.end - op.start == {"F": 1.0, "B": 1.0 if schedule == "zb" else 2.0, "W": 1.0}[kind]
            if kind == "F" and s > 0:
                assert op.start >= at["F", s - 1, i].end
            if kind == "B":
                assert op.start >= (at["B", s + 1, i].end if s < stages - 1 else at["F", s, i].end)
            if kind == "W":
                assert op.start >= at["B", s, i].end
        for rank in range(p):  # strictly in order, one at a time
            mine = [op for op in ops if op.rank == rank]
            assert [(op.kind, op.micro, op.stage // p) for op in mine] == pp.order(schedule, p, m, rank, v)
            assert all(a.end <= b.start for a, b in zip(mine, mine[1:]))


def test_measured_durations_per_stage():
    # p = 2, m = 2, stage 1 three times slower forward: rank 0 F0 0-1 F1 1-2, rank 1 F0 1-4 B0 4-6
    # F1 6-9 B1 9-11; rank 0 B0 6-8 B1 11-13
    ops = pp.simulate("1f1b", 2, 2, f=[1, 3], b=[2, 2])
    assert [(op.rank, op.kind, op.micro, op.start, op.end) for op in ops] == [
        (0, "F", 0, 0, 1), (0, "F", 1, 1, 2), (0, "B", 0, 6, 8), (0, "B", 1, 11, 13),
        (1, "F", 0, 1, 4), (1, "B", 0, 4, 6), (1, "F", 1, 6, 9), (1, "B", 1, 9, 11)]
    assert pp.bubble_of(ops) == pytest.approx(1 - (6 / 13 + 10 / 13) / 2)


def test_bubble_of_counts_send_and_recv_as_idle():
    ops = [pp.Op(0, "F", 0, 10.0, 11.0), pp.Op(0, "send", 0, 11.0, 12.0),
           pp.Op(1, "recv", 0, 10.0, 12.0), pp.Op(1, "F", 0, 12.0, 13.0), pp.Op(1, "B", 0, 13.0, 14.0)]
    assert pp.bubble_of(ops) == pytest.approx(((1 - 1 / 4) + (1 - 2 / 4)) / 2)


def test_activations_in_flight():
    for p, m in SHAPES:
        for rank in range(p):
            assert pp.in_flight("gpipe", p, m, rank) == m
            assert pp.in_flight("1f1b", p, m, rank) == pp.in_flight("zb", p, m, rank) == min(m, p - rank)
    # interleaved: Megatron's warm-up plus one, in (micro-batch, chunk) pairs
    assert [pp.in_flight("interleaved", 4, 8, r, v=2) for r in range(4)] == [11, 9, 7, 5]
    assert pp.peak_in_flight([("F", 0, 0), ("B", 0, 0), ("F", 1, 0), ("W", 0, 0)]) == 1


def test_docstring_picture_is_the_simulation():
    assert pp.text_timeline(pp.simulate("1f1b", 4, 8, b=1)) in "\n".join(
        line.strip() for line in pp.__doc__.splitlines())


def test_bad_input_raises(monkeypatch):
    for args, message in [(("pipedream", 4, 8), "Unknown schedule 'pipedream'"), (("1f1b", 0, 8), "at least 1"),
                          (("1f1b", 4, 0), "at least 1"), (("interleaved", 4, 8, 0), "at least 1"),
                          (("interleaved", 4, 6, 2), "micro 6 is not a multiple of stages 4")]:
        with pytest.raises(PredictionError, match=message):
            pp.simulate(*args)
    with pytest.raises(ValueError, match="rank 4 is not a pipeline rank of 4 stages"):
        pp.order("1f1b", 4, 8, 4)
    with pytest.raises(ValueError, match="f has 3 durations for 4"):
        pp.simulate("1f1b", 4, 8, f=[1, 1, 1])
    with pytest.raises(ValueError, match="w must be less than b"):
        pp.simulate("zb", 2, 2, b=2, w=3)
    backward_first = {0: [("B", 0, 0), ("F", 0, 0)], 1: [("F", 0, 0), ("B", 0, 0)]}
    monkeypatch.setattr(pp, "order", lambda schedule, p, m, rank, v=1: backward_first[rank])
    with pytest.raises(ValueError, match=r"deadlocks: rank 0 at \('B', 0, 0\); rank 1 at \('F', 0, 0\)"):
        pp.simulate("1f1b", 2, 1)


def test_drawings_are_pngs(tmp_path):
    planned = pp.simulate("interleaved", 2, 4, v=2)
    measured = [pp.Op(op.rank, op.kind, op.micro, 5 + op.start / 100, 5 + op.end / 100 - 0.001) for op in planned]
    measured += [pp.Op(0, "send", i, 5 + i / 100, 5.002 + i / 100) for i in range(4)]
    timeline.draw_pair(tmp_path / "pair.png", measured, planned, "measured", "planned")
    rows = [{"m": m, "theory": pp.bubble_fraction(4, m), "measured": None if m == 16 else 0.3, "zb": 0.1}
            for m in (4, 8, 16)]
    timeline.bubble_chart(tmp_path / "chart.png", rows, "bubble against m")
    for name in ("pair.png", "chart.png"):
        assert (tmp_path / name).read_bytes()[:8] == PNG


def test_cli_draws_the_schedule_prints_the_bubble_and_imports_no_torch(tmp_path):
    result = subprocess.run([sys.executable, "-X", "importtime", "-m", "plscale.cli.main", "viz", "pipeline",
                             "--schedule", "1f1b", "--stages", "4", "--micro", "8"], cwd=tmp_path,
                            capture_output=True, text=True, env={**os.environ, "COLUMNS": "200"})
    assert result.returncode == 0, result.stderr
    assert "1F1B, p=4 stages, m=8 micro-batches: bubble 27.3% (theory (p-1)/(m+p-1) = 27.3%)" in result.stdout
    assert "rank 0  F0 F1 F2 F3 .." in result.stdout and "up to 4 micro-batches" in result.stdout
    assert "wrote pipeline-1f1b-p4-m8.png" in result.stdout
    assert (tmp_path / "pipeline-1f1b-p4-m8.png").read_bytes()[:8] == PNG
    modules = [line.rsplit("|", 1)[-1].strip() for line in result.stderr.splitlines() if "|" in line]
    assert "plscale.predict.pipeline" in modules and "matplotlib" in modules
    assert not [m for m in modules if m.split(".")[0] in ("torch", "deepspeed")]
    zb = run_cli("viz", "pipeline", "--schedule", "zb", "--stages", "4", "--micro", "8", "--out", tmp_path / "zb.png")
    assert zb.returncode == 0 and "bubble 11.1% (theory (p-1)/(3m+p-1) = 11.1%; 1F1B 27.3%)" in zb.stdout, zb.stderr
    assert (tmp_path / "zb.png").read_bytes()[:8] == PNG


@pytest.mark.parametrize("args, message", [
    (["--schedule", "zbh1"], "Unknown schedule 'zbh1'. Did you mean: zb?"),
    (["--stages", "0"], "--stages must be a whole number of at least 1 (got 0)."),
    (["--micro", "-1"], "--micro must be a whole number of at least 1 (got -1)."),
    (["--schedule", "interleaved", "--micro", "6"], "--micro 6 is not a multiple of --stages 4: "),
    (["--schedule", "interleaved", "--virtual", "0"], "--virtual must be a whole number of at least 1"),
    (["--out", "p.svg"], "--out p.svg does not end in .png"),
])
def test_cli_bad_input_is_one_line_exit_2_and_writes_nothing(quick_cli, tmp_path, args, message):
    result = quick_cli("viz", "pipeline", *args, cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], result.stderr
    assert result.stdout == "" and not list(tmp_path.iterdir())
