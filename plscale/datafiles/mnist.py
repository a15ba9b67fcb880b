"""MNIST's four idx files in a local folder."""

from pathlib import Path

from plscale.errors import UserError

MNIST_FILES = {
    "train_images": ("train-images-idx3-ubyte", "train-images.idx3-ubyte"),
    "train_labels": ("train-labels-idx1-ubyte", "train-labels.idx1-ubyte"),
    "test_images": ("t10k-images-idx3-ubyte", "t10k-images.idx3-ubyte"),
    "test_labels": ("t10k-labels-idx1-ubyte", "t10k-labels.idx1-ubyte"),
}


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

