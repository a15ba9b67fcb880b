"""Activation recomputation on plscale's Llama: keep less in the forward, rebuild it in backward.

The backward of a layer needs what its forward computed. Normally autograd keeps all of it
from the forward until the backward uses it; recomputation keeps only a region's inputs and
runs the region's forward again inside the backward, just before its backward needs it:

    none       keep everything (each layer's norms, projections, attention core, MLP)
    selective  recompute only the attention core softmax(q k^T / sqrt(d)) v: keep q, k, v and
               drop the heads x s x s probabilities, cheap to rebuild and large (Korthikanti
               et al., 2022: Megatron's selective recomputation)
    full       recompute every layer (torch.utils.checkpoint): keep each layer's input, one
               s x b x h tensor, and pay about one more forward per step
    deepspeed  the same as full through DeepSpeed's activation checkpointing API
               (deepspeed.checkpointing.checkpoint, configured from the run's DeepSpeed
               config); it keeps what full keeps, and its rerun runs on to the layer's output

The strategies and the layer-count rules are the memory model's (plscale.predict.activations:
STRATEGIES, check_recompute, recomputed_count), so what runs here is what is predicted.

`layers` = k recomputes only the first k layers (0: all; none takes 0). Every layer's forward and every
attention core run inside torch.profiler.record_function("layer i" / "core i"), so a
recomputation shows in a profile, and in plscale.rank.allocations' history, as a second run
of the same label inside the backward.

    model = recompute.apply(Llama(config), "selective")     # in place, before deepspeed.initialize
"""

from functools import partial

from torch.profiler import record_function
from torch.utils.checkpoint import checkpoint

from plscale.predict.errors import PredictionError
from plscale.predict.setup import check_recompute, recomputed_count


def _labelled(fn, label: str):
    def run(*args):
        with record_function(label):
            return fn(*args)
    return run


def _torch_checkpoint(fn, dropout: bool):
    # preserve_rng_state: keep the RNG state (5,056 bytes on CPU) so that a recomputed dropout
    # draws the forward's masks again; without dropout nothing draws from it
    return partial(checkpoint, fn, use_reentrant=False, preserve_rng_state=dropout)


def _deepspeed_checkpoint(fn):
    import deepspeed

    return partial(deepspeed.checkpointing.checkpoint, fn)


def apply(model, strategy: str, layers: int = 0, ds_config: dict | None = None):
    """Give each of the model's layers its labels and, for the chosen layers, the strategy's
    recomputation; in place, once per model. "deepspeed" needs the run's DeepSpeed config."""
    try:
        check_recompute(strategy, layers, len(model.layers))
    except PredictionError as exc:  # worded with this function's arguments
        raise exc.named({"recompute": "recompute strategy", "recompute_layers": "recompute layers"}) from None
    if getattr(model, "recompute", None):
        raise ValueError(f"recomputation already applied to this model: {model.recompute}")
    if strategy == "deepspeed":
        if ds_config is None:
            raise ValueError("recompute 'deepspeed' configures DeepSpeed's checkpointing from the run's DeepSpeed "
                             "config: pass it, apply(model, 'deepspeed', layers, ds_config)")
        import deepspeed

        deepspeed.checkpointing.configure(None, deepspeed_config=ds_config)
    chosen = range(recomputed_count(strategy, layers, len(model.layers)))
    dropout = model.config.dropout > 0
    for i, layer in enumerate(model.layers):
        core = _labelled(layer.self_attn.attend, f"core {i}")
        forward = _labelled(layer.forward, f"layer {i}")
        if i in chosen and strategy == "selective":
            core = _torch_checkpoint(core, dropout)
        elif i in chosen and strategy == "full":
            forward = _torch_checkpoint(forward, dropout)
        elif i in chosen and strategy == "deepspeed":
            forward = _deepspeed_checkpoint(forward)
        layer.self_attn.attend, layer.forward = core, forward  # instance attributes: state_dict unchanged
    model.recompute = (strategy, layers)
    return model


def measured_layers(history, n_layers: int) -> list[dict]:
    """Per layer, from plscale.rank.allocations' history of one step: the bytes its forward left
    allocated (`kept`), the region that ran again in the backward (`recomputed`: "layer", "core"
    or None) and the bytes that rerun still held when it ended (`rebuilt`)."""
    rows = []
    for i in range(n_layers):
        layer, core = f"layer {i}", f"core {i}"
        region = layer if history.reran(layer) else core if history.reran(core) else None
        rows.append({"layer": i, "kept": history.left_by(layer), "recomputed": region and region.split()[0],
                     "rebuilt": history.left_by(region, "backward") if region else 0})
    return rows


def reran(history) -> list[str]:
    """The layer and core labels that ran again in the backward of a recorded step."""
    return sorted({i.name for i in history.labels if i.name.startswith(("layer ", "core ")) and history.reran(i.name)})
