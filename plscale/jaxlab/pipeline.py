"""GPipe over a "stage" mesh axis: each stage holds L / stages consecutive layers, and
micro-batches flow through the stages one tick at a time.

The layers' stacked weights are sharded P("stage", ...), so under jax.shard_map each stage
sees only its own slice. The batch is cut into m micro-batches; at tick t stage k runs
micro-batch t - k, then hands its output to stage k + 1 with lax.ppermute. m micro-batches
through p stages take m + p - 1 ticks; in the first and last p - 1 ticks some stages have no
micro-batch and compute on zeros (the bubble, (p - 1) / (m + p - 1) of the time). The
embedding runs before the pipeline and the final norm and head after it, replicated over
stages; the "data" axis splits each micro-batch (data parallelism inside every stage).

jax.grad differentiates straight through: ppermute's transpose sends the cotangents back
one stage per tick (the backward pass runs the pipeline in reverse), and shard_map sums the
layers' gradients over "data", as data parallelism's all-reduce does.

    loss = pipeline_loss(params, tokens, targets, config, mesh, micro_batches=4)
"""

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

from plscale.jaxlab import model
from plscale.predict import sharding
from plscale.predict.presets import ModelConfig


def gpipe(p_layers, xs, config: ModelConfig, stages: int):
    """One stage's share, inside shard_map: p_layers this stage's layers, xs [m, b, s, d] every
    micro-batch (only stage 0 reads them). Returns what this stage computed at each tick after
    the first p - 1: on the last stage, the micro-batches' outputs in order."""
    stage = lax.axis_index("stage")
    # Said once, before the ticks: the weights are used alike by every data shard, the
    # micro-batches by every stage. Autodiff sums the cotangents of such an input where it was
    # cast (pcast's transpose is a psum), so the layers' gradients are all-reduced over "data"
    # once per step, as data parallelism does, and not at every tick inside the loop.
    p_layers = jax.tree.map(lambda w: lax.pcast(w, ("data",), to="varying"), p_layers)
    xs = lax.pcast(xs, ("stage",), to="varying")
    cos, sin = model.rope_tables(config.head_dim, xs.shape[2], config.rope_theta)
    ticks = jnp.concatenate([xs, jnp.zeros((stages - 1, *xs.shape[1:]), xs.dtype)])
    to_next = [(k, k + 1) for k in range(stages - 1)]      # the last stage sends nothing on

    def tick(received, x_t):
        inputs = jnp.where(stage == 0, x_t, received)      # stage 0 takes a fresh micro-batch
        out = model.layers(p_layers, inputs, cos, sin, config)
        return lax.ppermute(out, "stage", to_next), out

    # The carry varies over "stage" (each stage holds a different activation); check_vma wants
    # the initial carry typed the same: zeros_like of the cast xs is.
    start = jnp.zeros_like(xs[0])                          # varying over "stage", like xs
    outs = lax.scan(tick, start, ticks)[1]
    return outs[stages - 1:][None]          # [1, m, b, s, d]: this stage's row of the result


def pipeline_loss(params, tokens, targets, config: ModelConfig, mesh, micro_batches: int):
    """The model's loss with its layers pipelined over mesh axis "stage" (GPipe, m micro-batches)."""
    stages, data = mesh.shape["stage"], mesh.shape["data"]
    b, s = tokens.shape
    m = micro_batches
    sharding.check(config, sharding.mesh("pipeline", stages * data, stages=stages), b, m)
    # Micro-batch i takes rows i, i + m, i + 2m...: each data shard keeps its own rows.
    xs = model.embed(params, tokens).reshape(b // m, m, s, -1).swapaxes(0, 1)
    run = jax.shard_map(lambda w, x: gpipe(w, x, config, stages), mesh=mesh,
                        in_specs=(P("stage"), P(None, "data")), out_specs=P("stage", None, "data"))
    outs = run(params["layers"], xs)[stages - 1]          # the last stage's row: [m, b/m, s, d]
    return model.head_loss(params, outs.swapaxes(0, 1).reshape(b, s, -1), targets, config)
