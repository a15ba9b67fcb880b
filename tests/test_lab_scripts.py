"""Every lab's entry scripts stay lessons (at most 250 lines, read top to bottom), and the
comparisons they share (plscale/rank/against_dense.py, against_prediction.py) pass and fail
where they should."""

import pytest

from plscale.lab.labs import all_labs
from plscale.predict.units import MiB
from plscale.rank.against_dense import follows
from plscale.rank.against_prediction import memory_table, same_collectives, within

MOST_LINES = 250


def entry_scripts():
    """Every script a lab.yaml names, the lab's entry and each variant's, once each."""
    return sorted({lab.entry_of(variant) for lab in all_labs() for variant in lab.variants.values()})


def test_every_lab_names_its_scripts():
    scripts = entry_scripts()
    assert len(scripts) >= len(all_labs())
    assert all(path.is_file() for path in scripts), [str(p) for p in scripts if not p.is_file()]


@pytest.mark.parametrize("script", entry_scripts(), ids=lambda p: f"{p.parent.name}/{p.name}")
def test_entry_script_is_at_most_250_lines(script):
    lines = len(script.read_text().splitlines())
    assert lines <= MOST_LINES, f"{script}: {lines} lines, more than {MOST_LINES}: move the harness to plscale/rank"


def test_follows_fails_when_the_losses_diverge_and_passes_when_equal():
    dense = [2.5, 2.25, 2.0]
    assert follows("parity", dense, list(dense)).ok
    assert follows("parity", [2.5, 2.25 * (1 + 5e-6), 2.0], dense).ok           # inside 1e-5
    failed = follows("parity", [2.5, 2.25, 2.0 * (1 + 1e-3)], dense)
    assert not failed.ok and failed.name == "parity" and "1.00e-03" in failed.detail
    assert not follows("parity", [2.5, 2.3, 2.0], dense, tolerance=0.01).ok   # 2.2% off
    assert follows("parity", [2.5, 2.3, 2.0], dense, tolerance=0.05).ok
    nan = float("nan")                                   # a diverged run: max() alone would pass over it
    assert not follows("parity", [2.5, 2.25, nan], dense).ok and not follows("parity", [nan, 2.25, 2.0], dense).ok
    assert not follows("parity", [2.5, float("inf"), 2.0], dense, tolerance=1.0).ok


def test_within_names_the_worst_rank():
    assert within("states", [(100, 100), (103, 100)], 0.05).ok
    check = within("states", [(100, 100), (110, 100)], 0.05)
    assert not check.ok and "off by 10.00%" in check.detail and "tolerance 5%" in check.detail


def test_memory_table_predicts_only_what_it_is_given():
    lines = []
    rows = {"parameters": [2 * MiB, 2 * MiB], "buffers": [MiB, 0]}
    shown, figures = memory_table(lines.append, rows, {"parameters": 2 * MiB})
    assert [f["name"] for f in figures] == ["parameters per rank (max)"]          # buffers: measured only
    assert figures[0]["value"] == 2.0 and figures[0]["predicted"] == 2.0 and figures[0]["unit"] == "MiB"
    assert shown["buffers"] == {"measured_bytes": [MiB, 0], "predicted_bytes": None}
    assert len(lines) == 3 and "rank 1" in lines[0]


def test_same_collectives_fails_on_one_missing_call():
    want = {("all_reduce", "forward"): (4, 4 * MiB), ("all_reduce", "backward"): (4, 4 * MiB)}
    assert same_collectives("tp", dict(want), want).ok
    fewer = same_collectives("tp", {**want, ("all_reduce", "backward"): (3, 3 * MiB)}, want)
    assert not fewer.ok and "7 calls" in fewer.detail and "8 calls predicted" in fewer.detail
