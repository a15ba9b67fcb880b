"""Host-side checks of the JAX lab's settings (no jax): fail in one line before launch.
topology.world_size is the number of devices of the one process."""

from plscale.errors import UserError, did_you_mean
from plscale.predict import sharding
from plscale.predict.presets import preset


def check(settings: dict, topology) -> None:
    if topology.entry == "collectives.py":
        numel = settings["collectives"]["numel"]
        if not isinstance(numel, int) or numel < 1:
            raise UserError(f"collectives.numel {numel!r}: use a whole number of elements per device, 1 or more.")
        return
    model, ds, devices = settings["model"], settings["ds"], topology.world_size
    config = preset(model["preset"])
    if not 8 <= model["seq"] <= config.max_seq:
        raise UserError(f"model.seq {model['seq']}: use 8 to {config.max_seq} for preset {model['preset']!r}.")
    layouts = settings["layouts"]
    if not isinstance(layouts, list) or not layouts:
        raise UserError(f"layouts {layouts!r}: give a list, e.g. layouts=[dp,fsdp].")
    for name in layouts:
        if name not in sharding.LAYOUTS:
            raise UserError(f"layouts: unknown layout {name!r}.{did_you_mean(str(name), sharding.LAYOUTS)} "
                            f"Use any of {', '.join(sharding.LAYOUTS)}.")
    if ds["precision"] != "fp32" or ds["grad_accum"] != 1:
        raise UserError("The JAX lab trains in fp32 with one micro-batch per step: keep ds.precision=fp32 and "
                        "ds.grad_accum=1 (the pipeline splits its batch with pipeline.micro_batches).")
    if ds["stage"] != 0 or ds["grad_clip"] != 0:
        raise UserError("The JAX lab shards by layout, not by ZeRO stage, and does not clip gradients: keep "
                        "ds.stage=0 and ds.grad_clip=0 (pick fsdp in layouts for ZeRO-3's sharding).")
    for key in ("tolerance", "first_loss"):
        value = settings["parity"][key]
        if not isinstance(value, (int, float)) or not 0 < value < 1:
            raise UserError(f"parity.{key} {value!r}: give a relative tolerance between 0 and 1, e.g. 1e-4.")
    steps = settings["train"]["steps"]
    if not isinstance(steps, int) or steps < 2:
        raise UserError(f"train.steps {steps!r}: use a whole number of at least 2.")
    batch = ds["micro_batch"] * devices
    for name in layouts:
        mesh = sharding.mesh(name, devices, settings["mesh"]["tp"], settings["mesh"]["stages"])
        sharding.check(config, mesh, batch, settings["pipeline"]["micro_batches"])
