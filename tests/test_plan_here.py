"""`plscale plan --here`: the planner on this machine's CPU ranks, and its layouts handed to lab 11
(`--layout plan.json[:N]`, `--sweep`). The sweep end to end runs two of its layouts on 4 CPU ranks."""

import json
from dataclasses import replace
from pathlib import Path

import pytest

from plscale.lab import labs
from plscale.predict.cluster import cpu_ranks
from plscale.predict.pipeline import bubble_fraction
from plscale.predict.plan import Candidate, Job, memory_setup, plan
from plscale.predict.presets import PRESETS
from plscale.predict.step_time import step_terms
from plscale.run import flow, layouts
from plscale.run.launch import Options
from plscale.run.machine import Machine

# measured 2026-12-01 on the 2-core CI machine: `plscale plan --here --gpus 8 --model tiny --seq 64 --micro-batch 2`
MEASURED = Machine(8, 2, 16.92e9, 0.494, 1489.0, 2.8 * 2**30,
                   "the 2 x 64-token forward and backward of a 128-wide, 2-layer Llama",
                   {"reduce_scatter": 0.062, "all_gather": 0.264}, 937.5, 28.0, 11880.0)
TINY_JOB = Job(PRESETS["tiny"], 8, 64, 16, "fp32", 1.0, fixed=(("recompute", "none"), ("micro_batch", 2),
                                                             ("virtual", 1)), overlap=False)


def saved_machine(tmp_path, machine=MEASURED):
    path = tmp_path / "machine.json"
    path.write_text(json.dumps({"machine": machine.to_dict()}))
    return path


def test_ranks_sharing_cores_pay_the_bubble_as_a_gpu_does_only_with_a_core_each():
    # Properties of step_time's shared-core rule, not its arithmetic: with a core for every rank it is
    # the GPU formula W f / (1 - f) (pp 2, m 2: f = 1/3, half of W); with fewer cores the bubble costs
    # less, never more; with 8 ranks on 2 cores, where the stages that wait leave 4 ranks busy, nothing.
    c = Candidate(4, 1, 2, 1, 0, "none", 2, 2, False, 0.0)
    job = Job(PRESETS["tiny"], 8, 64, 16, "fp32", 1.0, overlap=False)
    assert bubble_fraction(2, 2) == pytest.approx(1 / 3)

    def bubble_share(cores):
        gpu = replace(cpu_ranks(8, 2, 1e10, 1.0, 100.0, 2**30), cores=cores)
        t = step_terms(job, gpu, c, memory_setup(job, c, 1), 1)
        return t["bubble"] / (t["compute"] + t["tp"] + t["pp"] + t["cp"])

    assert bubble_share(0) == pytest.approx(0.5) and bubble_share(8) == pytest.approx(0.5)
    shares = [bubble_share(cores) for cores in range(1, 9)]
    assert shares == sorted(shares) and shares[1] == 0.0 and 0 < shares[5] < 0.5


def test_what_gloo_and_dispatch_cost_on_cpu_ranks_moves_the_plan_as_measured():
    # Properties of the measured figures (MEASURED above), not their arithmetic. gloo's reduce-scatter runs
    # at a fraction of its all-reduce's rate: ZeRO-1's reduce-scatter and all-gather cost more than ZeRO-0's
    # all-reduce of the same gradients (lab 11 measured 109 ms against 18 ms for 2.75 MB on 8 ranks).
    # A layer's fixed cost (dispatch) is paid whole by every tp rank: tp 2 halves the FLOPs, not the time.
    job, gpu = TINY_JOB, MEASURED.cluster()

    def terms(dp, tp, zero, overhead=MEASURED.layer_overhead_us):
        c = Candidate(dp, tp, 1, 1, zero, "none", 2, 16 // (2 * dp), False, 0.0)
        return step_terms(job, replace(gpu, layer_overhead_us=overhead), c, memory_setup(job, c, 2), 2)

    assert terms(8, 1, 1)["dp"] > terms(8, 1, 0)["dp"] > 0
    assert terms(8, 1, 1)["optimizer"] < terms(8, 1, 0)["optimizer"]     # ZeRO-1 steps a share of the states
    # without the fixed cost tp 2 would be as fast as dp 8; with it, slower (lab 11's sweep: 0.273 s against 0.098)
    assert terms(4, 2, 0, overhead=0)["compute"] < 1.01 * terms(8, 1, 0, overhead=0)["compute"]
    assert terms(4, 2, 0)["compute"] > 1.2 * terms(8, 1, 0)["compute"]


def test_the_plan_keeps_the_fixed_micro_batch_and_plain_1f1b():
    result = plan(TINY_JOB, MEASURED.cluster())
    assert result.ranked and {(c.micro_batch, c.virtual, c.recompute) for c in result.ranked} == {(2, 1, "none")}
    layouts_ = {c.layout for c in result.ranked}
    # tiny: 4 heads (tp 1, 2, 4), 2 layers (pp 1, 2), seq 64 (cp to 8): the 15 products of 8 ranks
    assert len(layouts_) == 15 and all(dp * tp * pp * cp == 8 for dp, tp, pp, cp in layouts_)


@pytest.mark.e2e
def test_plan_here_measures_this_machine_and_a_saved_machine_plans_alike(cli, tmp_path):
    out = cli("plan", "--here", "--gpus", "2", "--model", "tiny", "--seq", "64", "--global-batch", "4",
              "--micro-batch", "2", "--json")
    assert out.returncode == 0, out.stderr[-2000:]
    first = json.loads(out.stdout)                        # stdout is the JSON alone; the figures went to stderr
    assert "this machine: 2 CPU ranks" in out.stderr
    m = first["machine"]
    assert m["ranks"] == 2 and m["flops"] > 1e7 and m["busbw_gbs"] > 0 and m["latency_us"] > 0 and m["memory"] > 2**20
    assert set(m["collective_gbs"]) == {"reduce_scatter", "all_gather"} and min(m["collective_gbs"].values()) > 0
    assert m["p2p_latency_us"] > 0 and m["optimizer_ns"] > 0 and m["layer_overhead_us"] >= 0
    assert first["gpu"]["cores"] == m["cores"] and first["job"]["precision"] == "fp32"
    assert {(c["dp"], c["tp"], c["pp"], c["cp"]) for c in first["candidates"]} == {(2, 1, 1, 1), (1, 2, 1, 1),
                                                                                   (1, 1, 2, 1), (1, 1, 1, 2)}
    saved = tmp_path / "plan.json"
    saved.write_text(out.stdout)
    again = cli("plan", "--here", "--gpus", "2", "--model", "tiny", "--seq", "64", "--global-batch", "4",
                "--micro-batch", "2", "--json", "--machine", saved)
    assert again.returncode == 0 and "this machine" not in again.stderr   # read, not measured
    assert json.loads(again.stdout)["candidates"] == first["candidates"]


@pytest.mark.parametrize("args, says", [
    (["--here", "--gpu", "A100"], "--here measures this machine; drop --gpu"),
    (["--machine", "nope.json"], "--machine gives this machine's figures: use it with --here"),
    (["--here", "--gpus", "1"], "--gpus 1: measuring this machine takes 2 or more ranks"),
    (["--here", "--gpus", "4", "--machine", "SAVED"], "was measured with 8 ranks; plan with --gpus 8"),
    (["--here", "--gpus", "8", "--machine", "README.md"], "--machine README.md: not a plan's JSON"),
    (["--gpus", "8", "--global-batch", "16", "--micro-batch", "3"], "--micro-batch 3 must divide"),
])
def test_plan_here_bad_input_is_one_line(quick_cli, tmp_path, args, says):
    args = [str(saved_machine(tmp_path)) if a == "SAVED" else a for a in args]
    out = quick_cli("plan", "--model", "tiny", "--seq", "64", *args)
    assert out.returncode == 2 and says in out.stderr, out.stderr
    assert len(out.stderr.strip().splitlines()) == 1


def test_figures_saved_by_an_older_plscale_ask_to_measure_again(quick_cli, tmp_path):
    old = {k: v for k, v in MEASURED.to_dict().items() if k not in ("collective_gbs", "p2p_latency_us")}
    path = tmp_path / "old.json"
    path.write_text(json.dumps({"machine": old}))
    out = quick_cli("plan", "--model", "tiny", "--seq", "64", "--here", "--gpus", "8", "--machine", str(path))
    assert out.returncode == 2 and "collective_gbs, p2p_latency_us missing" in out.stderr and "measure again" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1


def planned_json(quick_cli, tmp_path, *extra) -> str:
    out = quick_cli("plan", "--here", "--machine", saved_machine(tmp_path), "--gpus", "8", "--model", "tiny", "--seq",
                    "64", "--global-batch", "16", "--micro-batch", "2", "--all", "--top", "100", "--json", *extra)
    assert out.returncode == 0, out.stderr
    path = tmp_path / "plan.json"
    path.write_text(out.stdout)
    return str(path)


def test_a_plan_candidate_becomes_the_labs_settings_and_names_the_run(quick_cli, tmp_path):
    spec = planned_json(quick_cli, tmp_path, "--recompute", "none", "--virtual", "1")
    candidates = json.loads(Path(spec).read_text())["candidates"]
    pick = next(i for i, c in enumerate(candidates, 1) if (c["tp"], c["pp"], c["cp"], c["zero"]) == (2, 2, 1, 1))
    c = candidates[pick - 1]
    lab, variant = flow.choose("4d")
    opts = Options(gpus=8, cpu=True, sets=["train.steps=3"])
    chosen = flow.layout_variant(lab, variant, opts, f"{spec}:{pick}")
    assert chosen.name == "dp2-tp2-pp2-cp1"
    s = flow.prepare(lab, chosen, opts).resolved.settings
    assert s["parallel"] == {"tp": 2, "pp": 2, "cp": 1} and s["ds"]["stage"] == 1
    assert (s["ds"]["micro_batch"], s["ds"]["grad_accum"]) == (2, c["micro_batches"]) == (2, 4)
    assert s["tp"]["sequence_parallel"] == c["sp"] and s["train"]["steps"] == 3   # the user's --set still counts
    assert s["planned"]["step_s"] == pytest.approx(c["step_s"], rel=1e-5)
    assert s["planned"]["tp"] == pytest.approx(c["terms_s"]["tp"], rel=1e-5)
    shown = quick_cli("lab", "run", "4d", "--gpus", "8", "--cpu", "--dry-run", "--layout", f"{spec}:{pick}")
    assert shown.returncode == 0 and "4d / dp2-tp2-pp2-cp1" in shown.stdout and "predicted step" in shown.stdout


def test_layouts_the_lab_cannot_run_are_refused_in_one_line(quick_cli, tmp_path):
    spec = planned_json(quick_cli, tmp_path)                    # recomputation and interleaving left free
    candidates = json.loads(Path(spec).read_text())["candidates"]
    full = next(i for i, c in enumerate(candidates, 1) if c["recompute"] != "none")
    gpu_plan = quick_cli("plan", "--model", "tiny", "--gpus", "8", "--seq", "64", "--global-batch", "16", "--json")
    (tmp_path / "h100.json").write_text(gpu_plan.stdout)
    wider = tmp_path / "wider.json"
    wider.write_text(quick_cli("plan", "--here", "--machine", saved_machine(tmp_path), "--gpus", "8", "--model", "tiny",
                               "--seq", "64", "--global-batch", "16", "--layers", "4", "--json").stdout)
    for args, says in ((["--layout", f"{spec}:{full}"], "recomputes"),
                       (["--layout", f"{spec}:999"], f"the plan lists {len(candidates)} candidates"),
                       (["--layout", "README.md"], "--layout README.md: not a plan's JSON"),
                       (["--layout", str(tmp_path / "h100.json")], "a plan for H100 SXM5 80GB, not this machine"),
                       (["--layout", str(wider)], "a changed shape of tiny"),
                       (["--layout", spec, "--set", "model.seq=32"], "the plan is for another run: seq 64 (the lab's 32)"),
                       (["--layout", spec, "--set", "parallel.tp=2"], "--layout chooses parallel.tp itself"),
                       (["--sweep", "--set", "ds.grad_accum=2"], "--sweep chooses ds.grad_accum itself"),
                       (["--layout", spec, "--sweep"], "--sweep runs every layout itself")):
        out = quick_cli("lab", "run", "4d", "--gpus", "8", "--cpu", *args)
        assert out.returncode == 2 and says in out.stderr, (args, out.stderr)
        assert len(out.stderr.strip().splitlines()) == 1
    out = quick_cli("lab", "run", "zero", "--gpus", "2", "--cpu", "--layout", spec)
    assert out.returncode == 2 and "lab zero takes no planner layout" in out.stderr
    assert not (tmp_path / "runs").exists()                     # refused before any run directory


def test_a_failed_run_does_not_stop_the_sweep(tmp_path, monkeypatch):
    lab, _ = flow.choose("zero", sweep=True)
    prepared = flow.prepare_sweep(lab, Options(gpus=2, cpu=True))
    made = []

    def launch(p, console, command, runs):      # the first variant's ranks fail, the others finish
        run_dir = tmp_path / p.resolved.variant.name
        if not made:
            made.append(run_dir)
            raise flow.RunFailed(3, run_dir)
        made.append(run_dir)
        return run_dir

    monkeypatch.setattr(flow, "launch", launch)
    monkeypatch.setattr(lab, "sweep_report", None)
    with pytest.raises(flow.RunFailed) as failed:
        flow.run_sweep(lab, prepared._replace(per_run={"per_run": list(range(len(lab.sweep)))},
                                              record={"note": list(range(len(lab.sweep)))}),
                       runs=tmp_path / "runs")
    record = json.loads((failed.value.run_dir / "sweep.json").read_text())
    assert failed.value.code == 3 and len(made) == len(lab.sweep)
    assert record["variants"] == lab.sweep[1:] and record["runs"] == [str(d) for d in made[1:]]
    assert record["failed"] == [{"variant": lab.sweep[0], "run": str(made[0]), "exit_code": 3}]
    # a per-run list follows the runs that finished; the rest is kept whole, whatever its length
    assert record["per_run"] == list(range(1, len(lab.sweep))) and record["note"] == list(range(len(lab.sweep)))


def test_rank_correlation_matches_scipy():
    scipy_stats = pytest.importorskip("scipy.stats", reason="scipy: the independent Spearman")
    import importlib.util
    spec = importlib.util.spec_from_file_location("sweep_report", labs.find("4d")[0].folder / "sweep_report.py")
    report = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(report)
    for x, y in (([1, 2, 3, 4, 5], [2, 1, 4, 3, 5]), ([0.1, 0.1, 0.3, 0.2], [5, 6, 7, 7]), ([3, 1, 2], [1, 2, 3])):
        assert report.spearman(x, y) == pytest.approx(scipy_stats.spearmanr(x, y).statistic, abs=1e-12)


RANKS = 4


@pytest.mark.e2e
def test_the_sweep_runs_planned_layouts_and_reports_predicted_against_measured(tmp_path, monkeypatch):
    # the whole sweep is 15 layouts on 8 ranks (about 8 minutes on 2 cores with --steps 6): the test runs the lab's
    # smallest world, 4 ranks (half the ranks' start-up; test_4d_lab.py runs 8), and keeps the first and last layouts,
    # planned on the figures this machine measured (MEASURED, taken as 4 ranks': measuring is the test above's, at 2)
    planned = layouts.planned
    from plscale.run import machine
    monkeypatch.setattr(machine, "measure_showing", lambda console, ranks, *_: replace(MEASURED, ranks=RANKS))

    def two(*args):
        found = planned(*args)
        return found._replace(runs=[found.runs[0], found.runs[-1]])

    monkeypatch.setattr(layouts, "planned", two)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    from rich.console import Console
    with open(tmp_path / "console.txt", "w") as out:
        sweep_dir = flow.sweep("4d", Options(gpus=RANKS, cpu=True, steps=2), Console(file=out, width=160),
                               runs=tmp_path / "runs")
    record = json.loads((sweep_dir / "sweep.json").read_text())
    assert record["machine"]["ranks"] == RANKS and len(record["runs"]) == len(record["planned"]) == 2
    assert record["planned"][0]["step_s"] <= record["planned"][1]["step_s"]        # the planner's order
    report = json.loads((sweep_dir / "sweep_report.json").read_text())
    for row, run in zip(report["rows"], record["runs"]):
        summary = json.loads((Path(run) / "summary.json").read_text())
        assert summary["passed"], summary["checks"]                           # every layout follows the dense model
        step = next(f for f in summary["figures"] if f["name"] == "step time")
        assert row["measured_s"] == step["value"] and step["predicted"] == pytest.approx(row["predicted_s"], rel=1e-5)
    assert (sweep_dir / "sweep.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
