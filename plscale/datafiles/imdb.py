"""IMDB reviews in a local folder, in one of two layouts:

    aclImdb/  train/{pos,neg}/*.txt  test/{pos,neg}/*.txt     (the original archive)
    *.csv     train.csv[.gz] and test.csv[.gz], with columns `text` and `label`
              (label 0/1 or neg/pos; other columns are ignored)

The folder itself, or a sub-folder `imdb/` or `aclImdb/`, may hold them. Pure Python: the
host reads and checks the files before launching (a bad file: one line, exit 2), and the
ranks read them with the same code.
"""

import csv
import gzip
import sys
from pathlib import Path

from plscale.errors import UserError

LABELS = {"0": 0, "1": 1, "neg": 0, "pos": 1, "negative": 0, "positive": 1}
SPLITS = ("train", "test")


def _bases(folder: Path) -> list[Path]:
    return [folder, folder / "imdb", folder / "aclImdb", folder / "imdb" / "aclImdb"]


def _csv(base: Path, split: str) -> Path | None:
    for name in (f"{split}.csv", f"{split}.csv.gz"):
        if (base / name).is_file():
            return base / name
    return None


def find_imdb(folder: Path, check: bool = True) -> dict:
    """{"layout": "aclImdb"|"csv", "train": path, "test": path}. With `check` the files are
    read and checked (columns, binary labels, no empty review), so a bad file fails here."""
    for base in _bases(folder):
        if all((base / split / side).is_dir() for split in SPLITS for side in ("pos", "neg")):
            found = {"layout": "aclImdb", "train": base / "train", "test": base / "test"}
            break
        if all(_csv(base, split) for split in SPLITS):
            found = {"layout": "csv", "train": _csv(base, "train"), "test": _csv(base, "test")}
            break
    else:
        raise UserError(f"{folder} has no IMDB reviews: it needs train.csv and test.csv (may end in .gz; "
                        f"columns text,label) or the aclImdb layout train/{{pos,neg}}/*.txt, "
                        f"test/{{pos,neg}}/*.txt, directly or in {folder}/imdb/.")
    for split in SPLITS if check else ():
        read_split(found, split)
    return found


def read_split(found: dict, split: str) -> tuple[list[str], list[int]]:
    """(texts, labels) of one split, in file order."""
    if found["layout"] == "aclImdb":
        return read_aclimdb(found[split])
    return read_csv(found[split])


def read_aclimdb(split_dir: Path) -> tuple[list[str], list[int]]:
    texts, labels = [], []
    for side, label in (("neg", 0), ("pos", 1)):
        files = sorted((split_dir / side).glob("*.txt"))
        if not files:
            raise UserError(f"{split_dir / side} has no .txt reviews: the aclImdb layout needs some in each "
                            f"of pos/ and neg/.")
        for path in files:
            text = path.read_text(encoding="utf-8", errors="replace").strip()
            if not text:
                raise UserError(f"{path} is an empty review: remove the file or give it text.")
            texts.append(text)
            labels.append(label)
    return texts, labels


def read_csv(path: Path) -> tuple[list[str], list[int]]:
    csv.field_size_limit(min(sys.maxsize, 2**31 - 1))
    opener = gzip.open if path.suffix == ".gz" else open
    texts, labels = [], []
    try:
        with opener(path, "rt", encoding="utf-8", newline="") as handle:
            reader = csv.DictReader(handle)
            columns = [c.strip().lower() for c in reader.fieldnames or []]
            if "text" not in columns or "label" not in columns:
                raise UserError(f"{path} has columns {columns or 'none'}: an IMDB CSV needs a 'text' and a "
                                f"'label' column (label 0/1 or neg/pos) in its header row.")
            reader.fieldnames = columns
            for line, row in enumerate(reader, start=2):
                label = LABELS.get(str(row["label"]).strip().lower())
                if label is None:
                    raise UserError(f"{path} line {line}: label {row['label']!r} is not binary: use 0/1 "
                                    f"(or neg/pos) for negative/positive reviews.")
                text = (row["text"] or "").strip()
                if not text:
                    raise UserError(f"{path} line {line}: the review text is empty: remove the row or give "
                                    f"it text.")
                texts.append(text)
                labels.append(label)
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise UserError(f"Cannot read {path} as an IMDB CSV ({exc}): use UTF-8 CSV with text,label "
                        f"columns.") from None
    if not texts:
        raise UserError(f"{path} has a header but no reviews: add rows of text,label.")
    return texts, labels
