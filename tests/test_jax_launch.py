"""Launching a JAX lab: one process holding N devices (simulated CPU devices without GPUs), not
N ranks; what does not apply to one process, and a missing or too old JAX, are refused in one line;
the runtime's run directory."""

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT, only_run, run_cli
from plscale.cli import main as cli_main
from plscale.errors import UserError
from plscale.lab import labs
from plscale.lab.jaxenv import DEVICE_COUNT as COUNT
from plscale.lab.jaxenv import JAX_FLOOR
from plscale.run.launch import Options, plan

RUN = Path("/tmp/run-x")
MISSING_JAX = ("Lab jax-gspmd needs JAX, an optional extra: pip install -e '.[jax]' in the plscale checkout "
               f"(or pip install 'jax>={JAX_FLOOR}'; CPU wheels), then run it again.")
REAL_FIND_SPEC = importlib.util.find_spec


def installed(monkeypatch, *modules):
    """Make the plan see exactly these of jax and its CUDA plugins installed."""
    def find_spec(name, *args):
        if name == "jax" or name.startswith("jax_cuda"):
            return object() if name in modules else None
        return REAL_FIND_SPEC(name, *args)
    monkeypatch.setattr("plscale.lab.jaxenv.find_spec", find_spec)


@pytest.fixture(autouse=True)
def host(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "XLA_FLAGS", "CUDA_VISIBLE_DEVICES"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr("plscale.run.launch.cpu_cores", lambda: 8)
    installed(monkeypatch, "jax")


@pytest.fixture
def gspmd():
    return labs.find("jax-gspmd")


def test_cpu_plan_is_one_process_with_n_simulated_devices(gspmd):
    lab, variant = gspmd
    p = plan(lab, variant, Options(gpus=2), gpus_present=[]).at(RUN)
    assert p.argv == [sys.executable, str(lab.entry_path), "--run-dir", str(RUN)]
    assert p.launcher == "jax" and p.world_size == 2 and p.device == "cpu"
    assert p.env["XLA_FLAGS"] == f"{COUNT}=2" and p.env["JAX_PLATFORMS"] == "cpu"
    assert p.env["CUDA_VISIBLE_DEVICES"] == "" and "DS_ACCELERATOR" not in p.env
    assert p.env["OMP_NUM_THREADS"] == "8"  # one process: every core, not cores / devices
    assert p.notice == f"A JAX lab: one process with 2 simulated CPU devices (XLA_FLAGS={COUNT}=2)."
    assert p.files == {}


def test_lab_launcher_is_inherited_and_its_default_devices(gspmd):
    lab, _ = gspmd
    p = plan(lab, lab.variant("collectives"), Options(), gpus_present=[])
    assert p.launcher == "jax" and p.world_size == lab.default_ranks and p.entry.name == "collectives.py"


def test_a_users_xla_flags_are_kept_and_their_device_count_replaced(gspmd, monkeypatch):
    monkeypatch.setenv("XLA_FLAGS", f"--xla_cpu_enable_fast_math=false {COUNT}=7")
    p = plan(*gspmd, Options(gpus=4), gpus_present=[])
    assert p.env["XLA_FLAGS"] == f"--xla_cpu_enable_fast_math=false {COUNT}=4"


def test_gpus_with_the_cuda_plugin(gspmd, monkeypatch):
    installed(monkeypatch, "jax", "jax_cuda12_plugin")
    p = plan(*gspmd, Options(gpus=2), gpus_present=["H100"] * 4)
    assert p.device == "cuda" and p.world_size == 2
    assert p.env["CUDA_VISIBLE_DEVICES"] == "0,1" and p.env["JAX_PLATFORMS"] == "cuda" and "XLA_FLAGS" not in p.env
    assert "one process with 2 CUDA GPU(s) (H100)" in p.notice
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5,6,7")  # the user's GPUs, not GPUs 0 and 1
    assert plan(*gspmd, Options(gpus=2), gpus_present=["H100"] * 4).env["CUDA_VISIBLE_DEVICES"] == "4,5"
    assert plan(*gspmd, Options(gpus=2, cpu=True), gpus_present=["H100"] * 4).env["JAX_PLATFORMS"] == "cpu"


def test_gpus_without_the_cuda_plugin_fall_back_to_cpu_devices_and_say_why(gspmd):
    p = plan(*gspmd, Options(gpus=8), gpus_present=["H100"])  # 8 devices: more than the GPUs, fine on CPU
    assert p.device == "cpu" and p.env["XLA_FLAGS"] == f"{COUNT}=8" and p.env["CUDA_VISIBLE_DEVICES"] == ""
    assert "no CUDA plugin" in p.notice and "pip install 'jax[cuda12]'" in p.notice


@pytest.mark.parametrize("opts, message", [
    (Options(launcher="deepspeed"), "Lab jax-gspmd runs under jax, not deepspeed: drop --launcher or use --launcher jax."),
    (Options(nodes=2, node_rank=0), "--nodes 2: a JAX lab runs one process"),
    (Options(node_rank=0), "--node-rank 0: a JAX lab runs one process"),
    (Options(hostfile="/etc/hostname"), "--hostfile /etc/hostname: a JAX lab runs one process"),
    (Options(max_restarts=1), "--max-restarts 1: a JAX lab runs one process"),
    (Options(gpus=3), "Lab jax-gspmd runs with 2, 4, 8 devices, not 3"),
])
def test_what_one_process_cannot_do_is_refused(gspmd, opts, message):
    with pytest.raises(UserError, match=re.escape(message)):
        plan(*gspmd, opts, gpus_present=[])


def test_jax_launcher_is_for_jax_labs_only():
    with pytest.raises(UserError, match="Lab mnist-pseudo-dp is a PyTorch lab: --launcher jax runs JAX labs only"):
        plan(*labs.find("mnist-dp"), Options(launcher="jax"), gpus_present=[])


def run_main(monkeypatch, capsys, *args) -> tuple[int, str, str]:
    """`plscale ARGS` in this process (so find_spec can be patched): exit code, stdout, stderr."""
    monkeypatch.setattr(sys, "argv", ["plscale", *args])
    with pytest.raises(SystemExit) as exit_:
        cli_main.main()
    out = capsys.readouterr()
    return exit_.value.code, out.out, out.err


def test_missing_jax_is_one_line_and_exit_2(monkeypatch, capsys, tmp_path):
    installed(monkeypatch)  # no jax
    monkeypatch.setenv("PLSCALE_RUNS_DIR", str(tmp_path / "runs"))
    code, _, err = run_main(monkeypatch, capsys, "lab", "run", "jax-gspmd")
    assert code == 2 and err.strip() == f"error: {MISSING_JAX}"
    assert not (tmp_path / "runs").exists()


def test_too_old_jax_is_one_line_naming_the_version_needed(gspmd, monkeypatch):
    monkeypatch.setattr("plscale.lab.jaxenv.version", lambda name: "0.4.35")
    with pytest.raises(UserError, match=re.escape(f"Lab jax-gspmd needs JAX {JAX_FLOOR} or newer, and this "
                                                  f"environment has 0.4.35: pip install -U 'jax>={JAX_FLOOR}'")):
        plan(*gspmd, Options(), gpus_present=[])
    monkeypatch.setattr("plscale.lab.jaxenv.version", lambda name: f"{JAX_FLOOR}.dev20260101")
    assert plan(*gspmd, Options(), gpus_present=[]).launcher == "jax"


def test_the_floor_is_the_jax_extras():
    assert f'jax = ["jax>={JAX_FLOOR}"]' in (ROOT / "pyproject.toml").read_text()


def test_dry_run_shows_the_plan(monkeypatch, capsys):
    code, out, _ = run_main(monkeypatch, capsys, "lab", "run", "jax", "--cpu", "--gpus", "2", "--dry-run")
    assert code in (0, None), out
    text = " ".join(out.split())
    assert "jax-gspmd / layouts: A JAX lab: one process with 2 simulated CPU devices" in text
    assert f"XLA_FLAGS={COUNT}=2" in text and "gspmd.py --run-dir" in text and "deepspeed" not in text
    monkeypatch.setattr("plscale.run.launch.cuda_gpus", lambda: ["H100"])  # a GPU, but JAX without its plugin
    code, out, _ = run_main(monkeypatch, capsys, "lab", "run", "jax", "--gpus", "2", "--dry-run")
    assert "the 1 GPU(s) stay idle; pip install 'jax[cuda12]' to use them." in " ".join(out.split())


TINY_LAB = """id: tiny-jax
title: the JAX runtime, end to end
sections: {x: [x]}
entry: tiny.py
launcher: jax
ranks: {default: 4, allowed: [2, 4]}
settings: {seed: 0, train: {steps: 2}, fail: false, ds: {stage: 0, micro_batch: 2}}
"""
TINY_SCRIPT = """from plscale.jaxlab import runtime
from plscale.rank.metrics import figure

ctx = runtime.start(__file__)  # before jax, as gspmd.py does
import jax.numpy as jnp

total = float(jnp.sum(jnp.arange(8.0)))
ctx.metrics.step(step=0, loss=total)
ctx.check("sum", total == 28 and not ctx.settings["fail"], str(total))
ctx.finish([figure("devices", ctx.world_size)], platform=ctx.platform)
"""


@pytest.fixture
def tiny_files(tmp_path):
    folder = tmp_path / "labs" / "01_tiny"
    folder.mkdir(parents=True)
    (folder / "lab.yaml").write_text(TINY_LAB)
    (folder / "tiny.py").write_text(TINY_SCRIPT)
    return folder


@pytest.fixture
def tiny(tiny_files):
    pytest.importorskip("jax", reason="JAX is an optional extra: pip install -e '.[jax]'")
    return tiny_files


def test_runtime_under_plscale_lab_run(tiny, tmp_path):
    env = {"PLSCALE_LABS_DIR": str(tiny.parent), "PLSCALE_RUNS_DIR": str(tmp_path / "runs")}
    result = run_cli("lab", "run", "tiny-jax", "--gpus", "2", "--cpu", env=env, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    run = only_run(tmp_path / "runs")
    summary = json.loads((run / "summary.json").read_text())
    assert summary["passed"] and summary["world_size"] == 2 and summary["backend"] == "xla-cpu"
    assert summary["figures"][0]["value"] == 2 and summary["platform"] == "cpu"
    system = json.loads((run / "system.json").read_text())
    assert system["world_size"] == 2 and system["jax"] and (run / "rank_0.log").is_file()


def test_runtime_by_hand_failed_check_and_bad_setting(tiny, tmp_path):
    env = {**os.environ, "PLSCALE_RUNS_DIR": str(tmp_path / "runs"), "XLA_FLAGS": "", "JAX_PLATFORMS": "cpu"}

    def run(*args):
        return subprocess.run([sys.executable, str(tiny / "tiny.py"), *args], env=env, capture_output=True,
                              text=True, timeout=120)

    failed = run("--set", "fail=true")
    assert failed.returncode == 1 and "[FAIL] sum" in failed.stdout, failed.stderr
    summary = json.loads((only_run(tmp_path / "runs") / "summary.json").read_text())
    assert summary["world_size"] == 4 and not summary["passed"]  # by hand: the lab's default device count
    bad = run("--set", "nope=1")
    assert bad.returncode == 2 and bad.stderr.strip().splitlines() == ["error: Unknown setting 'nope'. "
                                                                      "See the settings with `plscale lab show LAB`."]


def test_runtime_by_hand_with_a_broken_jax_is_one_line(tiny_files, tmp_path):
    no_jax = tmp_path / "no_jax" / "jax"  # a jax whose import fails, in front of the installed one
    no_jax.mkdir(parents=True)
    (no_jax / "__init__.py").write_text("raise ImportError(\"No module named 'jax'\")\n")
    env = {**os.environ, "PLSCALE_RUNS_DIR": str(tmp_path / "runs"),
           "PYTHONPATH": os.pathsep.join([str(no_jax.parent), str(ROOT)])}
    out = subprocess.run([sys.executable, str(tiny_files / "tiny.py")], env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 2 and out.stderr.strip().splitlines() == [
        "error: JAX is installed but does not import (No module named 'jax'): reinstall it with "
        f"pip install --force-reinstall 'jax>={JAX_FLOOR}' 'jaxlib>={JAX_FLOOR}'."]
    assert not (tmp_path / "runs").exists()
