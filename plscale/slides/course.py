"""The course: slides/course.yaml's sections, each joined with its deck and the labs that serve it.

Which lab serves which section is said by the labs (the keys of `sections:` in lab.yaml); the
course outline says which sections exist and where their decks are. A section with no lab is
listed as such; a lab naming a section the outline lacks is an error.
"""

import os
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from plscale.errors import UserError, did_you_mean
from plscale.lab import labs as lab_registry
from plscale.run import references

KINDS = ("concept", "hands-on")


def slides_root() -> Path:
    return Path(os.environ.get("PLSCALE_SLIDES_DIR", Path(__file__).resolve().parents[2] / "slides"))


@dataclass
class Section:
    number: int
    id: str
    title: str
    deck: str          # the deck's folder under slides/
    kind: str
    summary: str
    diagrams: str | None = None  # the plscale.slides.diagrams module drawing its figures
    labs: list = field(default_factory=list)    # Lab objects serving this section, in lab order
    topics: dict = field(default_factory=dict)  # lab id -> the topics it covers here

    @property
    def folder(self) -> Path:
        return slides_root() / self.deck

    @property
    def source(self) -> Path:
        return self.folder / "deck.md"

    @property
    def html(self) -> Path:
        return self.folder / "deck.html"

    @property
    def pdf(self) -> Path:
        return self.folder / "deck.pdf"


@dataclass
class LabStatus:
    """What a lab has to show: a CPU reference (measured) and whether any GPU figure exists."""
    cpu: str       # e.g. "yes: 2 ranks, 53 s" or "no reference yet"
    gpu: str       # "yes" or "none measured yet"


def load_course() -> list[Section]:
    """The sections in course order, with their labs attached."""
    path = slides_root() / "course.yaml"
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise UserError(f"Cannot read the course outline {path}: {exc}. Restore it from git.") from None
    if not isinstance(raw, dict) or not isinstance(raw.get("sections"), list):
        raise UserError(f"{path} must hold `sections:`, a list of sections. Restore it from git.")
    sections = []
    for number, entry in enumerate(raw["sections"], start=1):
        if not isinstance(entry, dict):
            raise UserError(f"{path}: section {number} is not a mapping (id, title, deck, kind, summary).")
        missing = [key for key in ("id", "title", "deck", "kind", "summary") if key not in entry]
        if missing:
            raise UserError(f"{path}: section {number} lacks {', '.join(missing)}. Add them.")
        if entry["kind"] not in KINDS:
            raise UserError(f"{path}: section {entry['id']} has kind {entry['kind']!r}; use one of {', '.join(KINDS)}.")
        diagrams = entry.get("diagrams")
        if diagrams and not (Path(__file__).parent / "diagrams" / f"{diagrams}.py").is_file():
            raise UserError(f"{path}: section {entry['id']} names diagrams {diagrams!r}, but "
                            f"plscale/slides/diagrams/{diagrams}.py does not exist. Fix the name.")
        sections.append(Section(number, entry["id"], entry["title"], entry["deck"], entry["kind"],
                                entry["summary"], diagrams))
    by_id = {s.id: s for s in sections}
    for lab in lab_registry.all_labs():
        for section_id, topics in lab.sections.items():
            if section_id not in by_id:
                raise UserError(f"{lab.folder / 'lab.yaml'} names course section {section_id!r}, which "
                                f"{path} lacks.{did_you_mean(section_id, by_id)} Fix the id or add the section.")
            by_id[section_id].labs.append(lab)
            by_id[section_id].topics[lab.id] = topics
    return sections


def find_section(name: str) -> Section:
    """A section by id, number, deck folder or diagrams module, or the first section a lab serves."""
    sections = load_course()
    key = name.lower()
    for section in sections:
        if key in (section.id, str(section.number), f"{section.number:02d}", section.deck, section.diagrams):
            return section
    try:  # a lab's id or alias: its first section (lab.yaml lists its main one first)
        lab, _ = lab_registry.find(name)
    except UserError:
        lab = None
    if lab and lab.sections:
        return next(s for s in sections if s.id == next(iter(lab.sections)))
    raise UserError(f"No course section {name!r}.{did_you_mean(key, [s.id for s in sections])} "
                    f"`plscale course` lists them (a lab's id works too).")


def lab_status(lab) -> LabStatus:
    """From the lab's reference.json: a measured CPU run, and a GPU section if one was measured."""
    ref = references.load(lab.folder)  # a damaged file is one line naming it
    if ref is None:
        return LabStatus("no reference yet", "none measured yet")
    cpu = ref.get("cpu") or {}
    entry = cpu.get(lab.default_variant) or next(iter(cpu.values()), None)
    cpu_text = "no reference yet"
    if entry:
        unit = "devices" if lab.launcher == "jax" else "ranks"
        count = entry.get("devices") or entry.get("world_size") or lab.default_ranks
        cpu_text = f"yes: {count} {unit}, {entry.get('wall_s', 0):.0f} s" + ("" if entry.get("passed", True) else ", checks failed")
    return LabStatus(cpu_text, "yes" if ref.get("gpu") else "none measured yet")
