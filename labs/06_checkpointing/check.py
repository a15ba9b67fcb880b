"""Host-side checks of the checkpointing lab's settings (no torch): fail in one line before launch."""

from pathlib import Path

from plscale.ckpt import STRATEGIES, store
from plscale.cli.hf_model import check_training
from plscale.errors import UserError, did_you_mean
from plscale.predict.presets import preset


def check(settings: dict, topology) -> None:
    steps, C, F = settings["train"]["steps"], settings["ckpt"], settings["fault"]
    if settings["model"]["hf"] is not None:   # a Hugging Face model's folder: its config, tokenizer, and that it fits
        config = check_training(settings, topology)
    else:
        config = preset(settings["model"]["preset"])
        if not 8 <= settings["model"]["seq"] <= config.max_seq:
            raise UserError(f"model.seq {settings['model']['seq']}: use 8 to {config.max_seq}.")
    if not 0 <= settings["model"]["dropout"] < 1:
        raise UserError(f"model.dropout {settings['model']['dropout']}: use 0 (none) to below 1, e.g. 0.1.")
    if steps < 1:
        raise UserError(f"train.steps {steps}: use 1 or more.")
    if C["strategy"] not in STRATEGIES:
        raise UserError(f"Unknown ckpt.strategy {C['strategy']!r}: use one of {', '.join(STRATEGIES)}."
                        f"{did_you_mean(C['strategy'], STRATEGIES)}")
    for key in ("every", "full_every", "durable_every", "keep"):
        if not isinstance(C[key], int) or C[key] < 1:
            raise UserError(f"ckpt.{key} {C[key]!r}: use a whole number of 1 or more.")
    key = {"incremental": "full_every", "multilevel": "durable_every"}.get(C["strategy"])
    if key and C[key] % C["every"]:
        raise UserError(f"ckpt.{key} {C[key]} is not a multiple of ckpt.every {C['every']}: "
                        f"use {C['every'] * max(1, round(C[key] / C['every']))}.")
    if C["mtbf_hours"] <= 0:
        raise UserError(f"ckpt.mtbf_hours {C['mtbf_hours']}: give the mean time between failures, e.g. 24.")
    if F["step"] >= steps:
        raise UserError(f"fault.step {F['step']} is beyond the run's {steps} steps (0 to {steps - 1}): "
                        f"pick a step inside the run, or -1 for no fault.")
    if F["step"] >= 0 and not 0 <= F["rank"] < topology.world_size:
        raise UserError(f"fault.rank {F['rank']}: this run has ranks 0 to {topology.world_size - 1}.")
    if settings["engine"] not in ("deepspeed", "fsdp2"):
        raise UserError(f"engine {settings['engine']!r}: use deepspeed (ZeRO, DeepSpeed's checkpoints) or fsdp2 "
                        f"(FSDP2, torch.distributed.checkpoint).")
    universal = settings["ds"].get("load_universal", False)
    if settings["engine"] == "fsdp2" and (universal or settings["ds"]["precision"] != "fp32"):
        raise UserError("engine fsdp2 runs fp32 and loads its DCP checkpoints at any world size as they are: drop "
                        "ds.load_universal and keep ds.precision=fp32.")
    if universal and not C["resume"]:
        raise UserError("ds.load_universal loads a universal checkpoint: add --set ckpt.resume=FOLDER, or drop it.")
    if universal and settings["ds"]["stage"] == 0:
        raise UserError("Universal checkpoints load at ZeRO stages 1-3: use --set ds.stage=1 (or 2, 3). A ZeRO-0 "
                        "checkpoint needs no conversion: it loads at any rank count as it is.")
    if C["dir"]:
        store.check_writable(Path(C["dir"]))
        if store.latest_tag(Path(C["dir"])):  # a folder with checkpoints is resumed from: it must fit
            _check_resume(Path(C["dir"]), config, settings, topology.world_size, "ckpt.dir")
    if C["resume"]:
        _check_resume(Path(C["resume"]), config, settings, topology.world_size)


def _check_resume(root: Path, config, settings: dict, world: int, key: str = "ckpt.resume") -> None:
    """The checkpoint to resume from must be of this model; another stage or world size only
    through a universal checkpoint. (The ranks verify the checksums; here the manifests only.)"""
    if (root / "checkpoints" / store.LATEST).is_file() and not (root / store.LATEST).is_file():
        raise UserError(f"{key} {root} is a run directory: give its checkpoint folder, {root / 'checkpoints'}.")
    entries = [e for e in store.open_root(root, verify=False) if e.manifest]
    if not entries:
        raise UserError(f"{root} holds no checkpoint with a manifest: list it with `plscale ckpt ls {root}`.")
    m = entries[0].manifest
    model, engine = m.get("model", {}), m.get("engine", "deepspeed")
    if engine != settings["engine"]:
        raise UserError(f"{root} holds {'a DCP (FSDP2)' if engine == 'fsdp2' else 'a DeepSpeed'} checkpoint; this run's "
                        f"engine is {settings['engine']}: add --set engine={engine}.")
    kind = "hf" if settings["model"]["hf"] else settings["model"]["preset"]   # the ranks' fingerprint (train.py)
    if (model.get("preset", kind), model.get("hidden"), model.get("layers")) != (kind, config.hidden, config.layers):
        mine = settings["model"]["hf"] or settings["model"]["preset"]
        raise UserError(f"{root} holds a checkpoint of another model ({model.get('preset')}, hidden "
                        f"{model.get('hidden')}, {model.get('layers')} layers; this run: {mine!r}, hidden "
                        f"{config.hidden}, {config.layers} layers): resume with the model it was saved from.")
    if engine == "fsdp2":   # DCP: any world size, no stages
        return
    universal = settings["ds"].get("load_universal", False)
    if key == "ckpt.dir" and (m.get("stage"), m.get("world_size")) != (settings["ds"]["stage"], world):
        raise UserError(f"ckpt.dir {root} already holds checkpoints of ZeRO-{m.get('stage')} on {m.get('world_size')} "
                        f"ranks, which this run would resume from: pick an empty folder.")
    if m.get("kind") == "universal" and not universal:
        raise UserError(f"{root} is a universal checkpoint: add --set ds.load_universal=true.")
    if m.get("kind") != "universal":
        if universal:
            raise UserError(f"{root} is not a universal checkpoint: convert it first with "
                            f"`plscale ckpt convert {root} --to universal`, or drop ds.load_universal.")
        if m.get("stage") != settings["ds"]["stage"]:
            raise UserError(f"{root} was saved at ZeRO-{m.get('stage')}, this run is ZeRO-{settings['ds']['stage']}: "
                            f"use --set ds.stage={m.get('stage')}, or convert it with "
                            f"`plscale ckpt convert {root} --to universal` and add --set ds.load_universal=true.")
        if m.get("world_size") != world:
            raise UserError(f"{root} was saved by {m.get('world_size')} ranks, this run has {world}: convert it with "
                            f"`plscale ckpt convert {root} --to universal`, then resume from the converted folder "
                            f"with --set ds.load_universal=true.")
