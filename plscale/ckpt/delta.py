"""Incremental checkpoints: store each file as its difference from the last full checkpoint.

Between two checkpoints Adam touches every weight, so "only the parts that changed" is
everything; but a weight changes by a little. Its bits change in the low mantissa only:
sign, exponent and the leading mantissa bits stay. XOR-ing the new file's bytes with the
base file's bytes leaves zeros in the high byte of most 4-byte words; regrouped by byte
position (all first bytes, then all second bytes, ... as blosc's shuffle does), those
zeros form long runs that zlib packs away. Rebuilding
XORs again: new = base XOR (new XOR base), exact to the bit, and checked against the
checksum of the original file recorded in the manifest.

    encode_into(full_folder, base_folder, delta_folder, files)  # file -> file.xor.z
    rebuild(delta_folder, out_folder)                           # the original files, verified
"""

import shutil
import struct
import zlib
from pathlib import Path

import numpy as np

from plscale.ckpt import store

SUFFIX = ".xor.z"
HEADER = struct.Struct("<Q")  # the original length


def _bytes(path: Path) -> np.ndarray:
    return np.frombuffer(Path(path).read_bytes(), dtype=np.uint8)


def _xor(a: np.ndarray, b: np.ndarray, length: int) -> np.ndarray:
    """a XOR b over `length` bytes, the shorter one padded with zeros."""
    out = np.zeros(length, dtype=np.uint8)
    out[:len(a)] = a[:length]
    n = min(len(b), length)
    out[:n] ^= b[:n]
    return out


def encode(new: Path, base: Path, level: int = 1) -> bytes:
    data = _bytes(new)
    words = -(-len(data) // 4)
    xored = _xor(data, _bytes(base), 4 * words)  # padded to whole 4-byte words
    planes = xored.reshape(words, 4).T           # byte 0 of every word, then byte 1, ...
    return HEADER.pack(len(data)) + zlib.compress(planes.tobytes(), level)


def decode(blob: bytes, base: Path) -> bytes:
    (length,) = HEADER.unpack_from(blob)
    planes = np.frombuffer(zlib.decompress(blob[HEADER.size:]), dtype=np.uint8)
    xored = planes.reshape(4, -1).T.reshape(-1)
    return _xor(xored, _bytes(base), length).tobytes()


def encode_into(src: Path, base: Path, out: Path, rels: list) -> None:
    """Write each file rel of `src` into `out`: as rel.xor.z where `base` has it, else whole."""
    for rel in rels:
        target = Path(out) / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        if (Path(base) / rel).is_file():
            Path(str(target) + SUFFIX).write_bytes(encode(Path(src) / rel, Path(base) / rel))
        else:
            shutil.copyfile(Path(src) / rel, target)


def rebuild(folder: Path, out: Path) -> Path:
    """Write the full checkpoint a delta checkpoint stands for into `out`, each file checked."""
    folder, out = Path(folder), Path(out)
    manifest = store.read_manifest(folder)
    base = folder.parent / manifest["base"]
    shutil.rmtree(out, ignore_errors=True)
    for rel, want in manifest["restores"].items():
        target = out / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        stored = folder / (rel + SUFFIX)
        if stored.is_file():
            target.write_bytes(decode(stored.read_bytes(), base / rel))
        else:
            shutil.copyfile(folder / rel, target)
        if store.sha256(target) != want["sha256"]:
            raise ValueError(f"rebuilding {folder.name}/{rel} from {manifest['base']} gave other bytes than were saved")
    return out
