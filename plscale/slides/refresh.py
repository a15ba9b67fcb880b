"""Rerun the runs that make the labs' committed figures (`plscale slides build --refresh`).

Each lab.yaml ends with a `figures:` block saying where every file in its figures/ comes from:

    figures:
      - file: figures/memory_by_stage.png       # the committed file, relative to the lab's folder
        run: lab run zero --sweep --gpus 2 --cpu   # plscale's arguments
        take: memory_by_stage.png                 # what the run writes in its run (or sweep) directory
      - file: figures/compare.png
        compare:                                  # plscale report --compare of these runs
          - lab run mnist-dp --cpu --steps 100
          - lab run mnist-dp --cpu --steps 100 --set ds.lr=0.004
      - file: figures/imdb_loss.png
        manual: python benchmarks/imdb_accuracy.py --plot   # made by hand: how
        why: drawn by a benchmark from an 11-minute run      # and why it is not rerun

`compare:` runs each run, then `plscale report --compare` of their directories, whose --plot
PNG is the figure; a compared run may fail its checks (showing one break is often the point),
a `run:` must pass them. Figures from one run share it: each distinct run runs once, with
--data-dir D added to `lab run` of a lab that reads data. Host-side: nothing here imports torch.
"""

import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

from plscale.errors import UserError
from plscale.files import replacing

KEYS = {"file", "run", "take", "fails", "compare", "manual", "why"}
HEARTBEAT_S = 60  # a line on a long run this often: its elapsed time and the last line it wrote


@dataclass(frozen=True)
class Source:
    """Where one committed figure comes from: exactly one of run (+ take), compare, manual (+ why)."""
    lab: object                  # plscale.lab.labs.Lab
    file: str                    # relative to the lab's folder, e.g. figures/loss.png
    run: tuple = ()              # plscale's arguments
    take: str | None = None      # the file the run writes in its run or sweep directory
    fails: str | None = None     # the run fails on purpose (lab 12's), its output saying this: its figure is taken
    compare: tuple = ()          # several runs' arguments: the figure is report --compare's PNG
    manual: str | None = None    # how it is made by hand, when no run makes it
    why: str | None = None       # why it is not rerun

    @property
    def path(self) -> Path:
        return self.lab.folder / self.file

    @property
    def runs(self) -> tuple:
        """The runs this figure needs: one, several (compare) or none (manual)."""
        return (self.run,) if self.run else self.compare


def figure_sources(lab) -> list[Source]:
    """The `figures:` block of lab.yaml, checked; [] when the lab has none."""
    path = lab.folder / "lab.yaml"
    try:
        raw = (yaml.safe_load(path.read_text()) or {}).get("figures")
    except (OSError, yaml.YAMLError) as exc:
        raise UserError(f"Cannot read {path}: {exc}. Fix the manifest (see labs/README.md).") from None
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise UserError(f"{path}: `figures:` must be a list of entries, each `- file: figures/x.png` with `run:` "
                        f"and `take:`, `compare:` or `manual:` and `why:` (see plscale/slides/refresh.py).")
    sources, seen = [], set()
    for n, entry in enumerate(raw, 1):
        where = f"{path}, figures entry {n}"
        if not isinstance(entry, dict) or not isinstance(entry.get("file"), str):
            raise UserError(f"{where}: give `file: figures/NAME` and where it comes from (see plscale/slides/refresh.py).")
        where = f"{path}, figure {entry['file']}"
        if unknown := set(entry) - KEYS:
            raise UserError(f"{where}: unknown key(s) {', '.join(sorted(map(str, unknown)))}: use {', '.join(sorted(KEYS))}.")
        file = _relative(entry["file"], where, "file")
        if not file.startswith("figures/"):
            raise UserError(f"{where}: `file:` must lie in the lab's figures/ folder (file: figures/NAME).")
        if file in seen:
            raise UserError(f"{where}: declared twice: keep one entry.")
        seen.add(file)
        kinds = [k for k in ("run", "compare", "manual") if k in entry]
        if len(kinds) != 1:
            raise UserError(f"{where}: give exactly one of `run:` (with `take:`), `compare:` or `manual:` "
                            f"(with `why:`), not {' and '.join(kinds) or 'none'}.")
        kind = kinds[0]
        needs = {"run": {"take"}, "compare": set(), "manual": {"why"}}[kind]
        extra = set(entry) - {"file", kind} - needs - ({"fails"} if kind == "run" else set())
        if extra or needs - set(entry):
            raise UserError(f"{where}: `{kind}:` goes with {' '.join(f'`{k}:`' for k in ['file', *needs])} only; "
                            + (f"drop {', '.join(sorted(extra))}." if extra else f"add {', '.join(sorted(needs))}."))
        if kind == "manual":
            for key in ("manual", "why"):
                if not isinstance(entry[key], str) or not entry[key].strip():
                    raise UserError(f"{where}: `{key}:` must say in words {'how it is made' if key == 'manual' else 'why no run remakes it'}.")
            sources.append(Source(lab, file, manual=entry["manual"].strip(), why=entry["why"].strip()))
        elif kind == "run":
            take = _relative(entry["take"], where, "take")
            if Path(take).suffix != Path(file).suffix:
                raise UserError(f"{where}: `take: {take}` and the figure differ in type: take a {Path(file).suffix} file.")
            fails = entry.get("fails")
            if fails is not None and (not isinstance(fails, str) or not fails.strip()):
                raise UserError(f"{where}: `fails:` is what the run says when it fails on purpose, e.g. "
                                f"`fails: \"[FAIL] ranks keep pace\"`.")
            sources.append(Source(lab, file, run=_args(entry["run"], where), take=take, fails=fails))
        else:
            runs = entry["compare"]
            if not isinstance(runs, list) or len(runs) < 2:
                raise UserError(f"{where}: `compare:` must list 2 or more runs (plscale arguments), e.g. "
                                f"[lab run mnist-dp --steps 100, lab run mnist-dp --steps 100 --set ds.lr=0.004].")
            if Path(file).suffix != ".png":
                raise UserError(f"{where}: a `compare:` figure is report --compare's PNG: name it .png.")
            sources.append(Source(lab, file, compare=tuple(_args(r, where) for r in runs)))
    return sources


def _relative(value, where: str, key: str) -> str:
    if not isinstance(value, str) or not value or Path(value).is_absolute() or ".." in Path(value).parts:
        raise UserError(f"{where}: `{key}: {value}` must be a relative path inside the folder, without `..`.")
    return Path(value).as_posix()


def _args(value, where: str) -> tuple:
    try:
        args = tuple(shlex.split(value)) if isinstance(value, str) else ()
    except ValueError as exc:
        raise UserError(f"{where}: cannot split the run {value!r} into arguments ({exc}): fix its quoting.") from None
    if not args or args[0] == "plscale":
        raise UserError(f"{where}: a run is plscale's arguments without `plscale`, e.g. `lab run zero --sweep --gpus 2`.")
    if "--data-dir" in args:
        raise UserError(f"{where}: drop --data-dir from the run: `plscale slides build --refresh --data-dir D` adds it.")
    return args


def refresh(labs, data_dir=None, echo=print) -> list[Path]:
    """Rerun every distinct run the labs' figures come from, each with its runs directory in a
    temporary folder, and copy each figure over the committed one (atomically) once its run
    succeeded. A failed run raises UserError naming the command and its log (kept); its figures
    stay as they were, and those of the runs before it are already refreshed."""
    sources = [s for lab in labs for s in figure_sources(lab)]
    for s in sources:
        if s.manual:
            echo(f"not rerun: {s.lab.folder.name}/{s.file} ({s.why}); made by: {s.manual}")
    sources = [s for s in sources if not s.manual]
    runs = list(dict.fromkeys(_with_data(args, s.lab, data_dir) for s in sources for args in s.runs))
    compares = [s for s in sources if s.compare]
    total, start = len(runs) + len(compares), time.monotonic()
    work = Path(tempfile.mkdtemp(prefix="plscale-refresh-"))
    try:
        written = _refresh(sources, runs, compares, data_dir, work, start, echo)
    except KeyboardInterrupt:
        shutil.rmtree(work, ignore_errors=True)
        raise
    shutil.rmtree(work, ignore_errors=True)  # kept on a failure: its log is named in the error
    echo(f"refreshed {len(written)} figure(s) from {total} run(s) in {time.monotonic() - start:.0f} s")
    return written


def _refresh(sources, runs, compares, data_dir, work: Path, start: float, echo) -> list[Path]:
    total, written, dirs = len(runs) + len(compares), [], {}
    for n, args in enumerate(runs, 1):
        mine = [s for s in sources if s.run and _with_data(s.run, s.lab, data_dir) == args]
        said = {s.fails for s in mine}
        if len(said) > 1:
            raise UserError(f"`plscale {shlex.join(args)}`: its figures' entries disagree on `fails:` "
                            f"({', '.join(repr(f) for f in said)}): give them the same.")
        dirs[args] = _run(args, work, n, total, start, echo, lenient=not mine, fails=said.pop() if said else None)
        missing = [s.take for s in mine if not (dirs[args] / s.take).is_file()]
        if missing:
            raise UserError(f"`plscale {shlex.join(args)}` wrote no {', '.join(missing)} in {dirs[args]}: fix `take:` "
                            f"in {mine[0].lab.folder / 'lab.yaml'}; the committed figures are unchanged.")
        written += [_install(dirs[args] / s.take, s.path, echo) for s in mine]
    for n, s in enumerate(compares, len(runs) + 1):
        plot = work / f"compare-{n}.png"
        folders = [str(dirs[_with_data(args, s.lab, data_dir)]) for args in s.compare]
        _run(("report", "--compare", *folders, "--plot", str(plot)), work, n, total, start, echo)
        written.append(_install(plot, s.path, echo))
    return written


def _with_data(args: tuple, lab, data_dir) -> tuple:
    """`lab run` of a lab that reads a dataset gets --data-dir when one is given."""
    if data_dir and args[:2] == ("lab", "run") and lab.data:
        return (*args, "--data-dir", str(Path(data_dir).resolve()))
    return args


def _run(args: tuple, work: Path, n: int, total: int, start: float, echo, lenient: bool = False,
         fails: str | None = None) -> Path:
    """`plscale ARGS` with a runs directory of its own, its output in a log; the run (or sweep)
    directory it made. `lab run` and `report --compare` run in this process (plscale.run.flow,
    plscale.run.report); another command (`bench collectives`) as `python -m plscale.cli.main`.
    lenient: a run that finished (summary.json) but failed its checks counts as done. fails: the run
    fails on purpose and its output says this; one that succeeds, or fails otherwise, is an error."""
    runs, log = work / f"runs-{n}", work / f"run-{n}.log"
    runs.mkdir()
    command = f"plscale {shlex.join(args)}"
    echo(f"[{n}/{total}] {command}")
    began = time.monotonic()
    done = threading.Event()

    def heartbeat() -> None:
        while not done.wait(HEARTBEAT_S):
            echo(f"      {time.monotonic() - began:.0f} s: {_last_line(log)}")

    made = None
    with open(log, "w", buffering=1) as out:
        beat = threading.Thread(target=heartbeat, daemon=True)
        beat.start()
        try:
            made, code = _job(args, runs, out)
        finally:
            done.set()
            beat.join()
    if code == 130:  # Ctrl-C: the runner stopped every rank
        raise KeyboardInterrupt
    took = time.monotonic() - began
    if fails and (code == 0 or made is None or fails not in log.read_text(errors="replace")):
        how = "succeeded" if code == 0 else f"failed (exit {code}) without saying {fails!r}"
        raise UserError(f"`{command}` {how}, but its figure's entry says it fails on purpose saying {fails!r}: the lab "
                        f"changed; fix the run or its `fails:`. Its log: {log}. The committed figures are unchanged.")
    if fails:
        echo(f"      it failed (exit {code}), as it is meant to: {fails}")
    elif code != 0 and lenient and made is not None and (made / "summary.json").is_file():
        echo(f"      its checks failed (exit {code}), as a compared run may: kept for the comparison")
    elif code != 0:
        for line in log.read_text(errors="replace").splitlines()[-15:]:
            echo(f"      | {line}")
        raise UserError(f"`{command}` failed (exit {code}) after {took:.0f} s; its log: {log}. Its figures are "
                        f"unchanged: fix the run, or its entry in the lab's lab.yaml `figures:` block.")
    echo(f"      done in {took:.0f} s ({time.monotonic() - start:.0f} s in all)")
    if args[0] == "report":
        return runs
    if made is not None:
        return made
    dirs = sorted(p for p in runs.iterdir() if p.is_dir())
    sweeps = [p for p in dirs if (p / "sweep.json").is_file()]
    if len(sweeps) == 1 or len(dirs) == 1:
        return (sweeps or dirs)[0]
    raise UserError(f"`{command}` made {len(dirs)} run directories in {runs}, none of them a sweep: "
                    f"declare a run that makes one run or one sweep.")


def _job(args: tuple, runs: Path, out) -> tuple[Path | None, int]:
    """Run `plscale ARGS`, its output into `out`: (the run or sweep directory when known, exit code)."""
    from rich.console import Console

    from plscale.run import flow

    console = Console(file=out, width=160)
    try:
        if args[:2] == ("lab", "run"):
            request = flow.parse(list(args))
            if request.sweep:
                made = flow.sweep(request.name, request.opts, console, runs=runs)
                console.print(f"sweep directory: {made}")
            else:
                made = flow.run(request.name, request.opts, request.variant, console, runs=runs, layout=request.layout)
                flow.report(made, console)
            return made, 0
        if args[:2] == ("report", "--compare"):
            from plscale.run.compare import load_runs
            from plscale.run.report import compare

            folders, plot = list(args[2:-2]), Path(args[-1])
            compare(load_runs(folders, False), console, plot)
            return None, 0
    except flow.RunFailed as failed:
        return failed.run_dir, failed.code
    except UserError as exc:
        console.print(f"error: {exc}", markup=False, highlight=False)
        return None, exc.exit_code
    env = {**os.environ, "PLSCALE_RUNS_DIR": str(runs), "COLUMNS": "160"}
    proc = subprocess.Popen([sys.executable, "-m", "plscale.cli.main", *args], stdout=out,
                            stderr=subprocess.STDOUT, env=env, stdin=subprocess.DEVNULL)
    try:
        return None, proc.wait()
    except BaseException:  # Ctrl-C: stop the run before leaving
        proc.terminate()
        proc.wait()
        raise


def _last_line(log: Path) -> str:
    lines = [line.strip() for line in log.read_text(errors="replace").replace("\r", "\n").splitlines() if line.strip()]
    return lines[-1][:120] if lines else "(no output yet)"


def _install(made: Path, target: Path, echo) -> Path:
    """Copy `made` over `target` atomically (a temporary file beside it, then os.replace)."""
    if made.suffix == ".png" and made.read_bytes()[:8] != b"\x89PNG\r\n\x1a\n":
        raise UserError(f"{made} is not a PNG: the run wrote something else; {target} is unchanged.")
    with replacing(target) as partial:
        shutil.copyfile(made, partial)
    echo(f"      wrote {target}")
    return target
