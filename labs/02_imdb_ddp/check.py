"""Host-side checks of the IMDB lab's settings (no torch): fail in one line before launch.
The ranks do not check again; under a plain launcher each rank runs these same checks."""

from plscale.errors import UserError

ENGINES = ("ddp", "deepspeed", "accelerate")


def check(settings: dict, topology) -> None:
    data, model, train, ds = settings["data"], settings["model"], settings["train"], settings["ds"]
    engine = train["engine"]
    if engine not in ENGINES:
        raise UserError(f"train.engine={engine!r}: use ddp, deepspeed or accelerate.")
    if engine != "ddp" and not ds["comms_logger"]:
        raise UserError(f"train.engine={engine} counts reductions with DeepSpeed's comms logger: "
                        f"set ds.comms_logger=true.")
    if model["init"] not in ("scratch", "pretrained"):
        raise UserError(f"model.init={model['init']!r}: use scratch (a config, no weights) or pretrained (the hub).")
    if data["max_len"] < 1:
        raise UserError(f"data.max_len={data['max_len']}: a review needs at least 1 token; "
                        f"try --set data.max_len=128.")
    if model["heads"] < 1 or model["dim"] % model["heads"]:
        raise UserError(f"model.dim={model['dim']} is not divisible by model.heads={model['heads']}: "
                        f"pick dim = k * heads.")
    _length(train)
    _evaluation(data, train)
    _samples(data, ds, topology.world_size)


def _length(train: dict) -> None:
    if train["steps"] < 0:
        raise UserError(f"train.steps={train['steps']}: use a number of steps, or 0 to train whole epochs "
                        f"(train.epochs).")
    if train["steps"] == 0 and train["epochs"] < 1:
        raise UserError(f"train.epochs={train['epochs']} with train.steps=0 trains nothing: use train.epochs=1 "
                        f"or more, or --steps N.")
    if train["grad_tolerance"] <= 0:
        raise UserError(f"train.grad_tolerance={train['grad_tolerance']}: the gradient check needs a positive "
                        f"tolerance; try 1e-6.")


def _evaluation(data: dict, train: dict) -> None:
    if train["eval_every"] < 0:
        raise UserError(f"train.eval_every={train['eval_every']}: use a number of steps between quick evaluations, "
                        f"or 0 for none.")
    if train["eval_batch"] < 1:
        raise UserError(f"train.eval_batch={train['eval_batch']}: evaluation needs batches of 1 review or more; "
                        f"try 256.")
    if data["eval_samples"] < 0:
        raise UserError(f"data.eval_samples={data['eval_samples']}: use a number of test reviews for quick "
                        f"evaluations, or 0 for all of them.")
    if not 0 < train["target_accuracy"] <= 1:
        raise UserError(f"train.target_accuracy={train['target_accuracy']}: a fraction of reviews right, "
                        f"e.g. 0.8 for 80%.")


def _samples(data: dict, ds: dict, world: int) -> None:
    per_step = ds["micro_batch"] * ds["grad_accum"]
    for split in ("train", "test"):
        n = data[f"{split}_samples"]
        if n < 0:
            raise UserError(f"data.{split}_samples={n}: use a number of reviews, or 0 for all of them.")
        if 0 < n < world:
            raise UserError(f"data.{split}_samples={n} cannot be shared by {world} ranks (each rank needs at least "
                            f"one): use more samples or fewer ranks (--gpus).")
    n = data["train_samples"]
    if n and -(-n // world) < per_step:
        raise UserError(f"data.train_samples={n} gives {-(-n // world)} samples per rank, fewer than one step's "
                        f"ds.micro_batch x ds.grad_accum = {per_step}: use more samples or a smaller batch.")
