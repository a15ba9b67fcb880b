"""The decks rendered by Marp and opened in headless Chromium: every slide renders, every image
loads, no text overflows; the committed builds are current; bad input says how to fix it.
Skips, saying why, where Node's Marp (`npm ci --prefix slides`) or Chromium is absent."""

import re
import shutil
import zlib
from pathlib import Path

import pytest

from plscale.errors import UserError
from plscale.slides import build
from plscale.slides.browser import count_slides, find_chromium
from plscale.slides.course import find_section, load_course

ROOT = Path(__file__).resolve().parents[1]


def _marp_or_none():
    try:
        return build.find_marp()
    except UserError:
        return None


needs_marp = pytest.mark.skipif(_marp_or_none() is None, reason="Marp is not installed: `npm ci --prefix slides` (Node 18+)")
needs_chromium = pytest.mark.skipif(find_chromium() is None, reason="no Chromium: `apt-get install chromium`")


@pytest.fixture
def slides_copy(tmp_path, monkeypatch):
    """The slides folder copied beside a link to the labs, so decks build without touching the repo's."""
    copy = tmp_path / "slides"
    shutil.copytree(ROOT / "slides", copy, ignore=shutil.ignore_patterns("node_modules", "*.pdf"))
    (tmp_path / "labs").symlink_to(ROOT / "labs")
    monkeypatch.setenv("PLSCALE_SLIDES_DIR", str(copy))
    return copy


@needs_marp
@needs_chromium
def test_every_deck_builds_and_renders_whole_in_chromium(slides_copy, quick_cli):
    """`plscale slides build` of every deck, each opened in headless Chromium by the build's check."""
    out = quick_cli("slides", "build")
    assert out.returncode == 0, out.stdout + out.stderr
    for s in load_course():
        assert f"{s.deck}: " in out.stdout
        assert s.html.is_file() and count_slides(s.source.read_text()) >= 8
        committed = ROOT / "slides" / s.deck / "deck.html"
        assert s.html.read_bytes() == committed.read_bytes(), \
            f"{committed} is not what its source builds to: run `plscale slides build {s.id}` and commit it"


@needs_marp
@needs_chromium
def test_pdf_and_pngs_have_a_page_per_slide(slides_copy, quick_cli, tmp_path):
    section = find_section("pipeline")  # lab figures and measured numbers
    out = quick_cli("slides", "build", section.id, "--pdf", "--png", tmp_path / "png", "--no-check")
    assert out.returncode == 0, out.stderr
    slides = count_slides(section.source.read_text())
    assert _pdf_pages(section.pdf.read_bytes()) == slides
    assert len(list((tmp_path / "png").glob("*.png"))) == slides


def _pdf_pages(pdf: bytes) -> int:
    """Page objects in a PDF, looking inside its compressed object streams too."""
    assert pdf.startswith(b"%PDF")
    text = pdf
    for stream in re.finditer(rb"stream\r?\n(.*?)\r?\nendstream", pdf, re.S):
        try:
            text += zlib.decompress(stream.group(1))
        except zlib.error:  # an image or font stream, not objects
            pass
    return len(re.findall(rb"/Type\s*/Page(?![s\w])", text))


@needs_marp
@needs_chromium
def test_the_check_catches_overflow_and_broken_images_and_keeps_the_good_deck(slides_copy, quick_cli):
    section = find_section("pipeline")
    before = section.html.read_bytes()
    bullets = "\n".join(f"- point {i}" for i in range(30))
    section.source.write_text(section.source.read_text()
                              + f"\n---\n\n## Too much\n\n{bullets}\n\n---\n\n![w:300](figures/none.png)\n")
    out = quick_cli("slides", "build", section.id)
    assert out.returncode == 1 and "kept the deck as it was" in out.stdout
    n = count_slides(section.source.read_text())
    assert f"slide {n - 1}: content is" in out.stdout and "overflow at the bottom" in out.stdout
    assert "image figures/none.png did not load" in out.stdout
    assert section.html.read_bytes() == before and not list(section.folder.glob(".deck*"))
    out = quick_cli("slides", "build", section.id, "--no-check")  # written anyway, on request
    assert out.returncode == 0 and section.html.read_bytes() != before


def test_a_bad_placeholder_fails_in_one_line_and_keeps_the_built_deck(slides_copy, quick_cli, monkeypatch):
    monkeypatch.setattr(build, "find_marp", lambda: ["marp"])  # never reached: the source is refused first
    section = find_section("pipeline")
    before = section.html.read_bytes()
    section.source.write_text(section.source.read_text() + "\n---\n\n{{pipeline/1f1b: no such figure}}\n")
    out = quick_cli("slides", "build", section.id)
    assert out.returncode == 2 and "no figure 'no such figure'" in out.stderr
    assert out.stderr.strip().count("\n") == 0
    assert section.html.read_bytes() == before and not list(section.folder.glob(".deck*"))


def test_without_marp_or_chromium_says_how_to_get_them(slides_copy, quick_cli, monkeypatch, tmp_path):
    with monkeypatch.context() as patch:
        patch.setattr(build, "PINNED", tmp_path)  # no slides/node_modules here
        patch.setenv("PATH", str(tmp_path))
        out = quick_cli("slides", "build")
        assert out.returncode == 2 and "npm ci --prefix slides" in out.stderr and "deck.html" in out.stderr
    monkeypatch.setattr(build, "find_marp", lambda: ["marp"])  # never reached: Chromium is asked for first
    monkeypatch.setattr(build, "find_chromium", lambda: None)
    for flags in (["--pdf"], ["--png", tmp_path / "png"]):
        out = quick_cli("slides", "build", "pipeline", *flags)
        assert out.returncode == 2 and "apt-get install chromium" in out.stderr
    assert not list(slides_copy.glob("*/deck.pdf"))


@pytest.mark.parametrize("flags, message", [
    (["--png", "README.md"], "is a file: give a folder"),
    (["--data-dir", "."], "--data-dir is for --refresh"),
    (["--refresh", "--data-dir", "no/such/dir"], "is not a folder"),
])
def test_bad_build_options_are_one_line(quick_cli, monkeypatch, flags, message):
    monkeypatch.setattr(build, "find_marp", lambda: ["marp"])  # refused before Marp runs
    monkeypatch.setattr(build, "find_chromium", lambda: "chromium")
    out = quick_cli("slides", "build", "pipeline", *flags)
    assert out.returncode == 2 and message in out.stderr and out.stderr.strip().count("\n") == 0


def test_unknown_section_is_one_line(quick_cli):
    out = quick_cli("slides", "build", "pipeln")
    assert out.returncode == 2 and "Did you mean: pipeline" in out.stderr
