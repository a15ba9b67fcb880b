"""Four ways to lay one model over a mesh of devices, each said as PartitionSpecs: GSPMD
(XLA's partitioner) inserts the collectives that follow from them.

    dp        mesh ("data",)           params replicated; batch split: gradients all-reduced
    fsdp      mesh ("data",)           every param, gradient and Adam moment split over "data"
                                       on one dim (ZeRO-3): params all-gathered to use them,
                                       gradients reduce-scattered
    fsdp_tp   mesh ("data", "model")   Megatron over "model" (q, k, v, gate, up by columns,
                                       o and down by rows, the embedding by vocabulary; norms
                                       replicated), and the other dim of each over "data"
    pipeline  mesh ("stage", "data")   each stage its L / stages layers (pipeline.py, GPipe);
                                       embedding, norm and head replicated

A dim an axis does not divide is not split over it (replicated instead), so any mesh runs;
the lab's presets divide, and then fsdp_tp holds exactly what
plscale.predict.tensor_parallel.params_per_rank counts, / dp.

    mesh = mesh_for("fsdp_tp", jax.devices(), tp=2)
    params, state = place("fsdp_tp", mesh, params, opt.init(params))
    step = train_step("fsdp_tp", mesh, config, opt)
    params, state, loss = step(params, state, tokens, targets)
"""

import jax
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from plscale.jaxlab import model, pipeline
from plscale.jaxlab.adam import state_like
from plscale.predict import sharding
from plscale.predict.presets import ModelConfig

LAYOUTS = sharding.LAYOUTS
COLUMN = ("q", "k", "v", "gate", "up")      # [in, out]: split the outputs over "model"
ROW = ("o", "down")                         # [in, out]: split the inputs over "model"


def mesh_for(layout: str, devices, tp: int = 2, stages: int = 2) -> Mesh:
    """The layout's mesh over these devices (dp, fsdp: ("data",) of n; fsdp_tp: ("data", "model")
    of (n / tp, tp); pipeline: ("stage", "data") of (stages, n / stages))."""
    return device_mesh(sharding.mesh(layout, len(devices), tp, stages), devices)


def device_mesh(plan: sharding.Mesh, devices) -> Mesh:
    """The mesh plscale.predict.sharding planned, over these devices. Auto axes: GSPMD decides
    what the annotations leave open."""
    names, sizes = zip(*plan.axes)
    return Mesh(np.array(devices).reshape(sizes), names, axis_types=(AxisType.Auto,) * len(names))


def _fit(spec: P, shape, mesh: Mesh | None) -> P:
    """spec with every axis dropped from a dim its size does not divide (that dim replicated)."""
    if mesh is None:
        return spec
    fitted = []
    for dim, axis in zip(shape, spec):
        size = int(np.prod([mesh.shape[a] for a in (axis if isinstance(axis, tuple) else (axis,))])) if axis else 1
        fitted.append(axis if dim % size == 0 else None)
    return P(*fitted)


def _spec(layout: str, path: tuple) -> P:
    name, stacked = path[-1], path[0] == "layers"
    lead = (None,) if stacked else ()                      # the stacked layers' axis
    if layout == "dp":
        return P()
    if layout == "pipeline":
        return P("stage") if stacked else P()
    if layout == "fsdp":                                   # the first dim after the layers' axis
        return P(*lead, "data")
    if name in COLUMN:
        return P(None, "data", "model")
    if name in ROW:
        return P(None, "model", "data")
    if name == "embed":
        return P("model", "data")                          # vocab-parallel
    if name == "head":
        return P("data", "model")                          # [d, V]: vocab-parallel too
    return P(*lead, "data")                                # norms: replicated over "model"


def param_specs(layout: str, params, mesh: Mesh | None = None):
    """PartitionSpec of every param (Adam's moments take the same); with a mesh, dims an axis
    does not divide are replicated instead."""
    def one(path, leaf):
        keys = tuple(k.key for k in path)
        return _fit(_spec(layout, keys), leaf.shape, mesh)
    return jax.tree_util.tree_map_with_path(one, params)


# tokens and targets [B, s]: the batch split over "data" in every layout
BATCH = P("data", None)


def constrain_for(layout: str, mesh: Mesh):
    """The model's activation hook: the batch over "data" everywhere, and for fsdp_tp the
    heads and the SwiGLU width over "model" (Megatron's column-parallel outputs)."""
    specs = {"hidden": P("data", None, None), "heads": P("data", None, None, None), "ffn": P("data", None, None)}
    if layout == "fsdp_tp":
        specs.update(heads=P("data", None, "model", None), ffn=P("data", None, "model"))

    def constrain(name, x):
        return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, _fit(specs[name], x.shape, mesh)))
    return constrain


def _shapes(config: ModelConfig):
    return jax.eval_shape(lambda: model.init(config, jax.random.key(0)))


def shardings(layout: str, mesh: Mesh, params):
    """NamedShardings of (params, Adam's state, batch): the moments sharded as the params."""
    named = jax.tree.map(lambda s: NamedSharding(mesh, s), param_specs(layout, params, mesh))
    return named, state_like(named, NamedSharding(mesh, P())), NamedSharding(mesh, BATCH)


def place(layout: str, mesh: Mesh, params, state):
    """params and Adam's state put on the mesh in the layout's shardings."""
    p_sh, s_sh, _ = shardings(layout, mesh, params)
    return jax.device_put(params, p_sh), jax.device_put(state, s_sh)


def loss_fn(layout: str, mesh: Mesh, config: ModelConfig, micro_batches: int = 1):
    """loss(params, tokens, targets) of the layout (pipeline: GPipe with micro_batches)."""
    if layout == "pipeline":
        return lambda p, x, y: pipeline.pipeline_loss(p, x, y, config, mesh, micro_batches)
    constrain = constrain_for(layout, mesh)
    return lambda p, x, y: model.loss(p, x, y, config, constrain)


def train_step(layout: str, mesh: Mesh, config: ModelConfig, opt, micro_batches: int = 1,
               compiler_options: dict | None = None):
    """jit of step(params, state, tokens, targets) -> (params, state, loss): forward, backward
    and Adam, in and out in the layout's shardings (params and state donated: updated in place).
    compiler_options go to XLA (tests pass {"xla_backend_optimization_level": 0}: half the compile)."""
    p_sh, s_sh, b_sh = shardings(layout, mesh, _shapes(config))
    loss = loss_fn(layout, mesh, config, micro_batches)

    def step(params, state, tokens, targets):
        value, grads = jax.value_and_grad(loss)(params, tokens, targets)
        grads = jax.lax.with_sharding_constraint(grads, p_sh)    # each device keeps its params' shard
        params, state = opt.update(params, grads, state)
        return params, state, value

    return jax.jit(step, in_shardings=(p_sh, s_sh, b_sh, b_sh), out_shardings=(p_sh, s_sh, NamedSharding(mesh, P())),
                   donate_argnums=(0, 1), compiler_options=compiler_options)
