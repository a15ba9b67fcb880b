"""A DeepSpeed engine for one precision of lab 09, fp16's two paths handled in one place
(loss_scaling.py says which runs, and why).

    engine, log, scaler = engine.initialize(model, spec, build(spec))
"""

import deepspeed

from plscale.strategies.precision import loss_scaling


def initialize(model, spec, ds_config: dict):
    """(the engine, its ScalerLog, the settings torch's GradScaler runs with: None without one)."""
    loss_scaling.forget_autocast(ds_config)  # what an earlier torch_autocast run left in DeepSpeed
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=ds_config)
    loss_scaling.configure(engine, spec)     # the autocast path: a GradScaler as fp16's settings say
    return engine, loss_scaling.ScalerLog(engine), loss_scaling.grad_scaler_settings(engine)
