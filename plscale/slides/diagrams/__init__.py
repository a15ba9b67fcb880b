"""Diagrams drawn by code for the conceptual decks. A module here (named by a section's
`diagrams:` in slides/course.yaml) has `draw(out: Path) -> list[Path]`, writing PNGs into the
deck's figures/ folder; `plscale slides diagrams` runs them."""
