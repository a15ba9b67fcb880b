"""`plscale course [SECTION]`: every section of the course with its labs, deck and status."""

import typer
from rich.table import Table

from plscale.cli.output import console


def _deck_status(section) -> str:
    if not section.source.is_file():
        return "[red]no deck[/]"
    built = [kind for kind, path in (("html", section.html), ("pdf", section.pdf)) if path.is_file()]
    return f"slides/{section.deck}" + (f" ({', '.join(built)})" if built else " (not built)")


def course(section: str = typer.Argument(None, help="A section's id, number or deck folder, or a lab's id: "
                                         "its labs, topics and deck.")) -> None:
    """The course, section by section: its lab(s), its deck, and what each lab has measured."""
    from plscale.slides.course import find_section, lab_status, load_course

    if section:
        _one(find_section(section))
        return
    table = Table(title="plscale course: sections, labs and decks", title_justify="left")
    for column in ("#", "section", "kind", "lab(s)", "deck", "runs on CPU", "GPU figure"):
        table.add_column(column, overflow="fold")
    for s in load_course():
        statuses = [lab_status(lab) for lab in s.labs]
        table.add_row(f"{s.number:02d}", f"{s.title}\n[dim]{s.id}[/]", s.kind,
                      "\n".join(f"{lab.number:02d} {lab.id}" for lab in s.labs) or "[dim]no lab: conceptual[/]",
                      _deck_status(s), "\n".join(st.cpu for st in statuses) or "-",
                      "\n".join(st.gpu for st in statuses) or "-")
    console.print(table)
    console.print("One section: `plscale course ID`. Build the decks: `plscale slides build`; open "
                  "slides/<deck>/deck.html in a browser.")


def _one(s) -> None:
    from plscale.slides.course import lab_status

    console.print(f"[bold]{s.number:02d} {s.title}[/] ({s.id}, {s.kind})")
    console.print(s.summary)
    console.print(f"deck: {_deck_status(s)}" + (f"; diagrams drawn by plscale/slides/diagrams/{s.diagrams}.py"
                                                 if s.diagrams else ""))
    if not s.labs:
        console.print("labs: none - a conceptual section; its diagrams are drawn by code.")
    for lab in s.labs:
        status = lab_status(lab)
        console.print(f"\nlab {lab.number:02d} {lab.id}: {lab.title}")
        console.print(f"  topics here: {'; '.join(s.topics[lab.id])}", soft_wrap=True)
        console.print(f"  run it: plscale lab run {lab.id} --gpus {lab.default_ranks}   "
                      f"(lesson: labs/{lab.folder.name}/README.md)")
        console.print(f"  runs on CPU: {status.cpu}; GPU figure: {status.gpu}")
