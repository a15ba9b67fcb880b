"""WikiText-2's files in a local folder.

Accepted, directly in the folder or in a sub-folder wikitext-2/, wikitext-2-raw/,
wikitext-2-v1/ or wikitext-2-raw-v1/, first match wins:
    wiki.train.raw     wiki.valid.raw     wiki.test.raw        (wikitext-2-raw-v1)
    wiki.train.tokens  wiki.valid.tokens  wiki.test.tokens     (wikitext-2-v1, tokenized)
    train.txt          valid.txt          test.txt             (pytorch/examples' copy)
Training needs a train and a validation split. With only valid and test (a copy without the
train split, as the project's test data has), valid trains and test validates, and the loader says so.
"""

from dataclasses import dataclass
from pathlib import Path

from plscale.errors import UserError

SPLITS = ("train", "valid", "test")
PATTERNS = ("wiki.{}.raw", "wiki.{}.tokens", "{}.txt")
SUBFOLDERS = ("", "wikitext-2", "wikitext-2-raw", "wikitext-2-v1", "wikitext-2-raw-v1")


@dataclass
class WikiTextFiles:
    train: Path                # the split to train on
    valid: Path                # the split to measure perplexity on
    note: str = ""             # set when a split stands in for another


def _splits(base: Path) -> dict[str, Path]:
    for pattern in PATTERNS:
        found = {s: base / pattern.format(s) for s in SPLITS if (base / pattern.format(s)).is_file()}
        if found:
            return found
    return {}


def find_wikitext(folder: Path) -> WikiTextFiles:
    """The train and validation files under `folder`, or a UserError naming what is needed."""
    for sub in SUBFOLDERS:
        found = _splits(folder / sub if sub else folder)
        if "train" in found and ("valid" in found or "test" in found):
            return WikiTextFiles(found["train"], found.get("valid", found.get("test")))
        if "valid" in found and "test" in found:
            return WikiTextFiles(found["valid"], found["test"],
                                 f"no train split in {found['valid'].parent}: training on valid, "
                                 f"validating on test")
    raise UserError(f"{folder} has no WikiText-2 files: it needs a train and a valid (or test) split as "
                    f"wiki.{{train,valid,test}}.raw, wiki.*.tokens or {{train,valid,test}}.txt, directly "
                    f"or in {folder}/wikitext-2/.")
