"""The labs' `figures:` blocks: every committed figure says which run makes it, and
plscale.slides.refresh reruns one for real (on a copy of lab 01, a few steps)."""

import functools
import shutil
from pathlib import Path

import pytest

from plscale.errors import UserError
from plscale.lab.labs import all_labs, find, load_lab
from plscale.slides.refresh import figure_sources, refresh

ROOT = Path(__file__).resolve().parents[1]
LABS = ROOT / "labs"
PNG = b"\x89PNG\r\n\x1a\n"


def committed(lab) -> set[str]:
    """The files the lab commits in figures/ that slides and READMEs use (PNGs, and CSVs beside them)."""
    folder = lab.folder / "figures"
    return {p.relative_to(lab.folder).as_posix() for p in folder.glob("*") if p.suffix in (".png", ".csv")}


def test_every_committed_figure_is_declared_and_exists():
    labs = all_labs()
    assert len(labs) >= 10
    for lab in labs:
        sources = figure_sources(lab)
        declared = {s.file for s in sources}
        assert committed(lab) <= declared, f"{lab.folder.name}: undeclared {sorted(committed(lab) - declared)}"
        for s in sources:
            assert s.path.is_file(), f"{lab.folder.name}: {s.file} is declared but not committed"
            if s.manual:  # made by hand: how, and why no run remakes it
                assert len(s.manual) > 10 and len(s.why) > 20, (lab.folder.name, s.file)
            else:
                assert s.runs and (s.take or s.compare), (lab.folder.name, s.file)


def test_declared_runs_name_this_lab_and_a_real_variant():
    find_once = functools.cache(find)  # each call reads every lab.yaml
    for lab in all_labs():
        for s in figure_sources(lab):
            for args in s.runs:
                if args[:2] == ("bench", "collectives"):
                    found = find_once("collectives")[0]
                    variant = found.variant("bench")
                else:
                    assert args[:2] == ("lab", "run"), args
                    found, variant = find_once(args[2])
                    if "--variant" in args or "-v" in args:
                        at = args.index("--variant" if "--variant" in args else "-v")
                        variant = found.variant(args[at + 1])
                    if "--sweep" in args:
                        assert found.sweep or found.sweep_layouts, f"{args}: lab {found.id} has no sweep"
                assert found.folder.resolve() == lab.folder.resolve(), f"{lab.folder.name}: {args} runs lab {found.id}"
                assert variant.name in found.variants
                assert "--cpu" in args, f"{args}: the committed figures are CPU measurements: add --cpu"
                if "--gpus" in args:
                    assert int(args[args.index("--gpus") + 1]) in found.allowed_ranks, args


def one_lab(tmp_path, monkeypatch, block: str):
    """A copy of lab 01 (code, yaml, figures) under PLSCALE_LABS_DIR with `block` as its figures."""
    root = tmp_path / "labs"
    shutil.copytree(LABS / "01_mnist_pseudo_dp", root / "01_mnist_pseudo_dp",
                    ignore=shutil.ignore_patterns("__pycache__"))
    path = root / "01_mnist_pseudo_dp" / "lab.yaml"
    text = path.read_text()
    text = text[:text.index("\nfigures:")] if "\nfigures:" in text else text
    path.write_text(text + "\nfigures:\n" + block)
    monkeypatch.setenv("PLSCALE_LABS_DIR", str(root))
    return load_lab(root / "01_mnist_pseudo_dp")


@pytest.mark.parametrize("block, says", [
    ("  - file: figures/loss.png\n    take: loss.png\n", "exactly one of"),
    ("  - file: figures/loss.png\n    run: lab run mnist-dp\n", "add take"),
    ("  - file: figures/loss.png\n    run: lab run mnist-dp\n    take: loss.csv\n", "differ in type"),
    ("  - file: loss.png\n    run: lab run mnist-dp\n    take: loss.png\n", "figures/ folder"),
    ("  - file: figures/loss.png\n    run: plscale lab run mnist-dp\n    take: loss.png\n", "without `plscale`"),
    ("  - file: figures/loss.png\n    run: lab run mnist-dp --data-dir x\n    take: loss.png\n", "drop --data-dir"),
    ("  - file: figures/loss.png\n    run: lab run x\n    take: ../loss.png\n", "without `..`"),
    ("  - file: figures/loss.png\n    manual: by hand\n", "add why"),
    ("  - file: figures/compare.png\n    compare: [lab run mnist-dp]\n", "2 or more runs"),
    ("  - file: figures/a.png\n    run: lab run x\n    take: a.png\n    colour: red\n", "unknown key"),
    ("  - file: figures/a.png\n    manual: by hand\n    why: because\n" * 2, "declared twice"),
    ("  file: figures/a.png\n", "must be a list"),
    ("  - file: figures/a.png\n    run: lab run x\n    take: a.png\n    fails: true\n", "`fails:` is what the run says"),
    ("  - file: figures/a.png\n    manual: by hand\n    why: because it is\n    fails: x\n", "drop fails"),
])
def test_a_malformed_block_is_one_clear_line(tmp_path, monkeypatch, block, says):
    lab = one_lab(tmp_path, monkeypatch, block)
    with pytest.raises(UserError, match=says) as error:
        figure_sources(lab)
    assert "\n" not in str(error.value) and "lab.yaml" in str(error.value)


def test_refresh_replaces_the_figure_and_a_failed_run_leaves_it(tmp_path, monkeypatch):
    """One real run (lab 01 on 2 CPU ranks, 5 steps, under torchrun), then one that fails."""
    lab = one_lab(tmp_path, monkeypatch, (
        "  - file: figures/loss.png\n"
        "    run: lab run mnist-dp --gpus 2 --cpu --steps 5 --launcher torchrun\n"
        "    take: loss.png\n"
        "  - file: figures/compare.png\n"
        "    manual: plscale report --compare of two runs\n"
        "    why: not rerun in this test, which is about one run\n"))
    target = lab.folder / "figures" / "loss.png"
    before = target.read_bytes()
    said = []
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    written = refresh([lab], echo=said.append)
    assert written == [target]
    after = target.read_bytes()
    assert after[:8] == PNG and after != before and len(after) > 10_000
    assert any(line.startswith("[1/1] plscale lab run mnist-dp") for line in said), said
    assert any("not rerun: 01_mnist_pseudo_dp/figures/compare.png" in line for line in said), said
    assert not list(target.parent.glob(".*refresh")), "no temporary file is left beside the figure"

    broken = one_lab(tmp_path / "again", monkeypatch, (
        "  - file: figures/loss.png\n"
        "    run: lab run mnist-dp --gpus 2 --cpu --steps 5 --set train.no_such_setting=1\n"
        "    take: loss.png\n"))
    kept = (broken.folder / "figures" / "loss.png").read_bytes()
    with pytest.raises(UserError, match=r"`plscale lab run mnist-dp .*` failed \(exit 2\).*its log: ") as error:
        refresh([broken], echo=said.append)
    assert (broken.folder / "figures" / "loss.png").read_bytes() == kept
    log = Path(str(error.value).split("its log: ")[1].split(". ")[0])
    assert log.is_file() and "no_such_setting" in log.read_text()
    shutil.rmtree(log.parent)


def test_a_run_meant_to_fail_that_succeeds_is_refused(tmp_path, monkeypatch):
    """`fails: TEXT` (lab 12's runs, which fail on purpose) on a run that succeeds: the lab
    changed, and its figure is left as it was."""
    lab = one_lab(tmp_path, monkeypatch, (
        "  - file: figures/loss.png\n"
        "    run: lab run mnist-dp --gpus 2 --cpu --steps 3\n"
        "    take: loss.png\n"
        "    fails: out of memory\n"))
    kept = (lab.folder / "figures" / "loss.png").read_bytes()
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(UserError, match="succeeded, but its figure's entry says it fails on purpose saying"):
        refresh([lab], echo=lambda line: None)
    assert (lab.folder / "figures" / "loss.png").read_bytes() == kept


def test_a_run_meant_to_fail_gives_its_figure_only_when_it_fails_as_said(tmp_path, monkeypatch):
    """Lab 12's oom run (a copy of lab 12): it fails on purpose, saying so, and its chart is taken;
    the same run declared to fail another way is refused, its figure left as it was."""
    root = tmp_path / "labs"
    shutil.copytree(LABS / "12_debug", root / "12_debug", ignore=shutil.ignore_patterns("__pycache__"))
    path = root / "12_debug" / "lab.yaml"
    text = path.read_text()
    entry = ("  - file: figures/oom_fixes.png\n    run: lab run oom --gpus 2 --cpu\n    take: memory_fixes.png\n"
             "    fails: {}\n")
    path.write_text(text[:text.index("\nfigures:")] + "\nfigures:\n" + entry.format('"out of memory (rank"'))
    monkeypatch.setenv("PLSCALE_LABS_DIR", str(root))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    target = root / "12_debug" / "figures" / "oom_fixes.png"
    target.write_bytes(b"not yet drawn")   # the chart is the model's, the same each run: mark the old one
    said = []
    assert refresh([load_lab(root / "12_debug")], echo=said.append) == [target]
    assert target.read_bytes()[:8] == PNG and len(target.read_bytes()) > 10_000
    assert any("as it is meant to: out of memory (rank" in line for line in said), said
    path.write_text(text[:text.index("\nfigures:")] + "\nfigures:\n" + entry.format('"a hang"'))
    kept = target.read_bytes()
    with pytest.raises(UserError, match="without saying 'a hang'"):
        refresh([load_lab(root / "12_debug")], echo=said.append)
    assert target.read_bytes() == kept
