"""Find a dataset's files in a local folder. Pure Python: the host checks `--data-dir`
before launching (bad folder: one line, exit 2), and the ranks load from what it finds.

Local folder, in order: `--data-dir`, then PLSCALE_DATA_DIR; a dataset may also sit in a
sub-folder named after it (`DIR/mnist/`). One module per dataset; FINDERS names them.
"""

import os
from pathlib import Path

from plscale.datafiles.imdb import find_imdb
from plscale.datafiles.mnist import find_mnist
from plscale.datafiles.wikitext import find_wikitext
from plscale.errors import UserError

FINDERS = {"mnist": find_mnist, "imdb": find_imdb, "wikitext": find_wikitext}


def data_dir() -> Path | None:
    value = os.environ.get("PLSCALE_DATA_DIR")
    return Path(value) if value else None


def check(dataset: str | None, folder: Path | None) -> None:
    """Fail early (host side) when the local data folder lacks the lab's dataset."""
    if dataset in FINDERS and folder is not None:
        if not folder.is_dir():
            raise UserError(f"Data folder {folder} does not exist: fix --data-dir or PLSCALE_DATA_DIR.")
        FINDERS[dataset](folder)
