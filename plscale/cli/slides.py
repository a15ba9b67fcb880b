"""`plscale slides build|diagrams|check`: the course decks (slides/), rendered with Marp."""

import importlib
import time
from pathlib import Path

import typer

from plscale.cli.output import console
from plscale.errors import UserError

app = typer.Typer(help="The course's slides: build the decks, redraw their diagrams, check them in a browser.",
                  no_args_is_help=True)

SECTION_HELP = "A section's id, number or deck folder (`plscale course` lists them); all sections when omitted."


def _sections(name: str | None):
    from plscale.slides.course import find_section, load_course

    return [find_section(name)] if name else load_course()


@app.command("build")
def build(section: str = typer.Argument(None, help=SECTION_HELP),
          pdf: bool = typer.Option(False, "--pdf", help="Also write deck.pdf (needs Chromium)."),
          png: Path = typer.Option(None, "--png", help="Also write one PNG a slide into this folder (needs Chromium)."),
          refresh: bool = typer.Option(False, "--refresh", help="First rerun the labs behind the decks' figures "
                                       "(minutes on CPU) and redraw the diagrams."),
          data_dir: Path = typer.Option(None, "--data-dir", help="Datasets for --refresh's lab runs."),
          check: bool = typer.Option(True, "--check/--no-check", help="Open each built deck in headless Chromium "
                                     "and report slides that overflow or images that do not load.")) -> None:
    """Render decks to HTML (offline, no browser), and PDF or PNGs with --pdf / --png."""
    from plscale.slides import build as builder

    sections = _sections(section)
    builder.find_marp()  # say how to install them before anything runs
    if pdf or png:
        builder.require_chromium()
    if png and png.exists() and not png.is_dir():
        raise UserError(f"--png {png} is a file: give a folder for the slide PNGs.")
    if data_dir and not refresh:
        raise UserError("--data-dir is for --refresh's lab runs: add --refresh, or drop --data-dir.")
    if data_dir and not data_dir.is_dir():
        raise UserError(f"--data-dir {data_dir} is not a folder: point it at the datasets (see README.md, Data).")
    if refresh:
        _refresh(sections, data_dir)
    chromium = _chromium() if check else None
    failed = []
    for i, s in enumerate(sections, 1):
        start = time.perf_counter()
        judge = (lambda html, s=s: browser_problems(s, html, chromium)) if chromium else None
        try:
            written = builder.render(s, pdf=pdf, png_dir=png, check=judge)
        except builder.DeckProblems as found:
            console.print(f"[{i}/{len(sections)}] [red]{s.deck}[/]: kept the deck as it was; the new build has "
                          f"{len(found.problems)} problem(s):")
            for line in found.problems:
                console.print(f"    {line}")
            failed.append(s.deck)
            continue
        shown = ", ".join(str(p.relative_to(Path.cwd())) if p.is_relative_to(Path.cwd()) else str(p)
                          for p in written if p.suffix != ".png")
        pngs = sum(p.suffix == ".png" for p in written)
        console.print(f"[{i}/{len(sections)}] {s.deck}: {shown}" + (f" + {pngs} PNGs in {png}" if pngs else "")
                      + (", checked in Chromium" if chromium else "") + f" ({time.perf_counter() - start:.1f} s)")
    if check and not chromium:
        from plscale.slides.build import CHROMIUM_HINT

        console.print(f"Not checked in a browser (the check opens each deck in Chromium, and none was found): "
                      f"{CHROMIUM_HINT}.")
    if failed:
        console.print(f"[red]{len(failed)} deck(s) not replaced[/] ({', '.join(failed)}): fix the slides named "
                      f"above, or write them anyway with --no-check.")
        raise typer.Exit(1)


@app.command("diagrams")
def diagrams(section: str = typer.Argument(None, help=SECTION_HELP)) -> None:
    """Redraw the diagrams that code draws for the decks (matplotlib, seconds, no lab runs)."""
    drawn = _draw(_sections(section))
    if not drawn:
        console.print("No diagrams to draw for that section: its figures come from the labs.")


@app.command("check")
def check(section: str = typer.Argument(None, help=SECTION_HELP)) -> None:
    """Open the built decks in headless Chromium: every slide renders, images load, nothing overflows."""
    from plscale.slides.build import CHROMIUM_HINT

    chromium = _chromium()
    if not chromium:
        raise UserError(f"The check opens each deck in Chromium, and none was found: {CHROMIUM_HINT}.")
    troubles = 0
    for s in _sections(section):
        if not s.html.is_file():
            console.print(f"{s.deck}: [red]not built yet[/] (`plscale slides build {s.id}`)")
            troubles += 1
            continue
        found = browser_problems(s, s.html, chromium)
        console.print(f"{s.deck}: " + ("ok" if not found else f"[red]{len(found)} problem(s)[/]"))
        for line in found:
            console.print(f"    {line}")
        troubles += len(found)
    if troubles:
        console.print(f"[red]{troubles} problem(s)[/]: fix the slides named above and run `plscale slides build`.")
        raise typer.Exit(1)


def _chromium() -> str | None:
    from plscale.slides.browser import find_chromium

    return find_chromium()


def browser_problems(section, html: Path, chromium: str) -> list[str]:
    """The browser check of one built deck against its source's slide count."""
    from plscale.slides import browser

    return browser.problems(html, browser.count_slides(section.source.read_text()), chromium)


def _draw(sections) -> list[Path]:
    drawn = []
    for s in sections:
        if s.diagrams:
            module = importlib.import_module(f"plscale.slides.diagrams.{s.diagrams}")
            start = time.perf_counter()
            paths = module.draw(s.folder / "figures")
            console.print(f"{s.deck}: {len(paths)} diagrams in {s.folder / 'figures'} ({time.perf_counter() - start:.1f} s)")
            drawn += paths
    return drawn


def _refresh(sections, data_dir: Path | None) -> None:
    from plscale.slides import refresh

    lab_list = list({lab.id: lab for s in sections for lab in s.labs}.values())
    if lab_list:
        refresh.refresh(lab_list, data_dir=data_dir, echo=console.print)
    _draw(sections)
