"""Host-side checks of the IMDB lab's settings (no torch): fail in one line before launch."""

from plscale.errors import UserError


def check(settings: dict, topology) -> None:
    data, model, train, ds = settings["data"], settings["model"], settings["train"], settings["ds"]
    if train["engine"] not in ("ddp", "deepspeed"):
        raise UserError(f"train.engine={train['engine']!r}: use ddp or deepspeed.")
    if model["init"] not in ("scratch", "pretrained"):
        raise UserError(f"model.init={model['init']!r}: use scratch (a config, no weights) or pretrained (the hub).")
    if data["max_len"] < 1:
        raise UserError(f"data.max_len={data['max_len']}: a review needs at least 1 token; "
                        f"try --set data.max_len=128.")
    if model["heads"] < 1 or model["dim"] % model["heads"]:
        raise UserError(f"model.dim={model['dim']} is not divisible by model.heads={model['heads']}: "
                        f"pick dim = k * heads.")
    world, per_step = topology.world_size, ds["micro_batch"] * ds["grad_accum"]
    for split in ("train", "test"):
        n = data[f"{split}_samples"]
        if 0 < n < world:
            raise UserError(f"data.{split}_samples={n} cannot be shared by {world} ranks (each rank needs at least "
                            f"one): use more samples or fewer ranks (--gpus).")
    n = data["train_samples"]
    if n and -(-n // world) < per_step:
        raise UserError(f"data.train_samples={n} gives {-(-n // world)} samples per rank, fewer than one step's "
                        f"ds.micro_batch x ds.grad_accum = {per_step}: use more samples or a smaller batch.")
