"""Runs side by side, and each against its lab's reference results.

Reads only the files in each run directory (settings.json, system.json, summary.json,
metrics.jsonl), so it works the same on runs fetched from a pod. What it finds:
- the settings that differ (dotted keys of settings.json, plus world size, backend,
  hardware from system.json and the data source from summary.json);
- each figure beside the reference's (labs/NN_slug/reference.json, see
  plscale/run/references.py): ok, outside its tolerance, or "hardware" (a figure the machine
  sets, on another system); for a run outside, the likely causes, every one that applies in
  this order: a different data source, settings that differ from the reference's, a
  different system (hardware, backend, versions); else unexplained. A run on another rank
  count than the reference's has no reference (plscale/run/references.py);
- its loss curves: metrics.jsonl rows with `step` and `loss`, one curve per combination of
  the row's text fields (`run`, `strategy`, `phase`, ...) where a lab logs several.
"""

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from plscale.errors import UserError, did_you_mean
from plscale.files import read_json_object
from plscale.lab.rundir import runs_root
from plscale.lab.settings import flatten
from plscale.run import references

NODE_COPY = re.compile(r"node-(\d+)")
SHOWN_DIFFERENCES = 4  # settings named in a cause before "and N more"
SHOWN_RUNS = 3         # runs named when a folder of runs is given instead of a run
DAMAGED = "fetch it again or re-run the lab."


class Missing:
    """A setting one run has and another lacks (runs of different labs): shown as '-'."""

    def __str__(self) -> str:
        return "-"

    __repr__ = __str__


MISSING = Missing()


@dataclass
class Run:
    path: Path
    label: str
    settings: dict              # settings.json: lab, variant, settings, ds_config
    system: dict                # system.json ({} when absent)
    summary: dict | None        # summary.json (None: the run did not finish)

    @property
    def lab(self) -> str:
        return self.settings.get("lab", "?")

    @property
    def variant(self) -> str:
        return self.settings.get("variant", "?")


def resolve(path: Path) -> Path:
    """A run as given, else a bare run name under the runs directory (PLSCALE_RUNS_DIR, else runs/)."""
    path = Path(path)
    if not path.exists() and not path.is_absolute() and (runs_root() / path).is_dir():
        return runs_root() / path
    return path


def runs_inside(folder: Path) -> list[Path]:
    """The run directories directly inside a folder, oldest first (their names start with the time)."""
    return sorted(p for p in folder.iterdir() if (p / "settings.json").is_file()) if folder.is_dir() else []


def load_run(path: Path, label: str = "", need_summary: bool = True) -> Run:
    """A run directory's files; one line naming what is missing when it is not a finished run."""
    path = resolve(path)
    if not path.is_dir():
        if path.exists():
            raise UserError(f"{path} is not a run directory: it is a file. Give the folder that holds it.")
        root = runs_root()
        close = did_you_mean(path.name, [p.name for p in runs_inside(root)])
        raise UserError(f"{path} is not a run directory: it does not exist. Runs are the folders under "
                        f"{root}/ (ls {root}).{close}")
    if not (path / "settings.json").is_file():
        inside = runs_inside(path)
        hint = (f" It holds {_runs(len(inside))} (the newest: {inside[-1]}): give one of them." if inside
                else f" Give a folder `plscale lab run` made, under {runs_root()}/.")
        raise UserError(f"{path} is not a run directory: it has no settings.json, which every run writes first.{hint}")
    summary_path = path / "summary.json"
    if need_summary and not summary_path.is_file():
        node = NODE_COPY.fullmatch(path.parent.name)
        if node:
            raise UserError(f"{path} is node {node.group(1)}'s copy of a run, without the summary: node 0's run "
                            f"directory holds it ({path.parent.parent / path.name} once fetched: plscale runpod fetch).")
        diagnosis = path / "diagnosis.txt"  # written by `plscale lab run` when the ranks failed
        why = f" It failed: {diagnosis.read_text().splitlines()[0]} (all of it in {diagnosis})." \
            if diagnosis.is_file() and diagnosis.read_text().strip() else ""
        raise UserError(f"{path} has no summary.json: the run did not finish (or is still running). "
                        f"See {path / 'rank_0.log'}.{why}")
    settings = read_json_object(path / "settings.json", DAMAGED)
    system = read_json_object(path / "system.json", DAMAGED) if (path / "system.json").is_file() else {}
    summary = read_json_object(summary_path, DAMAGED) if summary_path.is_file() else None
    return Run(path, label, settings, system, summary)


def _runs(n: int) -> str:
    return f"{n} run" if n == 1 else f"{n} runs"


def load_runs(paths: list[Path], force: bool = False) -> list[Run]:
    """Runs labelled A, B, C...; runs of different labs only with force."""
    if len(paths) == 1 and not (resolve(paths[0]) / "settings.json").is_file() and runs_inside(resolve(paths[0])):
        inside = runs_inside(resolve(paths[0]))[-SHOWN_RUNS:]
        raise UserError(f"--compare needs 2 or more runs: {resolve(paths[0])} is a folder of runs, give the runs "
                        f"inside it, e.g. plscale report --compare {' '.join(str(p) for p in inside)}")
    if len(paths) < 2:
        root = runs_root()
        raise UserError(f"--compare needs 2 or more runs, got {len(paths)}: e.g. plscale report --compare "
                        f"{root}/RUN_A {root}/RUN_B.")
    runs = [load_run(p, _label(i)) for i, p in enumerate(paths)]
    lab_names = sorted({r.lab for r in runs})
    if len(lab_names) > 1 and not force:
        raise UserError(f"These runs are of different labs ({', '.join(lab_names)}): their figures do not "
                        f"line up. Compare runs of one lab, or add --force.")
    return runs


def _label(i: int) -> str:
    return chr(ord("A") + i) if i < 26 else f"R{i + 1}"


def hardware(system: dict) -> str:
    """A run's machine in words, from system.json."""
    if not system:
        return "unknown (no system.json)"
    device = (f"{system['gpu']} ({system.get('gpu_memory_gib', '?')} GiB)" if system.get("gpu")
              else f"CPU ({system.get('cpu_cores', '?')} cores)")
    return f"{device} on {system.get('host', '?')}"


def world_size(run: Run):
    return (run.summary or {}).get("world_size", run.system.get("world_size"))


def setting_values(run: Run) -> dict:
    """Everything a comparison looks at, as flat key -> value."""
    values = {"lab": run.lab, "variant": run.variant, "ds_config": run.settings.get("ds_config")}
    values.update(flatten(run.settings.get("settings") or {}))
    summary = run.summary or {}
    values.update({"world_size": world_size(run), "backend": summary.get("backend", run.system.get("backend")),
                   "hardware": hardware(run.system), "data": summary.get("data")})
    return values


def differing(runs: list[Run]) -> list[tuple[str, list]]:
    """(key, value in each run: MISSING where that run has no such setting) for every key
    whose values are not all the same."""
    values = [setting_values(r) for r in runs]
    keys = list(dict.fromkeys(k for v in values for k in v))
    rows = [(k, [v.get(k, MISSING) for v in values]) for k in keys]
    return [(k, vals) for k, vals in rows if any(json.dumps(x, default=str) != json.dumps(vals[0], default=str)
                                                 for x in vals)]


def figure_rows(runs: list[Run]) -> list[tuple[str, str, list]]:
    """(figure name, unit, the figure dict in each run or None), in the order they first appear."""
    per_run = [{f["name"]: f for f in (r.summary or {}).get("figures", [])} for r in runs]
    names = list(dict.fromkeys(n for figs in per_run for n in figs))
    return [(n, next(f[n].get("unit", "") for f in per_run if n in f), [f.get(n) for f in per_run]) for n in names]


def check_rows(runs: list[Run]) -> list[tuple[str, list]]:
    """(check name, ok in each run: True, False or None when that run has no such check)."""
    per_run = [{c["name"]: c.get("ok") for c in (r.summary or {}).get("checks", [])} for r in runs]
    names = list(dict.fromkeys(n for checks in per_run for n in checks))
    return [(n, [c.get(n) for c in per_run]) for n in names]


@dataclass
class Judgement:
    """A run against its reference: a flag per figure (ok / outside / hardware) and the likely cause."""
    entry: dict | None
    note: str = ""
    flags: dict = field(default_factory=dict)   # figure name -> (flag, reference figure)
    causes: list = field(default_factory=list)  # why figures are outside, when any are
    system: str = ""                            # how the system differs, when it does

    @property
    def outside(self) -> list[str]:
        return [name for name, (flag, _) in self.flags.items() if flag == "outside"]

    @property
    def cause(self) -> str:
        return "; also ".join(self.causes)


def judge(run: Run) -> Judgement:
    """Each of the run's figures against the reference entry for its lab, variant and device."""
    try:
        from plscale.lab.labs import find
        lab, _ = find(run.lab)
    except UserError:
        return Judgement(None, f"lab {run.lab!r} is not among this checkout's labs: no reference")
    entry, note = references.entry_for(references.load(lab.folder), run.variant, run.system, world_size(run),
                                       run.summary)
    if entry is None:
        return Judgement(None, note)
    system = system_differences(run, entry)
    ref = {f["name"]: f for f in entry.get("figures", [])}
    flags = {}
    for fig in (run.summary or {}).get("figures", []):
        if fig["name"] in ref:
            r = ref[fig["name"]]
            ok = references.within(fig.get("value"), r)
            flags[fig["name"]] = ("ok" if ok else "hardware" if r.get("hardware") and system else "outside", r)
    judgement = Judgement(entry, note, flags, system="; ".join(system))
    if judgement.outside:
        judgement.causes = likely_causes(run, entry, system)
    return judgement


def likely_causes(run: Run, entry: dict, system: list[str]) -> list[str]:
    """Every cause that applies, in this order: data source, settings, system; else unexplained."""
    summary = run.summary or {}
    causes = []
    if not references.same_data(summary, entry):
        causes.append(f"different data source: this run used {summary.get('data')!r}, "
                      f"the reference {entry.get('data')!r}")
    mine, theirs = flatten(run.settings.get("settings") or {}), flatten(entry.get("settings") or {})
    changed = [f"{k} {mine.get(k, '(unset)')} (reference {theirs.get(k, '(unset)')})"
               for k in dict.fromkeys([*mine, *theirs]) if mine.get(k) != theirs.get(k)]
    if changed:
        more = f" and {len(changed) - SHOWN_DIFFERENCES} more" if len(changed) > SHOWN_DIFFERENCES else ""
        causes.append(f"settings differ from the reference's: {', '.join(changed[:SHOWN_DIFFERENCES])}{more}")
    if system:
        causes.append(f"a different system: {'; '.join(system)}")
    return causes or [f"unexplained: look at {run.path / 'rank_0.log'}"]


def system_differences(run: Run, entry: dict) -> list[str]:
    """What differs from the reference's machine: world size, backend, hardware, versions."""
    summary = run.summary or {}
    out = []
    for name, mine, theirs in (("world size", world_size(run), entry.get("world_size")),
                               ("backend", summary.get("backend", run.system.get("backend")), entry.get("backend"))):
        if mine != theirs:
            out.append(f"{name} {mine} (reference {theirs})")
    ref_system = entry.get("system") or {}
    for key in references.SYSTEM_KEYS:
        if run.system.get(key) != ref_system.get(key):
            out.append(f"{key} {run.system.get(key, 'none')} (reference {ref_system.get(key, 'none')})")
    return out


def curves(run: Run) -> dict[str, tuple[list, list]]:
    """Loss curves from metrics.jsonl: series name ('' when the run logs one) -> (steps, losses)."""
    path = run.path / "metrics.jsonl"
    out: dict[str, tuple[list, list]] = {}
    for line in path.read_text().splitlines() if path.is_file() else []:
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line cut short by a killed run
        step, loss = row.get("step"), row.get("loss")
        if not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in (step, loss)):
            continue
        series = " ".join(str(v) for k, v in row.items() if isinstance(v, str))
        xs, ys = out.setdefault(series, ([], []))
        xs.append(step)
        ys.append(loss)
    return out
