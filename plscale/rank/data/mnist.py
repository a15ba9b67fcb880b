"""MNIST as uint8 arrays, from (in order) a local folder of idx files, the Hugging Face
hub through `datasets` (cached), or, offline with neither, synthetic seven-segment
digits that are clearly labelled as not being MNIST."""

import gzip
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from plscale.datafiles.mnist import find_mnist
from plscale.rank.data.digits import synthetic_digits
from plscale.rank.data.sources import first_available


@dataclass
class Split:
    images: np.ndarray  # (n, 28, 28) uint8
    labels: np.ndarray  # (n,) int64


@dataclass
class Mnist:
    train: Split
    test: Split
    source: str         # where the data came from, for the output and summary.json
    real: bool          # False for the offline fallback


def read_idx(path: Path) -> np.ndarray:
    raw = gzip.open(path).read() if path.suffix == ".gz" else path.read_bytes()
    magic, n = struct.unpack(">II", raw[:8])
    if magic == 2051:
        rows, cols = struct.unpack(">II", raw[8:16])
        return np.frombuffer(raw, np.uint8, offset=16).reshape(n, rows, cols)
    if magic == 2049:
        return np.frombuffer(raw, np.uint8, offset=8).astype(np.int64)
    raise ValueError(f"{path} is not an MNIST idx file (magic {magic})")


def from_folder(folder: Path) -> Mnist:
    files = find_mnist(folder)
    split = lambda kind: Split(read_idx(files[f"{kind}_images"]), read_idx(files[f"{kind}_labels"]))
    return Mnist(split("train"), split("test"), f"MNIST idx files in {folder}", True)


def from_hub() -> Mnist:
    import datasets

    ds = datasets.load_dataset("ylecun/mnist")
    split = lambda name: Split(np.stack([np.asarray(im, dtype=np.uint8) for im in ds[name]["image"]]),
                               np.asarray(ds[name]["label"], dtype=np.int64))
    return Mnist(split("train"), split("test"), "MNIST from the Hugging Face hub (ylecun/mnist)", True)


def offline_fallback() -> Mnist:
    images, labels = synthetic_digits(14_000, seed=1234)
    return Mnist(Split(images[:12_000], labels[:12_000]), Split(images[12_000:], labels[12_000:]),
                 "OFFLINE FALLBACK: synthetic seven-segment digits, not MNIST "
                 "(set --data-dir to MNIST idx files for the real thing)", False)


def load() -> Mnist:
    return first_available("MNIST", from_folder, from_hub, offline_fallback)
