"""The course map and the decks' sources, without Node or a browser: every lab's section has a
deck, every deck's numbers and images resolve, `plscale course` maps every section."""

import re
from pathlib import Path

import pytest
import yaml

from plscale.errors import UserError
from plscale.lab.labs import all_labs
from plscale.slides import numbers
from plscale.slides.browser import count_slides, split_slides
from plscale.slides.course import find_section, lab_status, load_course

ROOT = Path(__file__).resolve().parents[1]
SECTIONS = load_course()
IMAGE = re.compile(r"!\[[^\]]*\]\(([^)\s]+)\)")


def test_every_lab_section_has_a_deck():
    """The lab contract: a lab's course sections each have a deck (slides/<deck>/deck.md)."""
    by_id = {s.id: s for s in SECTIONS}
    for lab in all_labs():
        assert lab.sections, f"{lab.id} names no course section"
        for section_id in lab.sections:
            assert by_id[section_id].source.is_file(), f"{lab.id}: section {section_id} has no deck"


def test_every_section_has_a_deck_and_a_built_html():
    for s in SECTIONS:
        assert s.source.is_file(), f"{s.id}: write {s.source}"
        assert s.html.is_file(), f"{s.id}: build it (`plscale slides build {s.id}`) and commit {s.html}"
        slides_in_html = len(re.findall(r'<section id="\d+"', s.html.read_text()))
        assert slides_in_html == count_slides(s.source.read_text()), \
            f"{s.html} is stale ({slides_in_html} slides, the source has {count_slides(s.source.read_text())}): rebuild"


@pytest.mark.parametrize("section", SECTIONS, ids=[s.id for s in SECTIONS])
def test_deck_numbers_images_and_notes_resolve(section):
    text = section.source.read_text()
    filled, problems = numbers.fill(text)
    assert problems == []
    for path in IMAGE.findall(filled):
        assert (section.folder / path).is_file(), f"{section.source}: image {path} is missing"
    if section.kind == "hands-on":  # its figures are the labs' own, never copies
        assert any("/labs/" in p for p in IMAGE.findall(text)), f"{section.id} shows no lab figure"
        assert not list(section.folder.glob("figures/*.png")) or section.diagrams, "copied figures in slides/"
    slides = split_slides(text)
    assert len(slides) >= 8
    unnoted = [i for i, body in enumerate(slides, 1) if not re.search(r"<!--(?!\s*_?\w+:)[\s\S]*?-->", body)]
    assert unnoted == [], f"{section.source}: slides {unnoted} have no speaker notes"


@pytest.mark.parametrize("section", [s for s in SECTIONS if s.diagrams], ids=lambda s: s.diagrams)
def test_diagram_modules_draw_the_committed_figures(section, tmp_path):
    """Each module draws (from plscale.predict as it is now) exactly the figures its deck commits."""
    import importlib

    drawn = importlib.import_module(f"plscale.slides.diagrams.{section.diagrams}").draw(tmp_path)
    assert drawn and all(p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in drawn)
    committed = {p.name for p in (section.folder / "figures").glob("*.png")}
    assert {p.name for p in drawn} == committed, f"run `plscale slides diagrams {section.id}` and commit"
    assert not list(tmp_path.glob(".*")), "a partial file was left behind"


def test_a_misspelt_diagrams_module_is_an_error(tmp_path, monkeypatch):
    outline = yaml.safe_load((ROOT / "slides" / "course.yaml").read_text())
    outline["sections"][0]["diagrams"] = "whyy"
    (tmp_path / "course.yaml").write_text(yaml.safe_dump(outline))
    monkeypatch.setenv("PLSCALE_SLIDES_DIR", str(tmp_path))
    with pytest.raises(UserError, match="names diagrams 'whyy'"):
        load_course()


def test_course_table_maps_every_section(quick_cli):
    out = quick_cli("course")
    assert out.returncode == 0, out.stderr
    for s in SECTIONS:
        assert s.id in out.stdout
    for lab in all_labs():
        assert f"{lab.number:02d} {lab.id}" in out.stdout
    assert "no lab: conceptual" in out.stdout  # sections without a lab said honestly
    assert "none measured yet" in out.stdout    # no GPU figure exists yet, and none is claimed


def test_course_one_section(quick_cli):
    out = quick_cli("course", "pipeline")
    assert out.returncode == 0
    assert "lab 05 pipeline" in out.stdout and "plscale lab run pipeline" in out.stdout
    assert "slides/08_pipeline" in out.stdout
    assert quick_cli("course", "1").stdout.count("labs: none") == 1


def test_course_bad_section_is_one_line(quick_cli):
    out = quick_cli("course", "pipelin")
    assert out.returncode == 2
    assert out.stderr.strip().count("\n") == 0 and "Did you mean: pipeline" in out.stderr


def test_a_lab_naming_an_unknown_section_is_an_error(tmp_path, monkeypatch):
    outline = yaml.safe_load((ROOT / "slides" / "course.yaml").read_text())
    outline["sections"] = [s for s in outline["sections"] if s["id"] != "pipeline"]
    (tmp_path / "course.yaml").write_text(yaml.safe_dump(outline))
    monkeypatch.setenv("PLSCALE_SLIDES_DIR", str(tmp_path))
    with pytest.raises(UserError, match="05_pipeline/lab.yaml names course section 'pipeline'"):
        load_course()


def test_find_section_by_number_and_folder():
    assert find_section("8").id == find_section("08_pipeline").id == "pipeline"


def test_lab_status_reads_the_reference():
    zero = next(lab for lab in all_labs() if lab.id == "zero")
    status = lab_status(zero)
    assert status.cpu.startswith("yes: 2 ranks") and status.gpu == "none measured yet"


def test_numbers_fill_from_the_reference():
    text, problems = numbers.fill("loss {{zero/zero2: final loss}}, {{zero/zero2: wall}}")
    assert problems == [] and re.fullmatch(r"loss \d\.\d+ nats, \d+ s", text)
    predicted, _ = numbers.fill("{{pipeline/1f1b: bubble at m=8 | predicted}}")
    assert predicted.endswith("%")
    _, problems = numbers.fill("a\n{{zero/zero9: final loss}} {{zero/zero2: no such figure}} {{typo}}")
    assert len(problems) == 3 and all(p.startswith("line 2:") for p in problems)


@pytest.mark.parametrize("value, unit, text", [(20.259, "MiB", "20.26 MiB"), (12.5, "%", "12.5%"),
                                               (2.998, "x", "2.998x"), (1.34e-07, "max abs", "1.3e-07 max abs"),
                                               (686732.0, "tokens/s", "686,732 tokens/s"), (9999.7, "s", "10,000 s"),
                                               (3, "", "3")])
def test_number_format(value, unit, text):
    assert numbers.with_unit(value, unit) == text


def test_count_slides_skips_front_matter_and_code():
    source = "---\nmarp: true\n---\n\n# a\n\n---\n\n```\n---\n```\n\n---\n\nc\n"
    assert count_slides(source) == 3 and split_slides(source)[1].strip() == "```\n---\n```"
