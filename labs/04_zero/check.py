"""Host-side checks of the ZeRO lab's settings (no torch): fail in one line before launch."""

import os
import shutil

from plscale.cli.hf_model import check_training
from plscale.errors import UserError
from plscale.predict.presets import preset


def check(settings: dict, topology) -> None:
    if settings["model"]["hf"] is not None:   # a Hugging Face model's folder: its config, tokenizer, and that it fits
        check_training(settings, topology)
    else:
        config = preset(settings["model"]["preset"])  # an unknown preset names the nearest
        seq = settings["model"]["seq"]
        if not 8 <= seq <= config.max_seq:
            raise UserError(f"model.seq {seq}: use 8 to {config.max_seq} for preset {settings['model']['preset']!r}.")
    if settings["train"]["steps"] < 1:
        raise UserError(f"train.steps {settings['train']['steps']}: use 1 or more.")
    if settings["memory"]["census_step"] < 0:
        raise UserError(f"memory.census_step {settings['memory']['census_step']}: use 0 or more (the step whose "
                        f"first micro-batch is counted; 1 has optimizer states).")
    for key, example in (("tolerance", 0.05), ("term_tolerance", 0.02)):
        if not 0 < settings["memory"][key] < 1:
            raise UserError(f"memory.{key} {settings['memory'][key]}: use a fraction such as {example}.")
    if settings["data"]["val_blocks"] < 1:
        raise UserError(f"data.val_blocks {settings['data']['val_blocks']}: use 1 or more.")
    fsdp, ds = settings["fsdp"], settings["ds"]
    if settings["engine"] not in ("deepspeed", "fsdp2"):
        raise UserError(f"engine {settings['engine']!r}: use deepspeed (zero0 .. zero3) or fsdp2 (the fsdp2 variants).")
    if settings["engine"] == "fsdp2":
        if ds.get("offload_optimizer") or ds.get("offload_param"):
            raise UserError("ds.offload_optimizer / ds.offload_param: the FSDP2 variants do not offload here; "
                            "run zero2-offload or zero3-offload for ZeRO-Offload.")
        if ds.get("precision", "fp32") not in ("fp32", "bf16"):
            raise UserError(f"ds.precision {ds['precision']}: FSDP2's variants run fp32 or bf16 (MixedPrecisionPolicy: "
                            f"bf16 compute, fp32 shards and reduction); fp16 needs a loss scaler FSDP2 does not bring.")
    if not isinstance(fsdp["reshard"], bool):
        raise UserError(f"fsdp.reshard {fsdp['reshard']}: use true (free after forward, ZeRO-3's schedule) or "
                        f"false (keep until the backward).")
    if not isinstance(fsdp["compile"], bool):
        raise UserError(f"fsdp.compile {fsdp['compile']!r}: use true or false.")
    if fsdp["compile"] and settings["engine"] != "fsdp2":
        raise UserError("fsdp.compile compiles the FSDP2 variants' layers: run fsdp2 (or fsdp2-no-reshard, hsdp, "
                        "fsdp2-bf16) with it, or drop it.")
    compilers = [c for c in (os.environ.get("CXX"), "g++", "clang++") if c]
    if fsdp["compile"] and topology.device == "cpu" and not any(shutil.which(c) for c in compilers):
        raise UserError("fsdp.compile on CPU: torch.compile's inductor builds C++ and no compiler is on PATH: install "
                        "one (apt-get install g++; on macOS xcode-select --install), set CXX, or drop fsdp.compile.")
    if fsdp["parity_steps"] < 1:
        raise UserError(f"fsdp.parity_steps {fsdp['parity_steps']}: use 1 or more.")
    replicate, world = fsdp["replicate"], topology.world_size
    if settings["engine"] != "fsdp2" and (replicate != 1 or fsdp["reshard"] is not True):
        raise UserError("fsdp.replicate and fsdp.reshard set the FSDP2 variants (fsdp2, fsdp2-no-reshard, hsdp, "
                        "fsdp2-bf16); the ZeRO variants' sharding is ds.stage.")
    if not isinstance(replicate, int) or replicate < 1 or world % replicate or (replicate > 1 and world == replicate):
        raise UserError(f"fsdp.replicate {replicate}: HSDP's mesh is replicate x shard over {world} ranks, so use "
                        f"a divisor of {world} below it (or 1: shard over all), or run more ranks (--gpus).")
