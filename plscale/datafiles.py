"""Find a dataset's files in a local folder. Pure Python: the host checks `--data-dir`
before launching, and the ranks load from what it finds.

Local folder, in order: `--data-dir`, then PLSCALE_DATA_DIR; a dataset may also sit in
a sub-folder named after it (`DIR/mnist/`).
"""

import os
from pathlib import Path

from plscale.errors import UserError

MNIST_FILES = {
    "train_images": ("train-images-idx3-ubyte", "train-images.idx3-ubyte"),
    "train_labels": ("train-labels-idx1-ubyte", "train-labels.idx1-ubyte"),
    "test_images": ("t10k-images-idx3-ubyte", "t10k-images.idx3-ubyte"),
    "test_labels": ("t10k-labels-idx1-ubyte", "t10k-labels.idx1-ubyte"),
}


def data_dir() -> Path | None:
    value = os.environ.get("PLSCALE_DATA_DIR")
    return Path(value) if value else None


def _candidates(folder: Path, name: str) -> list[Path]:
    return [folder, folder / name, folder / name.upper(), folder / name.upper() / "raw", folder / "raw"]


def find_mnist(folder: Path) -> dict[str, Path]:
    """The four idx files (plain or .gz) under `folder`, or a UserError naming them."""
    for base in _candidates(folder, "mnist"):
        found = {}
        for key, stems in MNIST_FILES.items():
            for stem in stems:
                for path in (base / stem, base / f"{stem}.gz"):
                    if path.is_file():
                        found.setdefault(key, path)
        if len(found) == len(MNIST_FILES):
            return found
    raise UserError(f"{folder} has no MNIST idx files: it needs train-images-idx3-ubyte, "
                    f"train-labels-idx1-ubyte, t10k-images-idx3-ubyte, t10k-labels-idx1-ubyte "
                    f"(each may end in .gz), directly or in {folder}/mnist/.")


FINDERS = {"mnist": find_mnist}


def check(dataset: str | None, folder: Path | None) -> None:
    """Fail early (host side) when the local data folder lacks the lab's dataset."""
    if dataset in FINDERS and folder is not None:
        if not folder.is_dir():
            raise UserError(f"Data folder {folder} does not exist: fix --data-dir or PLSCALE_DATA_DIR.")
        FINDERS[dataset](folder)
