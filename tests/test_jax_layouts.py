"""The JAX lab's four layouts on 4 CPU devices: one loss curve, and what each device holds.

tests/conftest.py gives JAX 4 CPU devices (XLA_FLAGS); each layout compiles once (tiny preset).
"""

from functools import cache

import numpy as np
import pytest

jax = pytest.importorskip("jax", reason="JAX is an optional extra: pip install -e '.[jax]'")

from jax.sharding import PartitionSpec as P

from plscale.errors import UserError
from plscale.jaxlab import layouts, model, pipeline
from plscale.jaxlab.adam import Adam
from plscale.jaxlab.placement import bytes_per_device
from plscale.predict.presets import layer_params, param_count, preset
from plscale.predict.tensor_parallel import params_per_rank

CONFIG = preset("tiny")
BATCH, SEQ, STEPS, MICRO_BATCHES = 8, 16, 3, 4
FAST_COMPILE = {"xla_backend_optimization_level": 0}   # half XLA's CPU compile time, same numbers
ADAM = {"optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "weight_decay": 0.01, "betas": [0.9, 0.999],
                                                   "eps": 1e-8}}}

pytestmark = pytest.mark.usefixtures("four_jax_devices")


def batches():
    keys = jax.random.split(jax.random.key(1), STEPS)
    return [jax.random.randint(k, (BATCH, SEQ + 1), 0, CONFIG.vocab) for k in keys]


@cache
def start():
    """The same initial weights for every layout (host numpy arrays)."""
    return jax.device_get(model.init(CONFIG, jax.random.key(0)))


@pytest.fixture(scope="module")
def trained():
    """layout -> (losses of STEPS steps, params, Adam state), all from the same start."""
    opt, out = Adam(ADAM), {}
    for layout in layouts.LAYOUTS:
        mesh = layouts.mesh_for(layout, jax.devices()[:4])
        step = layouts.train_step(layout, mesh, CONFIG, opt, MICRO_BATCHES, compiler_options=FAST_COMPILE)
        params, state = layouts.place(layout, mesh, start(), opt.init(start()))
        losses = []
        for b in batches():
            params, state, loss = step(params, state, b[:, :-1], b[:, 1:])
            losses.append(float(loss))
        out[layout] = losses, params, state
    return out


@pytest.mark.parametrize("layout", layouts.LAYOUTS[1:])
def test_every_layout_follows_the_data_parallel_loss_curve(trained, layout):
    np.testing.assert_allclose(trained[layout][0], trained["dp"][0], atol=1e-5)


def test_each_device_holds_what_the_memory_model_counts(trained):
    layers = CONFIG.layers * layer_params(CONFIG)
    expected = {"dp": param_count(CONFIG) * 4,
                "fsdp": param_count(CONFIG) * 4 // 4,                          # ZeRO-3 over 4
                "fsdp_tp": params_per_rank(CONFIG, 2).total * 4 // 2,          # TP 2, then ZeRO-3 over dp 2
                "pipeline": (param_count(CONFIG) - layers + layers // 2) * 4}  # half the layers each
    for layout, (_, params, state) in trained.items():
        assert set(bytes_per_device(params).values()) == {expected[layout]}, layout
        # Adam's moments sit exactly where their params do
        for moment in (state["m"], state["v"]):
            for p, m in zip(jax.tree.leaves(params), jax.tree.leaves(moment)):
                assert m.sharding.is_equivalent_to(p.sharding, p.ndim), layout


def test_fsdp_tp_shards_megatron_style():
    params = jax.eval_shape(lambda: model.init(CONFIG, jax.random.key(0)))
    specs = layouts.param_specs("fsdp_tp", params)
    assert specs["embed"] == P("model", "data")                     # vocab-parallel
    assert specs["layers"]["q"] == P(None, "data", "model")          # column-parallel
    assert specs["layers"]["down"] == P(None, "model", "data")       # row-parallel
    assert specs["layers"]["input_norm"] == P(None, "data")          # replicated over "model"


def test_a_dim_the_axis_does_not_divide_is_replicated():
    mesh = layouts.mesh_for("fsdp", jax.devices()[:3])
    specs = layouts.param_specs("fsdp", jax.eval_shape(lambda: model.init(CONFIG, jax.random.key(0))), mesh)
    assert specs["layers"]["q"] == P(None, None)          # hidden 128 over 3: replicated
    assert specs["embed"] == P(None)                      # vocab 2048 over 3: replicated
    assert specs["layers"]["down"] == P(None, "data")     # ffn 384 over 3: split


def test_bad_meshes_are_user_errors():
    with pytest.raises(UserError, match="Unknown layout .zero."):
        layouts.mesh_for("zero", jax.devices())
    with pytest.raises(UserError, match="mesh.stages 3 on 4 devices"):
        layouts.mesh_for("pipeline", jax.devices()[:4], stages=3)


@pytest.fixture(scope="module")
def plain():
    """The unsharded model's loss and gradients on the first batch."""
    b = batches()[0]
    grad = jax.jit(jax.value_and_grad(model.loss), static_argnums=3, compiler_options=FAST_COMPILE)
    return b, grad(start(), b[:, :-1], b[:, 1:], CONFIG)


@pytest.mark.parametrize("micro_batches", [2, 4])
def test_pipeline_gives_the_plain_models_loss_and_gradients(plain, micro_batches):
    b, (loss, grads) = plain
    mesh = layouts.mesh_for("pipeline", jax.devices()[:4], stages=2)
    piped = jax.jit(jax.value_and_grad(lambda p: pipeline.pipeline_loss(p, b[:, :-1], b[:, 1:], CONFIG, mesh,
                                                                        micro_batches)),
                    compiler_options=FAST_COMPILE)
    piped_loss, piped_grads = piped(start())
    assert float(piped_loss) == pytest.approx(float(loss), abs=1e-5)
    for (path, g), p in zip(jax.tree_util.tree_leaves_with_path(grads), jax.tree.leaves(piped_grads)):
        np.testing.assert_allclose(p, g, atol=1e-5, err_msg=jax.tree_util.keystr(path))
