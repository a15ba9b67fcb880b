"""`plscale ckpt ls/verify/convert` on real checkpoints written by 2 CPU ranks.

The module's fixture trains the tiny model at ZeRO-2 and ZeRO-0 and saves steps 2 and 4
through plscale.strategies.checkpoint.sealed, beside the model's own state dict at each step (see
tests/helpers/save_checkpoints.py). Conversions must give that state dict back exactly.
"""

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT

HELPER = ROOT / "tests" / "helpers" / "save_checkpoints.py"
NEWEST, OLDER = "step000004", "step000002"
OPTIM = "zero_pp_rank_1_mp_rank_00_optim_states.pt"
MODEL = "mp_rank_00_model_states.pt"
RANK_ENV = {"OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": "", "DS_ACCELERATOR": "cpu"}


def torchrun(ranks: int, *args) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={ranks}",
               str(HELPER), *map(str, args)]
    done = subprocess.run(command, cwd=ROOT, env={**os.environ, **RANK_ENV}, capture_output=True, text=True,
                          check=False, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("checkpoints")
    torchrun(2, out, 2, 0, "fsdp2")
    return out


@pytest.fixture
def ckpt(quick_cli):
    """`plscale ckpt ARGS` in this process (quick_cli: the same main() and exit code as a subprocess, without
    an interpreter and torch's import for each call). DeepSpeed told cpu, as the ranks are (RANK_ENV), so
    that the conversion's own default does not stay in this worker's environment."""
    def call(*args):
        return quick_cli("ckpt", *args, env={"DS_ACCELERATOR": RANK_ENV["DS_ACCELERATOR"]})

    return call


def reference(saved: Path, stage: int, tag: str) -> dict:
    import torch

    return torch.load(saved / f"stage{stage}-reference" / f"{tag}.pt")


def row(listing: str, tag: str) -> str:
    """A table row of `ckpt ls`, with the lines a long cell folded onto."""
    lines = listing.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("│") and tag in line)
    found = [lines[start]]
    for line in lines[start + 1:]:
        if not line.startswith("│") or line.split("│")[2].strip():  # a border, or the next checkpoint
            break
        found.append(line)
    return " ".join(found)


def one_line_error(result, message: str) -> None:
    assert result.returncode == 2, (result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], result.stderr
    assert "Traceback" not in result.stderr


def assert_same(got: dict, want: dict) -> None:
    import torch

    assert sorted(got) == sorted(want)
    for name, tensor in want.items():
        assert got[name].dtype == torch.float32 and torch.equal(got[name], tensor), name


def test_ls_lists_both_and_marks_latest(saved, tmp_path, ckpt):
    result = ckpt("ls", saved / "stage2")
    assert result.returncode == 0, result.stderr
    newest, older = row(result.stdout, NEWEST), row(result.stdout, OLDER)
    assert "latest" in newest and "latest" not in older
    for line in (newest, older):
        assert all(word in line for word in ("full", "durable", "basic", "valid", " 2 ")), line
    # a run directory with checkpoints/ in it is accepted too
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "checkpoints").symlink_to(saved / "stage2")
    assert row(ckpt("ls", tmp_path / "run").stdout, NEWEST) == newest


def test_verify_catches_truncated_and_flipped_files(saved, tmp_path, quick_cli, ckpt):
    result = ckpt("verify", saved / "stage2")
    assert result.returncode == 0 and "2 of 2 checkpoint(s) whole" in result.stdout, result.stdout

    root = tmp_path / "ck"
    shutil.copytree(saved / "stage2", root)
    victim = root / NEWEST / OPTIM
    size = victim.stat().st_size
    with open(victim, "r+b") as handle:
        handle.truncate(size // 2)
    result = ckpt("verify", root)
    assert result.returncode == 1
    assert f"BAD {NEWEST}: {OPTIM} has {size // 2:,} bytes, the manifest says {size:,}" in result.stdout
    assert f"ok  {OLDER}" in result.stdout and f"{NEWEST} is damaged: a restore uses {OLDER}" in result.stdout
    listing = ckpt("ls", root).stdout
    assert "truncated" in row(listing, NEWEST) and "valid" not in row(listing, NEWEST)
    assert "valid" in row(listing, OLDER)
    # refused before converting: checked in this process
    one_line_error(quick_cli("ckpt", "convert", root, "--to", "fp32", "--out", tmp_path / "x.pt"),
                   f"{NEWEST} is damaged, not converted: {OPTIM} has")
    assert not (tmp_path / "x.pt").exists()

    shutil.copyfile(saved / "stage2" / NEWEST / OPTIM, victim)
    flipped = root / OLDER / MODEL
    data = bytearray(flipped.read_bytes())
    data[len(data) // 2] ^= 0xFF
    flipped.write_bytes(bytes(data))
    result = ckpt("verify", root)
    assert result.returncode == 1
    assert f"BAD {OLDER}: {MODEL} does not match its checksum (corrupted)" in result.stdout
    assert f"ok  {NEWEST}" in result.stdout
    assert ckpt("verify", root, "--tag", NEWEST).returncode == 0


@pytest.mark.parametrize("stage, fmt", [(2, "pt"), (2, "safetensors"), (0, "pt"), (0, "safetensors"),
                                        ("fsdp2", "pt"), ("fsdp2", "safetensors")])
def test_fp32_equals_the_models_parameters(saved, tmp_path, ckpt, stage, fmt):
    if fmt == "safetensors" and importlib.util.find_spec("safetensors") is None:
        pytest.skip("safetensors is not installed")
    import torch

    out = tmp_path / f"model.{fmt}"
    result = ckpt("convert", saved / f"stage{stage}", "--to", "fp32", "--tag", OLDER, "--out", out,
                     *(["--safetensors"] if fmt == "safetensors" else []))
    assert result.returncode == 0, result.stderr
    assert [p.name for p in tmp_path.iterdir()] == [out.name], "a temporary file was left behind"
    if fmt == "safetensors":
        from safetensors.torch import load_file

        got = load_file(out)
    else:
        got = torch.load(out)
    want = reference(saved, stage, OLDER)
    assert_same(got, want)
    assert not torch.equal(got["embed_tokens.weight"], reference(saved, stage, NEWEST)["embed_tokens.weight"])
    if stage == "fsdp2":   # DCP's shards, joined: the DTensors the live model had, gathered by torch
        return
    # at ZeRO-2 on fp32 DeepSpeed's own model file holds the same weights, gathered
    module = torch.load(saved / f"stage{stage}" / OLDER / MODEL, weights_only=False)["module"]
    assert_same({k: v for k, v in module.items()}, want)


def test_universal_verifies_and_loads_on_one_rank(saved, ckpt):
    result = ckpt("convert", saved / "stage2", "--to", "universal")
    assert result.returncode == 0, result.stderr
    out = saved / "stage2-universal"
    assert (out / "latest").read_text() == NEWEST and (out / "latest_universal").read_text() == NEWEST
    manifest = json.loads((out / NEWEST / "manifest.json").read_text())
    assert manifest["kind"] == "universal" and manifest["step"] == 4 and manifest["world_size"] == 2
    assert manifest["source"]["tag"] == NEWEST and manifest["source"]["kind"] == "full"
    assert "zero/embed_tokens.weight/fp32.pt" in manifest["files"] and "rank_1_rng.pt" in manifest["files"]
    assert not any((out / ".partial").iterdir())
    result = ckpt("verify", out)
    assert result.returncode == 0 and "1 of 1 checkpoint(s) whole" in result.stdout, result.stdout
    assert "universal" in row(ckpt("ls", out).stdout, NEWEST)

    # 2 ranks' ZeRO-2 shards, merged, load on 1 rank with the weights of step 4 exactly
    loaded = json.loads(torchrun(1, "--load-universal", out, 2, saved / "stage2-reference" / f"{NEWEST}.pt")
                        .stdout.strip().splitlines()[-1])
    assert loaded["step"] == 4 and loaded["tag"] == NEWEST and loaded["keys"] and loaded["max_diff"] == 0.0
    assert loaded["next_loss"] == loaded["next_loss"]  # not NaN: the optimizer state loaded


def test_universal_refuses_stage_0(saved, tmp_path, quick_cli):
    # refused before converting: checked in this process
    one_line_error(quick_cli("ckpt", "convert", saved / "stage0", "--to", "universal", "--out", tmp_path / "u"),
                   "is a ZeRO stage-0 checkpoint")
    assert not (tmp_path / "u").exists()
    one_line_error(quick_cli("ckpt", "convert", saved / "stagefsdp2", "--to", "universal", "--out", tmp_path / "u"),
                   "is a torch.distributed.checkpoint (DCP) checkpoint: it loads at any world size as it is")
    assert not (tmp_path / "u").exists()


def test_delta_checkpoint_is_rebuilt_before_converting(saved, tmp_path, ckpt):
    """Step 4 stored as its XOR difference from step 2, as the incremental strategy writes it."""
    import torch

    from plscale.ckpt import delta, store

    root = tmp_path / "ck"
    shutil.copytree(saved / "stage2", root)
    meta = {k: v for k, v in store.read_manifest(root / NEWEST).items() if k not in ("format", "tag", "created",
                                                                                       "files")}
    snapshot = tmp_path / "snapshot"  # as plscale.strategies.checkpoint.incremental does it
    os.replace(root / NEWEST, snapshot)
    originals = store.file_table(snapshot)
    delta.encode_into(snapshot, root / OLDER, store.partial_dir(root, NEWEST), list(originals))
    store.commit(root, NEWEST, {**meta, "kind": "delta", "base": OLDER, "restores": originals})
    shutil.rmtree(snapshot)
    assert (root / NEWEST / (MODEL + delta.SUFFIX)).is_file() and not (root / NEWEST / MODEL).exists()
    assert f"delta of {OLDER}" in row(ckpt("ls", root).stdout, NEWEST)

    result = ckpt("convert", root, "--to", "fp32", "--out", tmp_path / "model.pt")
    assert result.returncode == 0, result.stderr
    assert_same(torch.load(tmp_path / "model.pt"), reference(saved, 2, NEWEST))
    result = ckpt("convert", root, "--to", "universal", "--out", tmp_path / "uni")
    assert result.returncode == 0, result.stderr
    assert store.problems(tmp_path / "uni" / NEWEST) == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ck", "model.pt", "uni"]
    assert not [p for p in (root / ".partial").iterdir() if p.is_dir()], "the rebuilt files were left behind"


def test_a_failed_conversion_leaves_the_earlier_output(saved, tmp_path, monkeypatch):
    import torch

    from plscale.ckpt import convert
    from plscale.errors import UserError

    good = tmp_path / "model.pt"
    good.write_bytes(b"an earlier good conversion")

    def half_then_full(obj, path, *args, **kwargs):
        Path(path).write_bytes(b"half a state dict")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(torch, "save", half_then_full)
    with pytest.raises(UserError, match="Could not write .*model.pt \\(No space left on device\\)"):
        convert.to_fp32(saved / "stage2", out_file=good)
    assert good.read_bytes() == b"an earlier good conversion"
    assert [p.name for p in tmp_path.iterdir()] == ["model.pt"], "the half file was left behind"

    monkeypatch.setattr(convert, "CONVERTER", "plscale.no_such_module")
    with pytest.raises(convert.ConvertFailed, match="ds_to_universal failed on .*No module named"):
        convert.to_universal(saved / "stage2", out=tmp_path / "new")
    assert not (tmp_path / "new").exists()
    earlier = tmp_path / "earlier"
    (earlier / OLDER).mkdir(parents=True)
    (earlier / "latest").write_text(OLDER)
    with pytest.raises(convert.ConvertFailed):
        convert.to_universal(saved / "stage2", out=earlier)
    assert (earlier / "latest").read_text() == OLDER and sorted(p.name for p in earlier.iterdir()) == \
        [".partial", "latest", OLDER] and not any((earlier / ".partial").iterdir())


@pytest.mark.parametrize("args, message", [
    (["ls", "/nonexistent/ck"], "/nonexistent/ck does not exist"),
    (["ls", "{empty}"], "holds no checkpoints"),
    (["verify", "{empty}"], "has no `latest` file"),
    (["verify", "{root}/latest"], "is a file"),
    (["verify", "{root}", "--tag", "step9"], "No checkpoint 'step9'"),
    (["convert", "{root}", "--to", "onnx"], "--to 'onnx': use universal or fp32"),
    (["convert", "{root}", "--to", "fp23"], "Did you mean: fp32?"),
    (["convert", "{root}", "--to", "fp32", "--tag", "step000003"], "No checkpoint 'step000003'"),
    (["convert", "{root}", "--to", "universal", "--safetensors"], "--safetensors is for --to fp32"),
    (["convert", "{root}", "--to", "fp32", "--out", "/nonexistent/dir/x.pt"], "folder /nonexistent/dir does not"),
    (["convert", "{root}", "--to", "fp32", "--out", "{empty}"], "is a folder"),
    (["convert", "{empty}", "--to", "fp32"], "has no `latest` file"),
    (["convert", "{root}", "--to", "universal", "--out", "{root}/.."], "is not a checkpoint folder"),
    (["convert", "{root}", "--to", "universal", "--out", "{root}"], "is the checkpoint folder itself"),
])
def test_bad_input_is_one_line_and_exit_2(saved, quick_cli, tmp_path, args, message):
    (tmp_path / "empty").mkdir()
    filled = [a.format(root=saved / "stage2", empty=tmp_path / "empty") for a in args]
    one_line_error(quick_cli("ckpt", *filled, env={"COLUMNS": "400"}), message)
