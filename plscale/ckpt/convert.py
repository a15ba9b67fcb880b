"""Turn a checkpoint into what another run, or another program, can load.

    to_universal(root, tag)          # <root>-universal/<tag>/: DeepSpeed's universal format
    to_fp32(root, tag, "model.pt")   # one consolidated fp32 state dict (or .safetensors)

A ZeRO checkpoint is cut to the run that wrote it: each rank's file holds its 1/N slice
of the flat fp32 master weights and Adam's moments, so it loads only at the same
data-parallel size. DeepSpeed's `ds_to_universal` merges the slices back into one folder
per parameter (zero/<name>/fp32.pt, exp_avg.pt, exp_avg_sq.pt); a run of any size then
loads it with `"checkpoint": {"load_universal": true}` (DSSpec(load_universal=True)).
`zero_to_fp32` does the same for the weights alone, exactly (max difference 0.0).

Stage 0 has nothing to merge: mp_rank_00_model_states.pt holds the whole model and its
optimizer, loads at any rank count as it is, and its `module` is the state dict.

Every conversion checks the source against its manifest first, rebuilds a delta checkpoint
into a scratch folder, and writes under a temporary name: a failed conversion leaves no
half output, and an earlier good output stays as it was.
"""

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from plscale.ckpt import store
from plscale.errors import UserError, did_you_mean
from plscale.files import write_atomic

CONVERTER = "deepspeed.checkpoint.ds_to_universal"
MODEL_STATES = "mp_rank_00_model_states.pt"
DCP_METADATA = ".metadata"   # torch.distributed.checkpoint's index of every tensor's shards
NOT_COPIED = ("format", "tag", "created", "files", "restores", "base")  # manifest keys the output gets anew


class ConvertFailed(UserError):
    """DeepSpeed's converter failed on a checkpoint that verified: not the user's input."""

    exit_code = 1


def pick(root: Path, tag: str | None = None) -> store.Entry:
    """The checkpoint to convert (`latest` by default), verified against its manifest."""
    root = Path(root)
    if not root.is_dir() or store.latest_tag(root) is None:
        store.open_root(root)  # raises its one-line error for exactly these two cases
    tag = tag or store.latest_tag(root)
    found = {e.tag: e for e in store.entries(root, verify=False)}
    if tag not in found:
        raise UserError(f"No checkpoint {tag!r} in {root}.{did_you_mean(tag, found)} "
                        f"It has: {', '.join(sorted(found)) or 'none'}.")
    entry = found[tag]
    entry.problems = store.problems(entry.path)
    if entry.problems:
        more = f" (and {len(entry.problems) - 1} more)" if len(entry.problems) > 1 else ""
        raise UserError(f"{root}/{tag} is damaged, not converted: {entry.problems[0]}{more}. "
                        f"See `plscale ckpt verify {root}`; convert an earlier one with --tag.")
    return entry


def file_names(entry: store.Entry) -> list[str]:
    """The checkpoint's own files (a delta's: those it stands for)."""
    return list(entry.manifest.get("restores") or entry.manifest["files"])


def is_zero(names: list[str]) -> bool:
    """Sharded optimizer files (ZeRO 1-3, or bf16's ZeRO-1-like optimizer at stage 0)."""
    return any("zero_pp_rank_" in Path(n).name and n.endswith("_optim_states.pt") for n in names)


def full_files(entry: store.Entry, scratch: Path) -> Path:
    """A folder holding the checkpoint's whole files: itself, or a delta rebuilt into scratch/<tag>."""
    if entry.manifest.get("kind") != "delta":
        return entry.path
    from plscale.ckpt import delta

    return delta.rebuild(entry.path, Path(scratch) / entry.tag)


def _cpu_unless_gpu() -> None:
    """Without GPUs, tell DeepSpeed (here and in the converter's process) rather than have it guess."""
    from plscale.hardware import cuda_gpus

    if "DS_ACCELERATOR" not in os.environ and not cuda_gpus():
        os.environ["DS_ACCELERATOR"] = "cpu"


def to_universal(root: Path, tag: str | None = None, out: Path | None = None, workers: int = 1) -> Path:
    """Convert one ZeRO checkpoint to DeepSpeed's universal format, sealed with a manifest.

    Writes <out>/<tag>/ (out defaults to the sibling folder <root>-universal) and points
    both `latest` (plscale) and `latest_universal` (DeepSpeed with load_universal) at it.
    """
    root = Path(root)
    entry = pick(root, tag)
    if DCP_METADATA in file_names(entry):
        raise UserError(f"{root}/{entry.tag} is a torch.distributed.checkpoint (DCP) checkpoint: it loads at any "
                        f"world size as it is (--set ckpt.resume={root}); for the weights alone use --to fp32.")
    if not is_zero(file_names(entry)):
        raise UserError(f"{root}/{entry.tag} is a ZeRO stage-0 checkpoint: a universal checkpoint merges ZeRO "
                        f"1-3's optimizer shards, and stage 0 has none. It already loads at any rank count as it "
                        f"is; for the weights alone use --to fp32.")
    out = Path(out) if out else root.with_name(root.name + "-universal")
    if out.resolve() == root.resolve():
        raise UserError(f"--out {out} is the checkpoint folder itself: give another folder.")
    if out.exists() and (not out.is_dir() or any(out.iterdir()) and store.latest_tag(out) is None):
        raise UserError(f"--out {out} is not a checkpoint folder: give a new or empty folder, or an earlier "
                        f"conversion's.")
    staging, scratch = store.partial_dir(out, entry.tag), out / store.PARTIAL / f"source-{entry.tag}"
    new_out = not out.exists()
    store.discard_partial(out, entry.tag)
    staging.parent.mkdir(parents=True, exist_ok=True)
    _cpu_unless_gpu()
    try:
        source = full_files(entry, scratch)
        command = [sys.executable, "-m", CONVERTER, "--input_folder", str(source), "--output_folder", str(staging),
                   "--inject_missing_state", "--num_extract_workers", str(workers),
                   "--num_merge_workers", str(workers)]
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        if done.returncode:
            lines = [line for line in done.stderr.splitlines() if line.strip()] or ["(no output)"]
            raise ConvertFailed(f"DeepSpeed's ds_to_universal failed on {root}/{entry.tag}: {lines[-1].strip()}")
        for rng in source.glob("rank_*_rng.pt"):  # an exact resume at the same world size needs them
            shutil.copy2(rng, staging / rng.name)
        meta = {k: v for k, v in entry.manifest.items() if k not in NOT_COPIED}
        meta.update(kind="universal", source={"root": str(root.resolve()), "tag": entry.tag,
                                              "kind": entry.manifest.get("kind", "full")})
        final = store.commit(out, entry.tag, meta)
        write_atomic(out / "latest_universal", entry.tag)
    except BaseException:
        if new_out:
            shutil.rmtree(out, ignore_errors=True)
        raise
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
        store.discard_partial(out, entry.tag)
        (out / store.PARTIAL / "latest_universal").unlink(missing_ok=True)  # ds_to_universal writes it there
    return final


def state_dict(folder: Path, names: list[str]) -> dict:
    """name -> fp32 tensor for the whole model, from the checkpoint folder `folder`."""
    _cpu_unless_gpu()
    import contextlib
    import io

    import torch

    folder = Path(folder)
    if DCP_METADATA in names:   # every tensor's shards, read and joined whole on one process, no ranks
        from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

        with tempfile.TemporaryDirectory(prefix=".dcp-") as scratch:
            dcp_to_torch_save(folder, Path(scratch) / "whole.pt")
            state = torch.load(Path(scratch) / "whole.pt", weights_only=False)
        return {k: v.float() for k, v in state["model"].items()}
    if is_zero(names):
        from deepspeed.utils import zero_to_fp32

        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):  # progress
            return zero_to_fp32.get_fp32_state_dict_from_zero_checkpoint(str(folder.parent), tag=folder.name)
    if MODEL_STATES not in names:
        raise UserError(f"{folder} has no {MODEL_STATES} and no ZeRO files: not a checkpoint plscale can convert "
                        f"(a pipeline checkpoint's layer_* files are not supported).")
    module = torch.load(folder / MODEL_STATES, map_location="cpu", weights_only=False)["module"]
    # fp32 training stores fp32 here, returned as they are; fp16 at stage 0 keeps its fp32 master
    # copy in the optimizer state, so what comes out then is the fp16 weights widened.
    return {k: v.float() if v.is_floating_point() else v for k, v in module.items()}


def _unshared(tensors: dict) -> dict:
    """safetensors refuses tensors that share memory (a tied embedding): give each its own copy."""
    seen, out = set(), {}
    for name, t in tensors.items():
        key = (t.untyped_storage().data_ptr(), t.storage_offset())
        out[name] = t.clone().contiguous() if key in seen else t.contiguous()
        seen.add(key)
    return out


def to_fp32(root: Path, tag: str | None = None, out_file: Path | None = None, safetensors: bool = False) -> Path:
    """Write one consolidated fp32 state dict of a checkpoint: torch.save, or safetensors.

    out_file defaults to <root>-<tag>-fp32.pt (.safetensors) beside the checkpoint folder.
    """
    root = Path(root)
    entry = pick(root, tag)
    suffix = ".safetensors" if safetensors else ".pt"
    out_file = Path(out_file) if out_file else root.with_name(f"{root.name}-{entry.tag}-fp32{suffix}")
    if out_file.is_dir():
        raise UserError(f"--out {out_file} is a folder: give a file in it, e.g. {out_file / ('model' + suffix)}.")
    if not out_file.parent.is_dir():
        raise UserError(f"--out {out_file}: folder {out_file.parent} does not exist: create it or pick another path.")
    if safetensors:
        try:
            from safetensors.torch import save_file
        except ImportError:
            raise UserError("--safetensors needs the safetensors package: pip install safetensors.") from None
    with tempfile.TemporaryDirectory(prefix=f".{out_file.name}.", dir=out_file.parent) as scratch:
        tensors = state_dict(full_files(entry, Path(scratch)), file_names(entry))
        partial = Path(scratch) / out_file.name
        try:
            if safetensors:
                meta = {"format": "pt", "source": f"{root.resolve()}/{entry.tag}", "step": str(entry.step)}
                save_file(_unshared(tensors), str(partial), metadata=meta)
            else:
                import torch

                torch.save(tensors, partial)
        except OSError as exc:
            raise UserError(f"Could not write {out_file} ({exc.strerror or exc}): free some space or pick another "
                            f"--out. Nothing was replaced.") from None
        os.replace(partial, out_file)
    return out_file

