"""The course's slides: the course outline (slides/course.yaml) joined with the labs, decks built
with Marp, diagrams drawn by code, and the browser check of the built decks."""
