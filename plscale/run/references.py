"""Reference results: labs/NN_slug/reference.json, what a lab's run measured for real.

    {"lab": "zero", "note": "...", "cpu": {"zero2": ENTRY}}        ("gpu": only where measured)
    ENTRY = {variant, command, data_dir, measured, wall_s, system, world_size, backend, settings,
             data, real_data, passed, final_loss, figures: [{name, value, unit, tolerance, hardware}]}
    "other_data": {"cpu": {"zero2": [ENTRY, ...]}}   the same variant measured on other data

An entry holds for its variant at its rank count only: a run on another number of ranks has no
reference (per-rank figures change with it; that is a setting, not a fault). And for its data:
a run on other text trains other losses, and another tokenizer makes another vocabulary, so
other memory. "cpu" holds the entry the decks and READMEs quote (the real dataset); the same
variant measured on another source (the built-in offline text a fresh machine falls back to)
is kept under "other_data", and a run is judged against the entry of its own data source when
there is one (`same_data`: the data line without its folders, and whether it is the real
dataset).

A figure is within its reference when |value - reference| <= max(relative x |reference|,
absolute). Tolerances (written into each figure, so a file can be edited by hand):
- RELATIVE (5%) for what the maths fixes: bytes of memory, counts, accuracy, losses;
- HARDWARE_RELATIVE (30%) for what the machine sets: times, rates, bandwidths, MFU, the
  measured bubble, RSS, the checkpoint interval Young's formula takes from a measured stall.
  On one shared 2-core machine these move by tens of percent run to run; on another
  system they are compared but flagged "hardware", never "wrong";
- float drift: a gap between two computations the maths makes equal (a name with "gap", "vs"
  or "divergence", or the unit "max abs"; predicted 0 or nothing; not bytes or counts) is
  float rounding, which another BLAS, thread count or library version moves by orders of
  magnitude: 5% of lab 10's 6.1e-5 (3e-6) would read another machine as "outside". Such a
  figure gets the absolute bound
  max(DRIFT_FACTOR (10) x its value, NOISE): any gap from 0 to 11x the reference's is within;
  the lab's own check still fails a gap above its threshold;
- NOISE (absolute 1e-4) where the prediction is 0 and the measured value is rounding
  (1e-8 here, 1e-6 elsewhere: the same result), so rounding is not read as a difference.
Written by benchmarks/make_references.py from a real run directory.
"""

import re
import time
from pathlib import Path

from plscale.files import read_json_object, write_json

REFERENCE_FILE = "reference.json"
RELATIVE = 0.05
HARDWARE_RELATIVE = 0.30
NOISE = 1e-4
DRIFT_FACTOR = 10
GAP_WORDS = re.compile(r"\b(gap|vs|divergence)\b", re.IGNORECASE)
COUNT_UNITS = {"B", "bytes", "KiB", "MiB", "GiB", "TiB", "KB", "MB", "GB", "calls", "count", "steps", "%"}
TIME_UNITS = {"s", "ms", "us", "µs", "ns", "min", "h"}
HARDWARE_WORDS = re.compile(r"\b(time|throughput|bandwidth|busbw|algbw|mfu|hfu|bubble|latency|speed|speedup|stall|rss|young|"
                            r"tokens/s|samples/s|backward / forward)\b", re.IGNORECASE)
TOLERANCE_RULE = (f"within when |value - reference| <= max(relative x |reference|, absolute): relative {RELATIVE:g} "
                  f"for what the maths fixes, {HARDWARE_RELATIVE:g} for hardware figures (times, rates, MFU, RSS; "
                  f"flagged 'hardware', not 'outside', on another system); float-drift gaps (gap / vs / "
                  f"divergence / max abs, predicted 0) absolute max({DRIFT_FACTOR} x the reference's value, "
                  f"{NOISE:g}); absolute {NOISE:g} where the prediction is 0 and the value is float rounding; "
                  f"an entry holds at its own rank count only")
SYSTEM_KEYS = ("host", "cpu_cores", "gpu", "gpu_memory_gib", "torch", "deepspeed")
PATH = re.compile(r"[~/][^\s;,)]*")
OTHER_DATA = "other_data"


def data_kind(text) -> str:
    """A data source without its folders: the same files in another folder are the same data."""
    return PATH.sub("<folder>", str(text))


def same_data(summary: dict, entry: dict) -> bool:
    """Did a run (its summary) read the data a reference entry was measured on?"""
    return data_kind(summary.get("data")) == data_kind(entry.get("data")) and \
        summary.get("real_data") == entry.get("real_data")


def depends_on_hardware(figure: dict) -> bool:
    """Times, rates (a unit per second), MFU, RSS: what the machine sets, not the maths."""
    unit = str(figure.get("unit") or "")
    rss = re.search(r"\bRSS\b", str(figure.get("note") or ""))
    return unit in TIME_UNITS or unit.endswith("/s") or bool(HARDWARE_WORDS.search(figure.get("name", ""))) or bool(rss)


def float_drift(figure: dict) -> bool:
    """A gap the maths makes 0, so what is measured is float rounding (module docstring)."""
    unit = str(figure.get("unit") or "")
    gap = unit == "max abs" or bool(GAP_WORDS.search(figure.get("name", "")))
    predicted = figure.get("predicted")
    return (gap and unit not in COUNT_UNITS and _number(figure.get("value"))
            and (predicted is None or (_number(predicted) and predicted == 0)))


def tolerance(figure: dict) -> dict:
    """The tolerance a freshly measured figure gets (rules in the module docstring)."""
    if depends_on_hardware(figure):
        return {"relative": HARDWARE_RELATIVE}
    value = figure.get("value")
    if float_drift(figure):
        return {"relative": RELATIVE, "absolute": float(f"{max(DRIFT_FACTOR * abs(value), NOISE):.3g}")}
    if figure.get("predicted") == 0 and isinstance(value, (int, float)) and abs(value) < NOISE:
        return {"relative": RELATIVE, "absolute": NOISE}
    return {"relative": RELATIVE}


def within(value, reference: dict) -> bool:
    """Is a measured value within a reference figure's tolerance? Non-numbers: equal or not."""
    ref = reference.get("value")
    if not _number(value) or not _number(ref):
        return value == ref
    tol = reference.get("tolerance") or {}
    allowed = max(tol.get("relative", RELATIVE) * abs(ref), tol.get("absolute", 0.0))
    return abs(value - ref) <= allowed


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def final_loss(summary: dict, losses: list[float]) -> float | None:
    """The run's 'final loss' figure, else the last loss it logged, else None."""
    for fig in summary.get("figures", []):
        if fig["name"].lower().endswith("final loss") and _number(fig.get("value")):
            return fig["value"]
    return losses[-1] if losses else None


def entry_from_run(run_dir: Path, command: str, wall_s: float, losses: list[float],
                   data_dir: str | None = None) -> dict:
    """A reference entry from a finished run directory (its own files, nothing else);
    data_dir: the --data-dir the run was given (None: none, the run found its data itself)."""
    run_dir = Path(run_dir)
    fix = "the run directory is damaged: run the lab again"
    settings = read_json_object(run_dir / "settings.json", fix)
    summary = read_json_object(run_dir / "summary.json", fix)
    system = read_json_object(run_dir / "system.json", fix) if (run_dir / "system.json").is_file() else {}
    figures = [{"name": f["name"], "value": f.get("value"), "unit": f.get("unit", ""),
                "predicted": f.get("predicted"), "tolerance": tolerance(f), "hardware": depends_on_hardware(f)}
               for f in summary.get("figures", [])]
    return {
        "variant": summary.get("variant", settings.get("variant")), "command": command, "data_dir": data_dir,
        "measured": time.strftime("%Y-%m-%d", time.localtime((run_dir / "summary.json").stat().st_mtime)),
        "wall_s": round(wall_s, 1), "system": system,
        "world_size": summary.get("world_size", system.get("world_size")),
        "backend": summary.get("backend", system.get("backend")), "settings": settings.get("settings", {}),
        "data": summary.get("data"), "real_data": summary.get("real_data"), "passed": summary.get("passed"),
        "final_loss": final_loss(summary, losses), "figures": figures,
    }


def section_of(system: dict) -> str:
    """'gpu' for a run on GPUs (system.json names one), else 'cpu'."""
    return "gpu" if system.get("gpu") else "cpu"


def write(lab_folder: Path, lab_id: str, entry: dict, note: str) -> Path:
    """Add (or replace) one variant's entry in the lab's reference.json; the rest is kept. An entry
    on the data of the variant's entry in "cpu"/"gpu" (or the first) takes its place there, and
    `note` becomes the file's; one on other data replaces the entry of its own data under
    "other_data", or joins them, except that an entry on the real dataset takes the main place
    from one on a stand-in, which moves beside it."""
    path = Path(lab_folder) / REFERENCE_FILE
    data = load(lab_folder) or {}
    data.update({"lab": lab_id, "tolerance_rule": TOLERANCE_RULE})
    section, variant = section_of(entry["system"]), entry["variant"]
    primary = data.setdefault(section, {})
    main = primary.get(variant)
    if main is None or same_data(entry, main):
        primary[variant], data["note"] = entry, note   # the note speaks of the main entries' runs
    else:
        data.setdefault("note", note)
        if entry.get("real_data") and not main.get("real_data"):   # the real dataset's entry is the main one
            primary[variant], data["note"], entry = entry, note, main
        others = data.setdefault(OTHER_DATA, {}).setdefault(section, {}).setdefault(variant, [])
        others[:] = [e for e in others if not same_data(entry, e)] + [entry]
    data = {k: data[k] for k in ("lab", "note", "tolerance_rule", "cpu", "gpu", OTHER_DATA) if k in data}
    write_json(path, data)
    return path


def load(lab_folder: Path) -> dict | None:
    path = Path(lab_folder) / REFERENCE_FILE
    fix = f"restore it (git checkout {path}) or rebuild it with benchmarks/make_references.py --rederive"
    return read_json_object(path, fix) if path.is_file() else None


def entry_for(reference: dict | None, variant: str, system: dict, world_size: int | None = None,
              summary: dict | None = None) -> tuple[dict | None, str]:
    """The entry a run is judged against, and a note: the run's own section (cpu/gpu) when
    measured, else the other one (a GPU run against the CPU reference, saying so); only an
    entry at the run's rank count (world_size None: unknown, any); of the run's own data (its
    summary's) where one was measured on it, else the main one, saying so."""
    if not reference:
        return None, "no reference.json for this lab"
    if (summary or {}).get("hf"):
        return None, f"a run of your own model ({summary['hf']}): the reference was measured on the lab's preset"
    wanted = section_of(system)
    found = [(section, entry) for section in (wanted, "cpu" if wanted == "gpu" else "gpu")
             for entry in [(reference.get(section) or {}).get(variant),
                           *((reference.get(OTHER_DATA) or {}).get(section) or {}).get(variant, [])] if entry]
    sized = [(s, e) for s, e in found if world_size is None or e.get("world_size") in (None, world_size)]
    if sized:
        mine = [(s, e) for s, e in sized if summary is None or same_data(summary, e)]
        section, entry = (mine or sized)[0]
        notes = [] if section == wanted else [f"no {wanted.upper()} reference: compared with the {section.upper()} one"]
        if not mine:
            notes.append(f"no reference measured on this run's data ({summary.get('data')}): compared with the one "
                         f"measured on {entry.get('data')}")
        return entry, "; ".join(notes)
    if found:
        sizes = " and ".join(str(n) for n in sorted({e.get("world_size") for _, e in found}))
        return None, (f"no reference at {world_size} ranks (reference.json has {variant} at {sizes} ranks; "
                      f"per-rank figures change with the rank count, so none are compared)")
    known = sorted({v for s in ("cpu", "gpu") for v in reference.get(s) or {}})
    return None, f"no reference for variant {variant!r} (reference.json has: {', '.join(known) or 'none'})"
