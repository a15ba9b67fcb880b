"""Collective benchmarks the nccl-tests way: message sizes, algorithm and bus bandwidth.

Host-side and torch-free: the CLI validates with it before launching, the ranks format
with it. The convention (nccl-tests, doc/PERFORMANCE.md):

    algbw = S / t             S = the size of the whole buffer, t = the time of one call
    busbw = algbw * factor    the bytes each rank's link really carries, per second

    all_reduce      2(N-1)/N  reduce-scatter, then all-gather: every byte crosses twice
    all_gather       (N-1)/N  S is the gathered output; each rank receives all but its part
    reduce_scatter   (N-1)/N  S is the input; each rank sends all but its part
    all_to_all       (N-1)/N  each rank keeps 1/N of its buffer and sends the rest
    broadcast, reduce      1  a pipelined chain moves S over every link once

busbw is comparable across N and across collectives: it tends to the link's bandwidth.
Sizes are bytes; K, M, G are powers of 1024 as in nccl-tests (`-b 32K -e 64M`).
"""

import csv
import re
from pathlib import Path

from plscale.errors import did_you_mean
from plscale.predict.errors import PredictionError
from plscale.predict.units import GiB, KiB, MiB

BUS_FACTORS = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "all_to_all": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,
    "reduce": lambda n: 1.0,
}
OPS = tuple(BUS_FACTORS)
DEFAULT_OPS = "all_reduce,all_gather,reduce_scatter,broadcast,all_to_all"
SHARDED = ("all_gather", "reduce_scatter", "all_to_all")  # the buffer holds one part per rank
DTYPES = {"float32": (4, "float"), "float64": (8, "double"), "float16": (2, "half"),
          "bfloat16": (2, "bfloat16"), "int32": (4, "int32"), "int64": (8, "int64"),
          "int8": (1, "int8"), "uint8": (1, "uint8")}          # name -> (bytes, nccl-tests name)
UNITS = {"": 1, "K": KiB, "M": MiB, "G": GiB, "T": 2**40}
DEFAULT_MAX = {"cpu": 64 * MiB, "cuda": GiB}               # `auto` sizes stop here, or lower
BUFFERS_PER_RANK = 3  # the largest message, plus output (or a copy) and the ring's inbox: a safe bound


def parse_size(text: str) -> int:
    """'32K' -> 32768, '64M', '1G', '4096', '1.5M'; a trailing B or iB is allowed."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kKmMgGtT]?)(?:i?[bB])?\s*", text)
    if not match:
        raise PredictionError("sizes", text, f"Size {text!r} does not parse: write bytes with K, M or G (powers of "
                                             f"1024), e.g. 32K, 64M, 1G.", lead=False)
    value = float(match.group(1)) * UNITS[match.group(2).upper()]
    if value < 1 or value != int(value):
        raise PredictionError("sizes", text, f"Size {text!r} is not a whole number of bytes of 1 or more.", lead=False)
    return int(value)


def parse_sizes(text: str) -> list[int]:
    """'32K-64M' doubles from 32K up to 64M (nccl-tests -b 32K -e 64M -f 2); '32K,1M,64M' lists
    sizes; items can mix: '4K,32K-1M'. Sorted, without repeats."""
    sizes = set()
    for item in str(text).split(","):
        low, dash, high = item.partition("-")
        if not dash:
            sizes.add(parse_size(item))
            continue
        start, stop = parse_size(low), parse_size(high)
        if start > stop:
            raise PredictionError("sizes", item, f"Size range {item!r} runs backwards: put the smaller size first, "
                                                 f"e.g. 32K-64M.", lead=False)
        while start <= stop:
            sizes.add(start)
            start *= 2
    return sorted(sizes)


def parse_ops(text: str) -> list[str]:
    ops = [op.strip().replace("-", "_") for op in str(text).split(",") if op.strip()]
    if not ops:
        raise PredictionError("ops", text, f"No collectives named: use some of {', '.join(OPS)}.", lead=False)
    for op in ops:
        if op not in OPS:
            raise PredictionError("ops", op, f"Unknown collective {op!r}.{did_you_mean(op, OPS)} Use some of "
                                             f"{', '.join(OPS)}.", lead=False)
    return list(dict.fromkeys(ops))


def check_dtype(name: str) -> str:
    if name not in DTYPES:
        raise PredictionError("dtype", name, f"Unknown dtype {name!r}.{did_you_mean(name, DTYPES)} Use one of "
                                             f"{', '.join(DTYPES)}.", lead=False)
    return name


def human(size: float) -> str:
    """32768 -> '32K', 1.5 * 2**30 -> '1.5G' (the way sizes are written on the command line)."""
    for unit in ("T", "G", "M", "K"):
        if size >= UNITS[unit]:
            value = size / UNITS[unit]
            return f"{value:.0f}{unit}" if value == int(value) else f"{value:.1f}{unit}"
    return f"{size:.0f}B"


def element_count(op: str, size: int, dtype: str, ranks: int) -> int:
    """Elements in the buffer for a message of `size` bytes: whole elements, and for sharded
    collectives a multiple of the rank count (nccl-tests rounds down the same way)."""
    count = size // DTYPES[dtype][0]
    return count - count % ranks if op in SHARDED else count


def resolve_sizes(text: str, ops: list[str], dtype: str, ranks: int, device: str, available: int | None) -> list[int]:
    """The sizes to run: parsed (or `auto`: 32K doubling up to what the machine fits), each
    checked to hold at least one element per rank, the largest checked against memory."""
    if str(text).strip() == "auto":
        cap = DEFAULT_MAX[device]
        if available:
            cap = min(cap, max(32 * 2**10, available // (2 * BUFFERS_PER_RANK * (ranks if device == "cpu" else 1))))
        text = f"32K-{cap}"
    sizes = parse_sizes(text)
    for op in ops:
        if element_count(op, sizes[0], dtype, ranks) == 0:
            least = DTYPES[dtype][0] * (ranks if op in SHARDED else 1)
            raise PredictionError("sizes", sizes[0], f"Size {sizes[0]} B holds no {dtype} element"
                                                     f"{' per rank' if op in SHARDED else ''} for {op}: use {least} B "
                                                     f"or more.", lead=False)
    check_fits(sizes[-1], ranks, device, available)
    return sizes


def check_fits(size: int, ranks: int, device: str, available: int | None) -> None:
    """A PredictionError when the largest message cannot fit: on CPU all ranks share the host's memory,
    on GPUs each rank has its own."""
    if not available:
        return
    need = BUFFERS_PER_RANK * size * (ranks if device == "cpu" else 1)
    if need > 0.8 * available:
        fits = 2 ** (int(0.8 * available / (BUFFERS_PER_RANK * (ranks if device == "cpu" else 1))).bit_length() - 1)
        where = f"{ranks} CPU ranks share {human(available)} of memory" if device == "cpu" \
            else f"each GPU has {human(available)}"
        raise PredictionError("sizes", size, f"Messages of {human(size)} need about {human(need)} ({BUFFERS_PER_RANK} "
                                             f"buffers per rank) but {where}: use sizes up to {human(fits)} (e.g. "
                                             f"{{sizes}} 32K-{human(fits)}).", lead=False)


def bus_factor(op: str, ranks: int) -> float:
    return BUS_FACTORS[op](ranks)


def ring_bytes_sent(numel: int, itemsize: int, n: int) -> list[int]:
    """Bytes rank r of a ring all-reduce sends, numel elements cut into n chunks differing by at
    most one (as torch.tensor_split cuts them): every chunk but two (it never sends chunk r+1 in
    the reduce-scatter, nor r+2 in the all-gather), 2(n-1)/n x S on average (the bus factor)."""
    sizes = [numel // n + (i < numel % n) for i in range(n)]
    return [(2 * numel - sizes[(r + 1) % n] - sizes[(r + 2) % n]) * itemsize for r in range(n)]


def ring_schedule(n: int) -> list[tuple[str, int, list[int]]]:
    """(phase, step, the chunk each rank r sends to r+1) for the ring all-reduce's 2(n-1) steps, as
    plscale/strategies/collectives/ring.py runs them: reduce-scatter step t sends chunk r-t, all-gather r+1-t.

    >>> ring_schedule(3)[1:3]
    [('reduce-scatter', 1, [2, 0, 1]), ('all-gather', 0, [1, 2, 0])]
    """
    return [(phase, t, [(r - t + (phase == "all-gather")) % n for r in range(n)])
            for phase in ("reduce-scatter", "all-gather") for t in range(n - 1)]


def naive_bytes_sent(nbytes: int, n: int) -> list[int]:
    """Bytes each rank sends in the naive all-reduce via rank 0 (plscale/strategies/collectives/naive.py).

    >>> naive_bytes_sent(100, 4)
    [300, 100, 100, 100]
    """
    return [(n - 1) * nbytes] + [nbytes] * (n - 1)


def bandwidths(op: str, size: int, seconds: float, ranks: int) -> tuple[float, float]:
    """(algbw, busbw) in GB/s (10^9 bytes per second, as nccl-tests prints)."""
    algbw = size / seconds / 1e9
    return algbw, algbw * bus_factor(op, ranks)


HEADER = [
    "#       size         count      type   redop    root     time   algbw   busbw  #wrong",
    "#        (B)    (elements)                               (us)  (GB/s)  (GB/s)        ",
]


def format_row(row: dict) -> str:
    """One nccl-tests line; row: size, count, dtype, op, time_us, algbw, busbw, wrong
    (+ ring_time_us and ratio when the hand-written ring ran beside the library)."""
    redop = "sum" if row["op"] in ("all_reduce", "reduce_scatter", "reduce") else "none"
    root = 0 if row["op"] in ("broadcast", "reduce") else -1
    line = (f"{row['size']:12d}  {row['count']:12d}  {DTYPES[row['dtype']][1]:>8}  {redop:>6}  {root:6d}  "
            f"{row['time_us']:7.1f}  {row['algbw']:6.2f}  {row['busbw']:6.2f}  {row['wrong']:6d}")
    if row.get("ring_time_us") is not None:
        line += f"  {row['ring_time_us']:9.1f}  {row['ring_busbw']:6.2f}  {row['ratio']:6.2f}x"
    return line


def format_table(op: str, rows: list[dict], ranks: int, backend: str) -> list[str]:
    """The nccl-tests block for one collective, ending with its average bus bandwidth."""
    ring = any(r.get("ring_time_us") is not None for r in rows)
    lines = [f"# {op} on {ranks} ranks over {backend}: busbw = algbw x {bus_factor(op, ranks):.3g}"]
    lines += [HEADER[0] + ("  ring time  ring bw  ring/lib" if ring else ""),
              HEADER[1] + ("       (us)   (GB/s)  time" if ring else "")]
    lines += [format_row(r) for r in rows]
    if rows:
        lines.append(f"# Avg bus bandwidth    : {sum(r['busbw'] for r in rows) / len(rows):.4g} GB/s")
    return lines


CSV_FIELDS = ["op", "size", "count", "dtype", "ranks", "backend", "iters", "time_us", "algbw", "busbw", "wrong",
              "ring_time_us", "ring_busbw", "ratio", "naive_time_us", "naive_busbw"]


def write_csv(path: Path, rows: list[dict]) -> None:
    with open(path, "w", newline="") as out:
        writer = csv.DictWriter(out, fieldnames=CSV_FIELDS, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)


def read_csv(path: Path) -> list[dict]:
    with open(path, newline="") as src:
        return [{k: (float(v) if v not in ("", None) and k not in ("op", "dtype", "backend") else v or None)
                 for k, v in row.items()} for row in csv.DictReader(src)]

