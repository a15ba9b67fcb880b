"""Host-side checks of the JAX lab's settings (no jax): fail in one line before launch.
topology.world_size is the number of devices of the one process."""

from plscale.dsconfig.valid import zero_settings
from plscale.errors import UserError, did_you_mean
from plscale.predict import sharding
from plscale.predict.presets import preset


def check(settings: dict, topology) -> None:
    if topology.entry == "collectives.py":
        numel = settings["collectives"]["numel"]
        if not isinstance(numel, int) or numel < 1:
            raise UserError(f"collectives.numel {numel!r}: use a whole number of elements per device, 1 or more.")
        return
    model, devices = settings["model"], topology.world_size
    config = preset(model["preset"])
    if not 8 <= model["seq"] <= config.max_seq:
        raise UserError(f"model.seq {model['seq']}: use 8 to {config.max_seq} for preset {model['preset']!r}.")
    layouts = settings["layouts"]
    if not isinstance(layouts, list) or not layouts:
        raise UserError(f"layouts {layouts!r}: give a list, e.g. --set 'layouts=[dp,fsdp]'.")
    for name in layouts:
        if name not in sharding.LAYOUTS:
            raise UserError(f"layouts: unknown layout {name!r}.{did_you_mean(str(name), sharding.LAYOUTS)} "
                            f"Use any of {', '.join(sharding.LAYOUTS)}.")
    for key in ("tolerance", "first_loss"):
        value = settings["parity"][key]
        if not isinstance(value, (int, float)) or not 0 < value < 1:
            raise UserError(f"parity.{key} {value!r}: give a relative tolerance between 0 and 1, e.g. 1e-4.")
    steps = settings["train"]["steps"]
    if not isinstance(steps, int) or steps < 2:
        raise UserError(f"train.steps {steps!r}: use a whole number of at least 2.")
    for name in layouts:
        sharding.mesh(name, devices, settings["mesh"]["tp"], settings["mesh"]["stages"])


def check_ds_config(config: dict, settings: dict, topology) -> None:
    """The run's DeepSpeed config, generated from settings.ds or a user's --ds-config: the lab
    reads Adam's hyperparameters and the micro batch from it, and refuses what it would ignore."""
    if topology.entry == "collectives.py":
        return
    zero = zero_settings(config)
    if zero["precision"] != "fp32" or (config.get("torch_autocast") or {}).get("enabled"):
        raise UserError("The JAX lab trains in fp32: drop the bf16/fp16/autocast section (ds.precision=fp32).")
    if zero["stage"] != 0 or zero["offload_optimizer"] or zero["offload_param"]:
        raise UserError("The JAX lab shards by layout, not by ZeRO stage: use ZeRO stage 0 without offload "
                        "(ds.stage=0; pick fsdp in layouts for ZeRO-3's sharding).")
    if config.get("gradient_clipping", 0) or config.get("gradient_accumulation_steps", 1) != 1:
        raise UserError("The JAX lab takes one micro-batch per step and does not clip gradients: set "
                        "gradient_clipping 0 and gradient_accumulation_steps 1 (ds.grad_clip=0, ds.grad_accum=1; "
                        "the pipeline splits its batch with pipeline.micro_batches).")
    kind = (config.get("optimizer") or {}).get("type")
    if kind not in ("Adam", "AdamW"):
        raise UserError(f"Optimizer {kind!r}: the JAX lab's optimizer is Adam or AdamW; give one in the config.")
    batch = config["train_micro_batch_size_per_gpu"] * topology.world_size
    model = preset(settings["model"]["preset"])
    for name in settings["layouts"]:
        mesh = sharding.mesh(name, topology.world_size, settings["mesh"]["tp"], settings["mesh"]["stages"])
        sharding.check(model, mesh, batch, settings["pipeline"]["micro_batches"])
