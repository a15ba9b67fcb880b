"""What `make setup` installs on a fresh machine, checked without the network: the torch command
the Makefile writes (`make -n`), and what pip resolves from it when both the public index and
PyTorch's CPU index offer torch 2.13.0 (two local indexes of stand-in wheels, pip --dry-run)."""

import base64
import hashlib
import json
import os
import shlex
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CPU_INDEX = "https://download.pytorch.org/whl/cpu"

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")


def make_commands(tmp_path, nvidia: bool, *overrides) -> list[str]:
    """The commands `make setup` would run on a machine with or without nvidia-smi."""
    bin_dir = tmp_path / ("gpu-bin" if nvidia else "cpu-bin")
    bin_dir.mkdir(exist_ok=True)
    if nvidia:
        (bin_dir / "nvidia-smi").write_text("#!/bin/sh\nexit 0\n")
        (bin_dir / "nvidia-smi").chmod(0o755)
    path = os.pathsep.join([str(bin_dir), *(p for p in os.environ["PATH"].split(os.pathsep)
                                            if not (Path(p) / "nvidia-smi").exists())])
    done = subprocess.run(["make", "-n", "setup", f"VENV={tmp_path / 'venv'}", *overrides], cwd=ROOT,
                          env={**os.environ, "PATH": path}, capture_output=True, text=True, check=True)
    return done.stdout.splitlines()


def torch_line(commands: list[str]) -> list[str]:
    line = next(c for c in commands if c.split()[-1].startswith("torch"))
    return shlex.split(line)


def test_a_machine_without_a_gpu_adds_the_cpu_index_and_every_install_is_pinned(tmp_path):
    cpu = make_commands(tmp_path, nvidia=False)
    words = torch_line(cpu)
    assert words[words.index("--extra-index-url") + 1] == CPU_INDEX
    assert all("-c constraints.txt" in c for c in cpu if " install " in c), cpu
    gpu = torch_line(make_commands(tmp_path, nvidia=True))
    assert "--extra-index-url" not in gpu and "--index-url" not in gpu   # the public index's CUDA build
    chosen = torch_line(make_commands(tmp_path, True, "TORCH_INDEX=https://download.pytorch.org/whl/cu126"))
    assert chosen[chosen.index("--extra-index-url") + 1].endswith("/cu126")
    unpinned = make_commands(tmp_path, False, "CONSTRAINTS=")
    assert not any("-c " in c for c in unpinned)


def wheel(folder: Path, version: str) -> None:
    """A stand-in torch wheel of this version (metadata only), in a PEP 503 simple index."""
    name = f"torch-{version}-py3-none-any.whl"
    info = f"torch-{version}.dist-info"
    files = {f"{info}/METADATA": f"Metadata-Version: 2.1\nName: torch\nVersion: {version}\n",
             f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
             "torch/__init__.py": ""}
    record = [f"{path},sha256={base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b'=').decode()}"
              f",{len(text.encode())}" for path, text in files.items()]
    files[f"{info}/RECORD"] = "\n".join(record + [f"{info}/RECORD,,"]) + "\n"
    project = folder / "torch"
    project.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(project / name, "w") as z:
        for path, text in files.items():
            z.writestr(path, text)
    links = "".join(f'<a href="{p.name}">{p.name}</a>\n' for p in sorted(project.glob("*.whl")))
    (project / "index.html").write_text(f"<html><body>\n{links}</body></html>\n")


def resolved(tmp_path, words: list[str], public: Path) -> str:
    """The torch version pip picks for the Makefile's torch command, the public index replaced by
    a local one; pip's own configuration (this machine's wheelhouse) left out."""
    pip_args = words[words.index("install") + 1:]
    report = tmp_path / "report.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env["PIP_CONFIG_FILE"] = os.devnull
    subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--no-deps",
                    "--report", str(report), "--index-url", public.as_uri(), *pip_args], cwd=ROOT, env=env,
                   check=True, capture_output=True, text=True)
    return json.loads(report.read_text())["install"][0]["metadata"]["version"]


def test_pip_takes_the_cpu_build_without_a_gpu_and_the_public_one_with(tmp_path):
    public, cpu = tmp_path / "public", tmp_path / "cpu"
    wheel(public, "2.13.0")          # what pypi.org offers: on Linux the CUDA build
    wheel(public, "2.12.0")
    wheel(cpu, "2.13.0+cpu")         # PyTorch's CPU index
    wheel(cpu, "2.14.0+cpu")         # newer than the references: the constraint keeps 2.13.0
    without = torch_line(make_commands(tmp_path, False, f"CPU_INDEX={cpu.as_uri()}"))
    assert resolved(tmp_path, without, public) == "2.13.0+cpu"
    with_gpu = torch_line(make_commands(tmp_path, True, f"CPU_INDEX={cpu.as_uri()}"))
    assert resolved(tmp_path, with_gpu, public) == "2.13.0"
