"""`plscale report` against reference results, and `plscale report --compare`: two real lab 01
runs on 2 CPU ranks that differ in one setting, copies of a run moved outside its reference,
bad input and damaged runs (hand-written run directories), the tolerance rules, and every
lab's reference.json."""

import json
import os
import re
import shutil
import subprocess
import sys
import time

import pytest

from conftest import ROOT, run_cli
from plscale.lab import labs
from plscale.run import compare, references

pytestmark = pytest.mark.e2e
RUN_ARGS = ["lab", "run", "mnist-dp", "--cpu", "--gpus", "2", "--launcher", "torchrun", "--steps", "3"]


class Runs:
    """Both runs start together when the module does (the bad-input tests need no run: they go
    on meanwhile); `wait()` gives their directories."""

    def __init__(self, root):
        self.root, self.dirs = root, None
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "PLSCALE_DATA_DIR": "", "COLUMNS": "200"}
        self.procs = [subprocess.Popen([sys.executable, "-m", "plscale.cli.main", *RUN_ARGS, *extra], cwd=ROOT,
                                       env={**env, "PLSCALE_RUNS_DIR": str(root / name)}, stdout=subprocess.PIPE,
                                       stderr=subprocess.STDOUT, text=True)
                      for name, extra in (("a", []), ("b", ["--set", "ds.lr=0.002"]))]

    def wait(self):
        if self.dirs is None:
            outputs = [p.communicate(timeout=300)[0] for p in self.procs]
            for proc, out in zip(self.procs, outputs):
                assert proc.returncode == 0, out[-3000:]
            self.dirs = [next((self.root / name).iterdir()) for name in ("a", "b")]
        return self.dirs


@pytest.fixture(scope="module", autouse=True)
def runs(tmp_path_factory):
    started = Runs(tmp_path_factory.mktemp("compare_runs"))
    yield started
    for proc in started.procs:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def fake_run(folder, lab="mnist-pseudo-dp", variant="default", summary=True, figures=(), settings=None):
    """A run directory written by hand: only the files the report reads."""
    folder.mkdir(parents=True)
    (folder / "settings.json").write_text(json.dumps({"lab": lab, "variant": variant,
                                                      "settings": settings or {"seed": 0}}))
    if summary:
        (folder / "summary.json").write_text(json.dumps({"lab": lab, "variant": variant, "figures": list(figures),
                                                         "checks": [], "passed": True}))
    return folder


def test_bad_input_is_one_line_exit_2(tmp_path, quick_cli):
    """In this process (quick_cli), with PLSCALE_RUNS_DIR = tmp_path/runs."""
    a = fake_run(tmp_path / "runs" / "a")
    b = fake_run(tmp_path / "runs" / "b", lab="zero", variant="zero2", settings={"seed": 0, "zero": {"stage": 2}})
    unfinished = fake_run(tmp_path / "runs" / "c", summary=False)
    node_copy = fake_run(tmp_path / "fetched" / "node-1" / "c", summary=False)
    cut = fake_run(tmp_path / "damaged" / "cut")
    (cut / "summary.json").write_text((cut / "summary.json").read_text()[:20])  # an interrupted fetch
    listed = fake_run(tmp_path / "damaged" / "listed")
    (listed / "settings.json").write_text("[1, 2]")
    fake_run(tmp_path / "one" / "r")
    (tmp_path / "empty").mkdir()
    runs_dir = tmp_path / "runs"
    cases = [
        (["report", tmp_path / "nope"], f"it does not exist. Runs are the folders under {runs_dir}/"),
        (["report", "a-typo"], f"it does not exist. Runs are the folders under {runs_dir}/"),
        (["report", tmp_path / "empty"], "has no settings.json"),
        (["report", tmp_path / "runs"], "It holds 3 runs"),
        (["report", tmp_path / "one"], "It holds 1 run (the newest"),
        (["report", cut], f"{cut / 'summary.json'} is not valid JSON (cut short?): fetch it again or re-run"),
        (["report", "--compare", a, cut], "is not valid JSON (cut short?)"),
        (["report", listed], f"{listed / 'settings.json'} holds a JSON list, not an object"),
        (["report", "--compare", runs_dir], (f"{runs_dir} is a folder of runs, give the runs inside it, e.g. "
                                             f"plscale report --compare {runs_dir / 'a'} {runs_dir / 'b'}")),
        (["report", a, "--force"], "--force only applies to --compare"),
        (["report", unfinished], "has no summary.json: the run did not finish"),
        (["report", "--compare", a, unfinished], "has no summary.json"),
        (["report", "--compare", a, node_copy], "node 1's copy of a run"),
        (["report", "--compare", a, b], "different labs (mnist-pseudo-dp, zero)"),
        (["report", "--compare", a], "--compare needs 2 or more runs, got 1"),
        (["report", a, a], "2 runs given: add --compare"),
        (["report", "--compare", a, a, "--plot", tmp_path / "x.jpg"], "does not end in .png"),
    ]
    for args, message in cases:
        done = quick_cli(*args, cwd=tmp_path)
        assert done.returncode == 2 and message in " ".join(done.stderr.split()), (args, done.stderr)
        assert "Traceback" not in done.stderr, done.stderr
    assert not (tmp_path / "compare.png").exists()  # nothing written on bad input
    by_name = quick_cli("report", "a", cwd=tmp_path)  # a bare run name: looked up under the runs directory
    assert by_name.returncode == 0 and f"run directory: {runs_dir / 'a'}" in by_name.stdout, by_name.stderr
    forced = quick_cli("report", "--compare", a, b, a, "--force", cwd=tmp_path)
    assert forced.returncode == 0 and "zero2" in forced.stdout, forced.stderr
    rows = {line.split("│")[1].strip(): line.split("│")[2:5] for line in forced.stdout.splitlines()
            if line.count("│") >= 4}
    assert [c.strip() for c in rows["zero.stage"]] == ["-", "2", "-"]  # a setting lab 01 lacks: '-', not blank
    assert "note: A and C are the same run directory" in forced.stdout
    assert f"no loss curve in {a} (no metrics.jsonl)" in forced.stdout


def test_compare_two_real_runs(runs, tmp_path):
    a, b = runs.wait()
    picture = tmp_path / "both.png"
    done = run_cli("report", "--compare", a, b, "--plot", picture)
    assert done.returncode == 0, done.stderr
    rows = {line.split("│")[1].strip(): line for line in done.stdout.splitlines() if line.count("│") >= 3}
    assert "0.001" in rows["ds.lr"] and "0.002" in rows["ds.lr"]
    assert "train.steps" not in rows and "world_size" not in rows  # the same in both: not listed
    assert "replicas identical" in rows and rows["replicas identical"].count("passed") == 2
    final = rows["final loss"].split("│")
    assert final[3].strip() != final[4].strip()  # the learning rate moved the loss
    # offline runs, judged against the reference measured on the same offline data (other_data)
    offline = reference("mnist-pseudo-dp")[references.OTHER_DATA]["cpu"]["default"][0]
    assert float(final[5]) == pytest.approx(offline["final_loss"], rel=1e-3)
    assert f"loss curves: {picture}" in done.stdout
    assert picture.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and picture.stat().st_size > 10_000
    # 3 steps against the reference's 400: outside, and the settings named as the cause, not the data
    said = " ".join(done.stdout.split())
    assert "outside" in said and "likely cause: settings differ from the reference's: train.steps 3 (reference 400)" in said
    assert "different data source" not in said and "reference data: OFFLINE FALLBACK" in said
    one = run_cli("report", a)
    assert one.returncode == 0 and "reference" in one.stdout and "vs ref" in one.stdout, one.stderr


def twin_of_reference(run, folder):
    """A copy of a real run made to look like the lab's reference run: same settings, data,
    system and figures. Each test then moves one thing."""
    entry = reference("mnist-pseudo-dp")["cpu"]["default"]
    shutil.copytree(run, folder)
    settings = json.loads((folder / "settings.json").read_text())
    (folder / "settings.json").write_text(json.dumps({**settings, "settings": entry["settings"]}))
    (folder / "system.json").write_text(json.dumps(entry["system"]))
    summary = json.loads((folder / "summary.json").read_text())
    summary.update(data=entry["data"], real_data=entry["real_data"], world_size=entry["world_size"],
                   backend=entry["backend"], figures=[{k: f[k] for k in ("name", "value", "unit", "predicted")}
                                                      for f in entry["figures"]])
    (folder / "summary.json").write_text(json.dumps(summary))
    return folder, entry


def edit(folder, name, change):
    data = json.loads((folder / name).read_text())
    change(data)
    (folder / name).write_text(json.dumps(data))


def scale_figure(summary, name, factor):
    fig = next(f for f in summary["figures"] if f["name"] == name)
    fig["value"] *= factor


def test_reference_flags_and_causes(runs, tmp_path):
    a, _ = runs.wait()
    twin, entry = twin_of_reference(a, tmp_path / "twin")
    judged = compare.judge(compare.load_run(twin))
    assert judged.flags and {flag for flag, _ in judged.flags.values()} == {"ok"} and not judged.cause

    edit(twin, "summary.json", lambda s: scale_figure(s, "test accuracy (DeepSpeed)", 1.02))  # 2% off: within 5%
    assert compare.judge(compare.load_run(twin)).flags["test accuracy (DeepSpeed)"][0] == "ok"
    edit(twin, "summary.json", lambda s: scale_figure(s, "test accuracy (DeepSpeed)", 0.5))
    judged = compare.judge(compare.load_run(twin))
    assert judged.outside == ["test accuracy (DeepSpeed)"] and judged.cause.startswith("unexplained: look at")
    shown = run_cli("report", twin)
    assert shown.returncode == 0 and "outside: test accuracy (DeepSpeed); likely cause: unexplained" in shown.stdout

    edit(twin, "settings.json", lambda s: s["settings"]["train"].update(steps=40))
    assert "train.steps 40 (reference 400)" in compare.judge(compare.load_run(twin)).cause
    edit(twin, "summary.json", lambda s: s.update(data="OFFLINE FALLBACK: synthetic digits", real_data=False))
    edit(twin, "system.json", lambda s: s.update(host="laptop"))
    causes = compare.judge(compare.load_run(twin)).causes  # every cause that applies, in a fixed order
    assert [c.split(":")[0] for c in causes] == ["different data source", "settings differ from the reference's",
                                                 "a different system"], causes
    assert "train.steps 40 (reference 400)" in causes[1] and "host laptop (reference vm)" in causes[2]

    edit(twin, "summary.json", lambda s: s.update(world_size=4))  # another rank count: no reference, no flags
    judged = compare.judge(compare.load_run(twin))
    assert judged.entry is None and not judged.flags and not judged.outside
    assert judged.note.startswith("no reference at 4 ranks (reference.json has default at 2 ranks")
    shown = run_cli("report", twin)
    assert shown.returncode == 0 and "reference: none (no reference at 4 ranks" in shown.stdout, shown.stderr

    hardware = next(f["name"] for f in entry["figures"] if f["hardware"])
    other = tmp_path / "other_machine"
    twin_of_reference(a, other)
    edit(other, "summary.json", lambda s: scale_figure(s, hardware, 3.0))
    assert compare.judge(compare.load_run(other)).flags[hardware][0] == "outside"  # same machine: outside
    edit(other, "system.json", lambda s: s.update(host="laptop", cpu_cores=8))
    judged = compare.judge(compare.load_run(other))
    assert judged.flags[hardware][0] == "hardware" and not judged.outside and "cpu_cores 8 (reference 2)" in judged.system


def reference(lab_id):
    lab, _ = labs.find(lab_id)
    return references.load(lab.folder)


def normal(name):
    return re.sub(r"\d+", "N", name)  # "loss, 400 steps" and "loss, 3 steps" are one figure


@pytest.mark.parametrize("lab", labs.all_labs(), ids=lambda lab: lab.id)
def test_every_lab_has_a_reference(lab):
    data = references.load(lab.folder)
    assert data is not None, f"{lab.folder}/reference.json is missing: benchmarks/make_references.py {lab.id}"
    assert data["lab"] == lab.id and "note" in data and set(data) <= {"lab", "note", "tolerance_rule", "cpu", "gpu",
                                                                      references.OTHER_DATA}
    default = lab.variant(None).name
    assert default in data["cpu"], f"no CPU reference for {lab.id}'s default variant {default}"
    assert all(entry["system"].get("gpu") for entry in (data.get("gpu") or {}).values())  # measured, not invented
    other = (data.get(references.OTHER_DATA) or {}).get("cpu") or {}
    if lab.data:   # the default command on a fresh machine without the dataset has its own reference
        assert any(not e["real_data"] for e in other.get(default, [])), f"benchmarks/make_references.py --data-dir '' {lab.id}"
    for entry in [*data["cpu"].values(), *(e for es in other.values() for e in es)]:
        assert not entry["system"].get("gpu") and entry["passed"] is True
        names = [f["name"] for f in entry["figures"]]
        assert names and len(set(names)) == len(names)
        for fig in entry["figures"]:
            assert {"value", "unit", "tolerance", "hardware"} <= set(fig) and fig["tolerance"]["relative"] > 0
            if not fig["hardware"]:  # written by today's rules (hardware ones also read the run's note)
                assert fig["tolerance"] == references.tolerance(fig), (fig["name"], fig["tolerance"])
        if entry["real_data"]:  # the command reproduces the data: it names the folder it read
            assert f"--data-dir {entry['data_dir']}" in entry["command"] and entry["data_dir"] in entry["data"]
        own = ROOT / "runs" / "references" / entry["run"] / "summary.json"
        if own.is_file():  # the reference's own run, where this checkout made it
            assert names == [f["name"] for f in json.loads(own.read_text())["figures"]]


def test_the_reference_names_the_figures_a_run_produces(runs):
    a, _ = runs.wait()
    produced = {normal(f["name"]) for f in json.loads((a / "summary.json").read_text())["figures"]}
    listed = {normal(f["name"]) for f in reference("mnist-pseudo-dp")["cpu"]["default"]["figures"]}
    assert produced == listed


def test_float_drift_gaps_get_an_absolute_bound():
    """A gap the maths makes 0 is float rounding: 10x its value absolute, not 5% of it."""
    jax_gap = {"name": "largest gap to PyTorch's curve", "value": 6.1e-5, "unit": "", "predicted": None}
    tol = references.tolerance(jax_gap)
    assert tol == {"relative": references.RELATIVE, "absolute": 6.1e-4}
    ref = {**jax_gap, "tolerance": tol}
    assert references.within(3e-4, ref) and references.within(0.0, ref)  # another BLAS: still ok
    assert not references.within(1e-3, ref)  # 16x the reference's gap: outside
    loss_gap = {"name": "full-batch vs pseudo-DP loss, 400 steps", "value": 0.0098, "unit": "max abs", "predicted": 0.0}
    assert references.tolerance(loss_gap)["absolute"] == pytest.approx(0.098)
    tiny = {"name": "replica divergence", "value": 0.0, "unit": "max abs", "predicted": 0.0}
    assert references.tolerance(tiny)["absolute"] == references.NOISE
    # not float drift: an effect the lab shows on purpose, a size, a time
    wrong_way = {"name": "unequal shards, plain average", "value": 0.0083, "unit": "max abs", "predicted": "> 0"}
    size = {"name": "model states per rank vs dense / 2", "value": 40.5, "unit": "MiB", "predicted": 40.5}
    time_gap = {"name": "step time vs dp", "value": 0.2, "unit": "s", "predicted": None}
    assert references.tolerance(wrong_way) == references.tolerance(size) == {"relative": references.RELATIVE}
    assert references.tolerance(time_gap) == {"relative": references.HARDWARE_RELATIVE}


def test_entry_for_keys_by_rank_count():
    reference = {"cpu": {"default": {"world_size": 2, "figures": []}}}
    assert references.entry_for(reference, "default", {}, 2)[0] is reference["cpu"]["default"]
    assert references.entry_for(reference, "default", {}, None)[0] is reference["cpu"]["default"]
    entry, note = references.entry_for(reference, "default", {"gpu": "H100"}, 4)
    assert entry is None and note.startswith("no reference at 4 ranks (reference.json has default at 2 ranks")


def test_a_run_is_judged_against_the_entry_of_its_own_data(tmp_path):
    real = {"variant": "zero2", "world_size": 2, "system": {}, "data": "WikiText-2 from valid.txt in ~/data/wikitext-2",
            "real_data": True, "figures": [{"name": "final loss", "value": 6.1}]}
    offline = {**real, "data": "OFFLINE FALLBACK: Python 3.11's bundled reference text", "real_data": False,
               "figures": [{"name": "final loss", "value": 7.3}]}
    references.write(tmp_path, "zero", offline, "the offline runs")
    references.write(tmp_path, "zero", real, "the WikiText-2 runs")            # the real data takes the main place
    references.write(tmp_path, "zero", {**offline, "wall_s": 9}, "again")     # the same data: replaced, not added
    saved = references.load(tmp_path)
    assert saved["cpu"]["zero2"] == real and saved["note"] == "the WikiText-2 runs"    # the decks' entry and note stay
    assert saved[references.OTHER_DATA]["cpu"]["zero2"] == [{**offline, "wall_s": 9}]
    # the same files in another folder are the same data; the offline text is its own
    here = {"data": "WikiText-2 from valid.txt in /home/me/wt2", "real_data": True}
    assert references.entry_for(saved, "zero2", {}, 2, here) == (real, "")
    assert references.entry_for(saved, "zero2", {}, 2, {"data": offline["data"], "real_data": False})[0]["wall_s"] == 9
    entry, note = references.entry_for(saved, "zero2", {}, 2, {"data": "WikiText-2 from the hub", "real_data": True})
    assert entry == real and note.startswith("no reference measured on this run's data (WikiText-2 from the hub)")


def test_report_imports_neither_torch_nor_matplotlib():
    code = ("import sys; from plscale.cli import report; from plscale.run import compare; "
            "print(','.join(m for m in ('torch', 'matplotlib', 'deepspeed') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == ""


def test_curves_group_series_and_skip_cut_lines(tmp_path):
    run = fake_run(tmp_path / "r")
    rows = [{"time": time.time(), "strategy": s, "step": i, "loss": 2.0 - i} for s in ("none", "full") for i in range(3)]
    lines = [json.dumps(r) for r in rows] + ['{"step": 3, "loss": 0.5, "strat']  # the last cut by a kill
    (run / "metrics.jsonl").write_text("\n".join(lines))
    got = compare.curves(compare.load_run(run))
    assert got == {"none": ([0, 1, 2], [2.0, 1.0, 0.0]), "full": ([0, 1, 2], [2.0, 1.0, 0.0])}
