"""Which exercises a student has started and whether their last check passed, for `plscale
exercise list`: DIR/.plscale-exercises.json, the file's SHA-256 and result at its last check
(a file changed since then reads "started")."""

import hashlib
import json
from pathlib import Path

from plscale.exercises import Exercise
from plscale.files import write_json

RECORD = ".plscale-exercises.json"


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _read(folder: Path) -> dict:
    try:
        return json.loads((folder / RECORD).read_text())
    except (OSError, ValueError):
        return {}


def record(exercise: Exercise, file: Path, passed: bool) -> None:
    """Remember the result of checking `file` beside it, when it is a file `start` names
    (NAME.py): the only files `list` looks at."""
    if file.name != f"{exercise.name}.py":
        return
    results = _read(file.parent)
    results[file.name] = {"exercise": exercise.name, "sha256": _digest(file), "passed": passed}
    try:
        write_json(file.parent / RECORD, results)
    except OSError:  # a read-only folder: the check still counts, only `list` will not know
        pass


def status(exercise: Exercise, folder: Path) -> str:
    """not started, started, passing or failing (the started file as it was last checked)."""
    file = folder / f"{exercise.name}.py"
    if not file.is_file():
        return "not started"
    last = _read(folder).get(file.name)
    if not last or last.get("sha256") != _digest(file):
        return "started"
    return "passing" if last.get("passed") else "failing"
