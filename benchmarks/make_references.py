"""Measure each lab's reference results for real and write labs/NN_slug/reference.json:

    .venv/bin/python benchmarks/make_references.py                 every lab, its default variant
    .venv/bin/python benchmarks/make_references.py mnist-dp zero   some labs
    .venv/bin/python benchmarks/make_references.py mnist-dp:accum  another variant of a lab
    .venv/bin/python benchmarks/make_references.py --gpu zero      on GPUs: a "gpu" section
    .venv/bin/python benchmarks/make_references.py --rederive      no run: rebuild every entry from
                                                                   its recorded run (new tolerance rules)
    .venv/bin/python benchmarks/make_references.py --data-dir ''  the built-in offline text a fresh
                                                                   machine falls back to: kept beside
                                                                   the real data's, under "other_data"

Each lab runs through the real CLI, one after another (never two at once), with the lab's
default settings and rank count: `plscale lab run LAB --variant V --cpu [--data-dir DIR]`
(without --cpu for --gpu). Datasets come from --data-dir (default PLSCALE_DATA_DIR), passed to
each lab that reads a dataset as `--data-dir DIR`; the run records what it read, and the
reference keeps that too, with the folder written as docs/data.md's examples write it, `~/data`
(DATA_DIR), in its command, its data_dir and its data line, not as this machine's path: on a
machine whose ~/data is laid out as docs/data.md says, the command reproduces the reference's
data. (`plscale report` reads a data line's folders as folders, so a run's own path and ~/data
name the same data source.) The run directories stay under runs/references/ (--runs-dir), so a reference can be
traced to the run that made it. The tolerance of each figure: plscale/run/references.py.
"""

import argparse
import io
import json
import os
import sys
import time
from pathlib import Path

from rich.console import Console

from plscale.errors import UserError
from plscale.lab import labs  # host side: no torch
from plscale.run import flow, references

ROOT = Path(__file__).resolve().parents[1]


NOTE = ("Measured for real by benchmarks/make_references.py on the project's development machine: "
        "{device}, the lab's default settings and rank count ({command}). {gpu}Hardware figures (times, "
        "rates, MFU, RSS) hold for that machine only: on another system they are flagged 'hardware'.")
DATA_DIR = "~/data"  # how a reference names the data folder it was measured with (docs/data.md)
DATA_NOTE = "; the data folder written as ~/data, laid out as docs/data.md says, not where it was on that machine"
NO_GPU = ("No 'gpu' section: no GPU was available to measure one, and none is invented; on a GPU machine, "
          "`benchmarks/make_references.py --gpu LAB` adds it. ")


def losses(run_dir: Path) -> list[float]:
    out = []
    path = run_dir / "metrics.jsonl"
    for line in path.read_text().splitlines() if path.is_file() else []:
        row = json.loads(line)
        if isinstance(row.get("loss"), (int, float)):
            out.append(row["loss"])
    return out


def named_generically(entry: dict, folder: str | None) -> dict:
    """The entry with this machine's data folder (`folder` as given, and resolved) written as
    DATA_DIR in its command, data_dir and data line: what a reader types, not where it ran."""
    if not folder or folder == DATA_DIR:
        return entry
    spellings = sorted({folder, str(Path(folder).expanduser().resolve())}, key=len, reverse=True)
    for key in ("command", "data_dir", "data"):
        for spelling in spellings:
            if isinstance(entry.get(key), str):
                entry[key] = entry[key].replace(spelling, DATA_DIR)
    return entry


def measure(lab, variant: str, gpu: bool, runs_dir: Path, data_dir: str | None) -> Path | None:
    """One real run, as `plscale lab run` does it; returns the reference.json it updated (None: the run failed)."""
    data_dir = data_dir if lab.data else None  # a lab without a dataset: no --data-dir in its command
    argv = (["lab", "run", lab.id, "--variant", variant] + ([] if gpu else ["--cpu"])
            + (["--data-dir", data_dir] if data_dir else []))
    env = {"HF_HUB_OFFLINE": os.environ.get("HF_HUB_OFFLINE", "1"),
           "PLSCALE_DATA_DIR": ""}  # the data comes from the command, nowhere else
    print(f"== {lab.id} / {variant}: plscale {' '.join(argv)}", flush=True)
    output, saved = io.StringIO(), {key: os.environ.get(key) for key in env}
    os.environ.update(env)  # the ranks inherit this process's environment
    start = time.perf_counter()
    try:  # in this process, as `plscale lab run` does it (plscale.run.flow)
        request = flow.parse(argv)
        run_dir = flow.run(request.name, request.opts, request.variant, Console(file=output, width=160),
                           ["plscale", *argv], runs_dir)
        failed = None if (run_dir / "summary.json").is_file() else "no summary.json"
    except (UserError, flow.RunFailed) as exc:
        failed = str(exc)
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    wall = time.perf_counter() - start
    if failed:
        print(f"   FAILED ({failed}, {wall:.0f} s): no reference written.\n" + output.getvalue()[-6000:], flush=True)
        return None
    entry = named_generically(references.entry_from_run(run_dir, "plscale " + " ".join(argv), wall,
                                                        losses(run_dir), data_dir), data_dir)
    command = entry["command"]
    entry["run"] = run_dir.name
    system = entry["system"]
    device = (f"{entry['world_size']} x {system['gpu']} over {entry['backend']}" if system.get("gpu") else
              f"CPU only ({system.get('cpu_cores')} cores), {entry['world_size']} ranks over {entry['backend']}")
    old = references.load(lab.folder) or {}
    has_gpu = bool(old.get("gpu")) or references.section_of(system) == "gpu"
    note = NOTE.format(device=device, command=command + (DATA_NOTE if data_dir else ""), gpu="" if has_gpu else NO_GPU)
    path = references.write(lab.folder, lab.id, entry, note)
    print(f"   {wall:.0f} s, {len(entry['figures'])} figures, final loss {entry['final_loss']}, "
          f"passed {entry['passed']}: {path.relative_to(ROOT)}", flush=True)
    return path


def rederive(lab, runs_dir: Path, data_dir: str | None) -> None:
    """Rebuild a lab's entries from the run directories they name (same command and wall time).
    An entry made before commands named their data folder gets `--data-dir DIR` added where its
    run says it read its dataset from DIR (real data, DIR in the run's own data line)."""
    old = references.load(lab.folder) or {}
    other = old.get(references.OTHER_DATA) or {}
    for section in ("cpu", "gpu"):
        for entry in [*(old.get(section) or {}).values(), *(e for es in (other.get(section) or {}).values() for e in es)]:
            run_dir = runs_dir / entry.get("run", "?")
            if not (run_dir / "summary.json").is_file():
                print(f"   {lab.id} / {entry['variant']}: {run_dir} is gone: kept as it was", flush=True)
                continue
            command, used = entry["command"], entry.get("data_dir")
            summary = json.loads((run_dir / "summary.json").read_text())
            if (used is None and data_dir and lab.data and summary.get("real_data")
                    and data_dir in str(summary.get("data"))):
                used = data_dir
            if used and "--data-dir" not in command:
                command += f" --data-dir {used}"
            new = references.entry_from_run(run_dir, command, entry["wall_s"], losses(run_dir), used)
            if used == DATA_DIR:  # the run's data line names this machine's folder: keep the entry's
                new["data"] = entry["data"]
            new = named_generically(new, used)
            new.update(run=entry["run"], measured=entry["measured"])
            note = old["note"].replace(f"({entry['command']})", f"({new['command']}{DATA_NOTE if used else ''})")
            references.write(lab.folder, lab.id, new, note)
            print(f"   {lab.id} / {entry['variant']}: rebuilt from {run_dir.name}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("labs", nargs="*", help="LAB or LAB:VARIANT (default: every lab, its default variant)")
    parser.add_argument("--gpu", action="store_true", help="run on GPUs (no --cpu): writes the 'gpu' section")
    parser.add_argument("--runs-dir", default=str(ROOT / "runs" / "references"))
    parser.add_argument("--data-dir", default=os.environ.get("PLSCALE_DATA_DIR"))
    parser.add_argument("--rederive", action="store_true", help="run nothing: rebuild entries from their runs")
    args = parser.parse_args()
    wanted = args.labs or [lab.id for lab in labs.all_labs()]
    jobs = []
    for name in wanted:  # every name resolved before anything runs
        lab_name, _, variant = name.partition(":")
        try:
            lab, chosen = labs.find(lab_name)
            jobs.append((lab, lab.variant(variant).name if variant else chosen.name))
        except UserError as exc:
            sys.exit(f"error: {exc}")
    runs_dir = Path(args.runs_dir)
    if args.rederive:
        for lab in {lab.id: lab for lab, _ in jobs}.values():
            rederive(lab, runs_dir, args.data_dir)
        return
    runs_dir.mkdir(parents=True, exist_ok=True)
    failed = [f"{lab.id}:{variant}" for lab, variant in jobs
              if measure(lab, variant, args.gpu, runs_dir, args.data_dir) is None]
    if failed:
        sys.exit(f"no reference for {', '.join(failed)}: see the output above.")
    print("The course decks quote these numbers: rebuild them with `plscale slides build` and commit "
          "slides/*/deck.html (tests/test_slides.py fails on a stale deck).")


if __name__ == "__main__":
    main()
