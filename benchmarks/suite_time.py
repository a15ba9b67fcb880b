"""How long `make test` takes, and where the time goes: the whole suite timed as the Makefile
runs it, then the slowest test files and tests.

    python benchmarks/suite_time.py                  # as `make test`: 2 workers, a file to each
    python benchmarks/suite_time.py --workers 0      # one process, one test after another
    python benchmarks/suite_time.py --top 25 -- -m "not e2e"     # arguments after -- go to pytest

Prints the wall time against the target (15 min on 2 cores), the CPU the run used, the test files
by the seconds their tests took (setup, call and teardown; with workers these overlap, so they add
up to more than the wall time) and the slowest tests. The per-test times come from pytest's JUnit
XML report.
"""

import argparse
import collections
import resource
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TARGET_MIN = 15


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workers", type=int, default=2, help="pytest-xdist workers (0: none), as TEST_WORKERS")
    ap.add_argument("--top", type=int, default=15, help="how many files and tests to list")
    ap.add_argument("pytest_args", nargs="*", help="more pytest arguments (after --)")
    args = ap.parse_args()
    if args.workers < 0 or args.top < 1:
        ap.error("--workers: 0 or more; --top: 1 or more")
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "junit.xml"
        argv = [sys.executable, "-m", "pytest", "-q", f"--junitxml={report}", *args.pytest_args]
        if args.workers:
            argv += ["-n", str(args.workers), "--dist", "loadfile", "--no-loadscope-reorder"]   # as the Makefile
        t0 = time.perf_counter()
        done = subprocess.run(argv, cwd=ROOT)
        wall = time.perf_counter() - t0
        used = resource.getrusage(resource.RUSAGE_CHILDREN)
        if not report.is_file():
            print(f"pytest exited {done.returncode} before writing its report", file=sys.stderr)
            return done.returncode or 1
        cases = [(tc.get("classname", "").split(".")[-1], tc.get("name", ""), float(tc.get("time") or 0))
                 for tc in ET.parse(report).getroot().iter("testcase")]
    by_file, count = collections.Counter(), collections.Counter()
    for module, _, seconds in cases:
        by_file[module] += seconds
        count[module] += 1
    print(f"\nsuite: {len(cases)} tests, {wall / 60:.1f} min wall ({'%d workers' % args.workers if args.workers else 'one process'}), "
          f"{(used.ru_utime + used.ru_stime) / 60:.1f} min of CPU; target {TARGET_MIN} min on 2 cores: "
          + ("met" if wall <= 60 * TARGET_MIN else f"{wall / 60 - TARGET_MIN:.1f} min over"))
    print("\nslowest files (seconds of their tests, tests):")
    for module, seconds in by_file.most_common(args.top):
        print(f"  {seconds:7.1f} s {count[module]:5d}  {module}")
    print("\nslowest tests:")
    for module, name, seconds in sorted(cases, key=lambda c: -c[2])[:args.top]:
        print(f"  {seconds:7.1f} s  {module}::{name}")
    return done.returncode


if __name__ == "__main__":
    sys.exit(main())
