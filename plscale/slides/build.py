"""Render a section's deck with Marp: numbers filled from the labs' references, then HTML (no
browser needed), PDF and per-slide PNGs (through Chromium). A built file replaces the old one only
once it is whole.
"""

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from plscale.errors import UserError
from plscale.files import replacing
from plscale.slides import numbers
from plscale.slides.browser import find_chromium
from plscale.slides.course import Section, slides_root

NODE_HINT = ("install Node 18+ (https://nodejs.org, or `apt-get install nodejs npm`), then run "
             "`npm ci --prefix slides` in the repository")
CHROMIUM_HINT = ("`apt-get install chromium` (Debian/Ubuntu), `brew install --cask chromium` (macOS), or point "
                 "CHROME_PATH at a Chrome or Chromium")


class DeckProblems(Exception):
    """The built deck failed its browser check; the deck it would have replaced is kept."""

    def __init__(self, problems: list[str]):
        super().__init__("; ".join(problems))
        self.problems = problems


PINNED = Path(__file__).resolve().parents[2] / "slides"  # package.json pins Marp's version here


def find_marp() -> list[str]:
    """The command that runs Marp: the course's pinned copy (slides/node_modules), else `marp` on PATH."""
    local = PINNED / "node_modules" / ".bin" / "marp"
    if local.is_file() and shutil.which("node"):
        return [str(local)]
    if (found := shutil.which("marp")) and shutil.which("node"):
        return [found]
    raise UserError(f"Marp (the slide renderer) is not installed: {NODE_HINT}. The built decks "
                    f"(slides/*/deck.html) are committed: open them in a browser without building.")


def filled_source(section: Section) -> str:
    """The deck's Markdown with its measured numbers filled in; one clear error if any cannot be."""
    if not section.source.is_file():
        raise UserError(f"Section {section.id} has no deck: write {section.source} (see slides/README.md).")
    text, problems = numbers.fill(section.source.read_text())
    if problems:
        raise UserError(f"{section.source}: {len(problems)} placeholder(s) cannot be filled: "
                        + "; ".join(line.rstrip(".") for line in problems) + ".")
    return text


def require_chromium() -> str:
    """Chromium's path, or one line saying how to get it (PDF and PNG go through it)."""
    if chromium := find_chromium():
        return chromium
    raise UserError(f"PDF and PNG go through Chromium, and none was found: {CHROMIUM_HINT}. "
                    f"HTML builds without it: drop --pdf/--png.")


def render(section: Section, pdf: bool = False, png_dir: Path | None = None, check=None,
           timeout: float = 180) -> list[Path]:
    """Build the deck: deck.html always, deck.pdf with `pdf`, one PNG a slide into `png_dir`.
    `check(html) -> problems` judges the new HTML before it replaces the old: any problem raises
    DeckProblems and nothing is replaced."""
    text, marp = filled_source(section), find_marp()
    chromium = require_chromium() if (pdf or png_dir) else find_chromium()
    env = {**os.environ, "CHROME_PATH": chromium or ""}
    if os.geteuid() == 0:  # Chromium refuses to run as root inside its sandbox
        env["CHROME_NO_SANDBOX"] = "1"
    # the filled source sits beside deck.md, so its relative image paths hold; a unique name, so
    # two builds of one deck never share it
    fd, name = tempfile.mkstemp(dir=section.folder, prefix=".deck.", suffix=".md")
    filled = Path(name)
    written = []
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
        for target in [section.html] + ([section.pdf] if pdf else []):
            with replacing(target) as partial:
                _marp(marp + [str(filled), "-o", str(partial), "--allow-local-files"], env, timeout, section)
                if check and target == section.html and (problems := check(partial)):
                    raise DeckProblems(problems)
            written.append(target)
        if png_dir:
            png_dir.mkdir(parents=True, exist_ok=True)
            for old in png_dir.glob(f"{section.deck}.*.png"):  # a longer earlier build's extra slides
                old.unlink()
            _marp(marp + [str(filled), "--images", "png", "-o", str(png_dir / f"{section.deck}.png"),
                          "--allow-local-files"], env, timeout, section)
            written += sorted(png_dir.glob(f"{section.deck}.*.png"))
    finally:
        filled.unlink(missing_ok=True)
    return written


def _marp(command: list[str], env: dict, timeout: float, section: Section) -> None:
    theme = slides_root() / "theme"
    command = command[:1] + ["--theme-set", str(theme), "--html"] + command[1:]
    try:
        out = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise UserError(f"Marp did not finish {section.deck} within {timeout:.0f} s.") from None
    if out.returncode != 0 or "[ ERROR ]" in out.stderr:
        reason = next((line for line in out.stderr.splitlines() if "ERROR" in line), out.stderr.strip()[-300:])
        raise UserError(f"Marp failed on {section.source}: {reason.strip()}")
