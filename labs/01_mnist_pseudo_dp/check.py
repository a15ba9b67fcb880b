"""Checks of the MNIST lab's settings (no torch): fail in one line before launch."""

from plscale.errors import UserError

MAX_BATCH = 4096  # well inside the offline stand-in's 12,000 training images


def check(settings: dict, topology) -> None:
    train, model, ds = settings["train"], settings["model"], settings["ds"]
    for key in ("steps", "early_steps"):
        if train[key] < 1:
            raise UserError(f"train.{key} {train[key]}: use 1 or more.")
    for key in ("hidden", "layers"):
        if model[key] < 1:
            raise UserError(f"model.{key} {model[key]}: use 1 or more.")
    for key in ("grad_tolerance", "loss_tolerance"):
        if train[key] <= 0:
            raise UserError(f"train.{key} {train[key]}: use a positive tolerance such as 1e-5.")
    batch = ds["micro_batch"] * ds["grad_accum"] * topology.world_size
    if not 2 <= batch <= MAX_BATCH:
        raise UserError(f"Global batch {batch} (micro {ds['micro_batch']} x accumulation {ds['grad_accum']} x "
                        f"{topology.world_size} ranks): keep it from 2 to {MAX_BATCH}.")
