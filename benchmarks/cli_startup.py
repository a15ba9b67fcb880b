"""How long host-side commands take to start, beside `deepspeed --help` for comparison.

    python benchmarks/cli_startup.py [--repeat 5]

Host-side commands must not import torch or deepspeed: `plscale --help` and
`plscale lab list` should stay well under a second. Prints the median wall time of each.
"""

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

BIN = Path(sys.executable).parent
COMMANDS = {
    "plscale --help": [str(BIN / "plscale"), "--help"],
    "plscale --version": [str(BIN / "plscale"), "--version"],
    "plscale lab list": [str(BIN / "plscale"), "lab", "list"],
    "plscale runpod --help": [str(BIN / "plscale"), "runpod", "--help"],
    "plscale lab run mnist --dry-run": [str(BIN / "plscale"), "lab", "run", "mnist", "--dry-run"],
    "python -c 'import torch'": [sys.executable, "-c", "import torch"],
    "deepspeed --help": [str(BIN / "deepspeed"), "--help"],
}


def timed(argv: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    rows = []
    for name, argv in COMMANDS.items():
        timed(argv)  # warm the file cache
        times = [timed(argv) for _ in range(args.repeat)]
        rows.append((name, statistics.median(times), min(times)))
    base = dict((name, median) for name, median, _ in rows)["deepspeed --help"]
    print(f"{'command':36} {'median s':>9} {'min s':>7} {'vs deepspeed --help':>20}")
    for name, median, low in rows:
        print(f"{name:36} {median:9.3f} {low:7.3f} {median / base:19.2f}x")


if __name__ == "__main__":
    main()
