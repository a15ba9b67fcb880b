"""plscale.run.flow: `plscale lab run` callable from this process, with the CLI's plan and words."""

import io
import re

import pytest
import typer
from rich.console import Console

from conftest import load_summary, only_run
from plscale.cli import lab as lab_cli
from plscale.errors import UserError
from plscale.run import flow
from plscale.run.launch import Options

STAMP = re.compile(r"\d{8}-\d{6}")  # the run directory's time: a second may pass between two plans


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def test_dry_run_prints_flows_plan(quick_cli, monkeypatch):
    args = ["mnist-dp", "--gpus", "2", "--cpu", "--launcher", "torchrun", "--master-port", "29555",
            "--set", "ds.lr=0.002"]
    shown = quick_cli("lab", "run", *args, "--dry-run")
    assert shown.returncode == 0, shown.stdout + shown.stderr
    monkeypatch.setenv("PLSCALE_RUNS_DIR", str(quick_cli.runs))
    request = flow.parse(["lab", "run", *args])
    prepared = flow.prepare(*flow.choose(request.name, request.variant), request.opts)
    heading, command = flow.describe(prepared)
    assert heading == "mnist-pseudo-dp / default: " + prepared.plan.notice
    assert prepared.plan.launcher == "torchrun" and prepared.resolved.settings["ds"]["lr"] == 0.002
    printed = STAMP.sub("T", " ".join(shown.stdout.split()))
    assert STAMP.sub("T", f"{heading} command: {command}") == printed
    assert not quick_cli.runs.exists()  # a plan writes nothing


def test_sweep_plans_every_variant_before_any_runs():
    lab, _ = flow.choose("zero", sweep=True)
    prepared = flow.prepare_sweep(lab, Options(gpus=2, cpu=True))
    assert [p.resolved.variant.name for p in prepared.runs] == lab.sweep
    with pytest.raises(UserError, match="drop --variant"):
        flow.choose("zero", "zero2", sweep=True)
    lab, _ = flow.choose("mnist-dp")
    with pytest.raises(UserError, match="has no sweep"):
        flow.prepare_sweep(lab, Options(gpus=2, cpu=True))


def test_bad_input_is_a_user_error_before_anything_is_written(tmp_path):
    with pytest.raises(UserError, match="No lab named 'nope'"):
        flow.run("nope", Options(cpu=True), runs=tmp_path)
    with pytest.raises(UserError, match="runs with 1, 2, 4, 8 ranks"):
        flow.run("mnist-dp", Options(gpus=3, cpu=True), runs=tmp_path)
    with pytest.raises(UserError, match="Unknown setting"):
        flow.run("mnist-dp", Options(gpus=2, cpu=True, sets=["train.nope=1"]), runs=tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_the_words_of_a_run_are_the_clis():
    """flow.parse knows exactly `plscale lab run`'s flags, and command_line writes what it reads."""
    command = typer.main.get_command(lab_cli.app).commands["run"]
    cli_flags = {opt for param in command.params for opt in (*param.opts, *param.secondary_opts)
                 if opt.startswith("-")}
    assert cli_flags == set(flow.FLAGS)
    request = flow.parse(["plscale", "lab", "run", "zero", "--sweep", "--gpus", "2", "--cpu", "--set", "a.b=1",
                          "--set", "c=x y", "--steps", "5", "--master-port", "1234", "-v", "zero2"])
    assert request.name == "zero" and request.sweep and request.variant == "zero2" and not request.dry_run
    assert request.opts == Options(gpus=2, cpu=True, sets=["a.b=1", "c=x y"], steps=5, master_port=1234)
    words = flow.command_line("zero", request.opts, "zero2")
    assert words[:4] == ["plscale", "lab", "run", "zero"]
    again = flow.parse(words)
    assert (again.name, again.variant, again.opts) == ("zero", "zero2", request.opts)
    with pytest.raises(UserError, match="unrecognized arguments: --nope"):
        flow.parse(["lab", "run", "zero", "--nope"])


TINY_LAB = """id: tiny
title: the flow, end to end
sections: {x: [x]}
entry: tiny.py
ranks: {default: 2, allowed: [2]}
settings: {seed: 0, train: {steps: 3}, fail: false}
"""
TINY_SCRIPT = """import torch
import torch.distributed as dist

from plscale.rank import runtime
from plscale.rank.metrics import figure

ctx = runtime.start(__file__)
steps = ctx.settings["train"]["steps"]
for step in range(1, steps + 1):
    total = torch.tensor([float(ctx.rank + step)])
    dist.all_reduce(total)
    ctx.metrics.step(step=step, loss=total.item())
    ctx.metrics.progress("train", step, steps)
ctx.log("tiny says hello")
ctx.check("all_reduce", total.item() == 1 + 2 * steps and not ctx.settings["fail"], str(total.item()))
ctx.finish([figure("sum", total.item(), predicted=1 + 2 * steps)])
"""


@pytest.mark.e2e
def test_a_lab_runs_in_process(tmp_path, monkeypatch):
    """2 CPU ranks under torchrun, started by flow in this process: the run directory holds the
    summary; rank 0's lines reach the console; a failed check is RunFailed with its run directory."""
    folder = tmp_path / "labs" / "01_tiny"
    folder.mkdir(parents=True)
    (folder / "lab.yaml").write_text(TINY_LAB)
    (folder / "tiny.py").write_text(TINY_SCRIPT)
    monkeypatch.setenv("PLSCALE_LABS_DIR", str(tmp_path / "labs"))
    out = io.StringIO()
    console = Console(file=out, width=160)
    opts = Options(gpus=2, cpu=True, launcher="torchrun", steps=2)
    run_dir = flow.run("tiny", opts, console=console, runs=tmp_path / "runs")
    assert run_dir == only_run(tmp_path / "runs")
    summary = load_summary(run_dir)
    assert summary["passed"] and summary["figures"][0]["value"] == 5.0 and summary["world_size"] == 2
    text = out.getvalue()
    assert "tiny says hello" in text and f"run directory: {run_dir}" in text
    assert (run_dir / "command.txt").read_text().splitlines()[0] == \
        "plscale lab run tiny --gpus 2 --launcher torchrun --cpu --steps 2"
    flow.report(run_dir, console)
    assert "sum" in out.getvalue() and "tiny / default: summary" in out.getvalue()

    opts.sets = ["fail=true"]
    with pytest.raises(flow.RunFailed) as failed:
        flow.run("tiny", opts, console=console, runs=tmp_path / "runs")
    assert failed.value.code == 1 and not load_summary(failed.value.run_dir)["passed"]
