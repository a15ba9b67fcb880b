"""Files that are replaced whole or not at all: a reader never sees half a file, and a
failed write leaves the good one in place."""

import json
import os
import tempfile
from contextlib import contextmanager
from pathlib import Path


def write_atomic(path: Path, text: str) -> None:
    """Write via a temporary file in the same folder, then rename over the target."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


@contextmanager
def replacing(path: Path):
    """A temporary path beside `path` (same suffix) for a writer that needs a file name (savefig,
    copyfile, a subprocess): it replaces `path` when the block ends well, and is removed otherwise."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}.", suffix=path.suffix)
    os.close(fd)
    try:
        yield Path(tmp)
        os.replace(tmp, path)
    finally:
        Path(tmp).unlink(missing_ok=True)


def write_json(path: Path, data) -> None:
    write_atomic(path, json.dumps(data, indent=2, default=str) + "\n")


def read_json(path: Path):
    return json.loads(Path(path).read_text())


def read_json_object(path: Path, fix: str) -> dict:
    """A JSON file that must hold an object; one line (UserError) naming the file and `fix`
    when it is cut short (an interrupted copy) or holds something else."""
    from plscale.errors import UserError

    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise UserError(f"{path} is not valid JSON (cut short?): {fix}") from exc
    if not isinstance(data, dict):
        raise UserError(f"{path} holds a JSON {type(data).__name__}, not an object: {fix}")
    return data
