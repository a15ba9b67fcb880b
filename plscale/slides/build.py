"""Render a section's deck with Marp: numbers filled from the labs' references, then HTML (no
browser needed), PDF and per-slide PNGs (through Chromium). A built file replaces the old one only
once it is whole.
"""

import os
import shutil
import subprocess
from pathlib import Path

from plscale.errors import UserError
from plscale.slides import numbers
from plscale.slides.browser import find_chromium
from plscale.slides.course import Section, slides_root

NODE_HINT = "install Node 18+ (https://nodejs.org, or `apt-get install nodejs npm`), then run `npm ci --prefix slides`"
CHROMIUM_HINT = ("PDF and PNG need Chromium: `apt-get install chromium` (Debian/Ubuntu), `brew install --cask "
                 "chromium` (macOS), or point CHROME_PATH at a Chrome or Chromium")


PINNED = Path(__file__).resolve().parents[2] / "slides"  # package.json pins Marp's version here


def find_marp() -> list[str]:
    """The command that runs Marp: the course's pinned copy (slides/node_modules), else `marp` on PATH."""
    local = PINNED / "node_modules" / ".bin" / "marp"
    if local.is_file():
        return [str(local)]
    if found := shutil.which("marp"):
        return [found]
    raise UserError(f"Marp (the slide renderer) is not installed: {NODE_HINT}. The built decks "
                    f"(slides/*/deck.html) are committed: open them in a browser without building.")


def filled_source(section: Section) -> str:
    """The deck's Markdown with its measured numbers filled in; one clear error if any cannot be."""
    if not section.source.is_file():
        raise UserError(f"Section {section.id} has no deck: write {section.source} (see slides/README.md).")
    text, problems = numbers.fill(section.source.read_text())
    if problems:
        raise UserError(f"{section.source}: {len(problems)} placeholder(s) cannot be filled: {'; '.join(problems)}.")
    return text


def render(section: Section, pdf: bool = False, png_dir: Path | None = None, timeout: float = 180) -> list[Path]:
    """Build the deck: deck.html always, deck.pdf with `pdf`, one PNG a slide into `png_dir`."""
    marp, chromium = find_marp(), find_chromium()
    if (pdf or png_dir) and not chromium:
        raise UserError(f"No Chromium found: {CHROMIUM_HINT}. HTML builds without it: drop --pdf/--png.")
    filled = section.folder / ".deck.filled.md"  # beside deck.md, so relative image paths hold
    filled.write_text(filled_source(section))
    env = {**os.environ, "CHROME_PATH": chromium or ""}
    if os.geteuid() == 0:  # Chromium refuses to run as root inside its sandbox
        env["CHROME_NO_SANDBOX"] = "1"
    written = []
    try:
        jobs = [("html", section.html)] + ([("pdf", section.pdf)] if pdf else [])
        for kind, target in jobs:
            partial = target.with_name(f".{target.stem}.partial.{kind}")
            _marp(marp + [str(filled), "-o", str(partial), "--allow-local-files"], env, timeout, section)
            os.replace(partial, target)
            written.append(target)
        if png_dir:
            png_dir.mkdir(parents=True, exist_ok=True)
            _marp(marp + [str(filled), "--images", "png", "-o", str(png_dir / f"{section.deck}.png"),
                          "--allow-local-files"], env, timeout, section)
            written += sorted(png_dir.glob(f"{section.deck}.*png"))
    finally:
        filled.unlink(missing_ok=True)
        for partial in section.folder.glob(".deck.partial.*"):
            partial.unlink()
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
