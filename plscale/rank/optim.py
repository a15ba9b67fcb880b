"""The optimizer a run's DeepSpeed config describes, built by torch for code that steps
without a DeepSpeed engine (the pipeline engines, the tensor-parallel paths, the labs'
dense reference models), so every engine steps alike:

    opt = optimizer(model.parameters(), ctx.ds_config)
"""

import torch


def optimizer(params, ds_config: dict) -> torch.optim.Optimizer:
    """torch's AdamW (or Adam) with the hyperparameters of the DeepSpeed config: what DeepSpeed
    builds for `"torch_adam": true`."""
    kind = ds_config["optimizer"]["type"]
    p = ds_config["optimizer"]["params"]
    cls = torch.optim.AdamW if kind == "AdamW" else torch.optim.Adam
    return cls(params, lr=p["lr"], betas=tuple(p["betas"]), eps=p["eps"], weight_decay=p["weight_decay"])
