"""Reading XLA's collectives from compiled HLO (plscale/jaxlab/hlo.py) and the bytes each device
holds (plscale/jaxlab/placement.py), on tiny programs with known answers."""

import numpy as np
import pytest

jax = pytest.importorskip("jax", reason="JAX is an optional extra: pip install -e '.[jax]'")

import jax.numpy as jnp  # noqa: E402
from jax import lax  # noqa: E402
from jax.sharding import AxisType, Mesh, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

from plscale.jaxlab import hlo, placement  # noqa: E402

pytestmark = pytest.mark.usefixtures("four_jax_devices")

def mesh():
    """The 4 devices on one "data" axis (made inside a test: a backend started at import would
    make the other tests' forks unsafe)."""
    return Mesh(np.array(jax.devices()), ("data",), axis_types=(AxisType.Auto,))


def sharded(*spec):
    return NamedSharding(mesh(), P(*spec))


def compiled_ops(f, *args):
    return hlo.collectives(f.lower(*args).compile().as_text())


def test_psum_of_a_sharded_array_is_one_all_reduce():
    f = jax.jit(jax.shard_map(lambda a: lax.psum(a, "data"), mesh=mesh(), in_specs=P("data"), out_specs=P()))
    [op] = compiled_ops(f, jnp.zeros((8, 16), jnp.float32))
    assert (op.op, op.shape, op.dtype, op.bytes) == ("all-reduce", (2, 16), "f32", 2 * 16 * 4)
    assert op.groups == ((0, 1, 2, 3),) and op.group_size == 4 and op.runs == 1
    assert op.sent == pytest.approx(2 * 3 / 4 * 128)  # a ring's 2(n-1)/n x S
    assert hlo.summarize([op]) == {"all-reduce": (1, 128)}


def test_all_gather_counts_the_gathered_output_and_reduce_scatter_the_input():
    x = jnp.zeros((8, 16), jnp.float32)
    gather = jax.jit(jax.shard_map(lambda a: lax.all_gather(a, "data", tiled=True)[None], mesh=mesh(),
                                   in_specs=P("data"), out_specs=P("data")))
    scatter = jax.jit(jax.shard_map(lambda a: lax.psum_scatter(a, "data", tiled=True), mesh=mesh(),
                                    in_specs=P(), out_specs=P("data")))
    [g] = compiled_ops(gather, x)
    [s] = compiled_ops(scatter, x)
    assert (g.op, g.shape, g.bytes) == ("all-gather", (8, 16), 8 * 16 * 4)
    assert (s.op, s.shape, s.bytes) == ("reduce-scatter", (2, 16), 8 * 16 * 4)


def mlp_step(params, x, y, constrain=lambda h: h):
    def loss(p):
        h = constrain(jnp.tanh(x @ p["w1"]))
        return jnp.mean((h @ p["w2"] - y) ** 2)

    value, grads = jax.value_and_grad(loss)(params)
    return jax.tree.map(lambda p, g: p - 0.1 * g, params, grads), value


def params():
    return {"w1": jnp.ones((16, 32)) * 0.1, "w2": jnp.ones((32, 16)) * 0.1}
PARAM_BYTES = (16 * 32 + 32 * 16) * 4
def batch():
    return jnp.ones((8, 16)), jnp.zeros((8, 16))


def test_data_parallel_step_all_reduces_the_gradients_in_one_combined_op():
    replicated = {k: sharded() for k in params()}
    step = jax.jit(mlp_step, in_shardings=(replicated, sharded("data"), sharded("data")),
                   out_shardings=(replicated, sharded()))
    ops = compiled_ops(step, params(), *batch())
    assert {c.op for c in ops} == {"all-reduce"}
    assert hlo.summarize(ops)["all-reduce"][1] == PARAM_BYTES + 4  # every gradient, and the loss
    assert any(len(c.shapes) > 1 for c in ops)  # XLA's combiner: one tuple-shaped all-reduce


def test_fsdp_step_gathers_parameters_and_reduces_gradients():
    shards = {k: sharded("data") for k in params()}

    def step(params, x, y):  # activations stay batch-sharded, so the parameters are gathered
        return mlp_step(params, x, y, lambda h: lax.with_sharding_constraint(h, sharded("data", None)))

    ops = compiled_ops(jax.jit(step, in_shardings=(shards, sharded("data"), sharded("data")),
                               out_shardings=(shards, sharded())), params(), *batch())
    summary = hlo.summarize(ops)
    assert summary["all-gather"] == (2, PARAM_BYTES)
    # XLA on CPU writes the reduce-scatter as all-reduce + dynamic-slice; GPUs get a reduce-scatter.
    reduced = sum(summary.get(op, (0, 0))[1] for op in ("all-reduce", "reduce-scatter"))
    assert reduced >= PARAM_BYTES


ASYNC_AND_LOOP = """HloModule hand_written, num_partitions=4

%add (x: f32[], y: f32[]) -> f32[] {
  %x = f32[] parameter(0)
  %y = f32[] parameter(1)
  ROOT %sum = f32[] add(f32[] %x, f32[] %y)
}

%body (p: (s32[], f32[16])) -> (s32[], f32[16]) {
  %p = (s32[], f32[16]{0}) parameter(0)
  %i = s32[] get-tuple-element((s32[], f32[16]{0}) %p), index=0
  %v = f32[16]{0} get-tuple-element((s32[], f32[16]{0}) %p), index=1
  %ar = f32[16]{0} all-reduce(f32[16]{0} %v), channel_id=5, replica_groups=[2,2]<=[4], to_apply=%add
  ROOT %t = (s32[], f32[16]{0}) tuple(s32[] %i, f32[16]{0} %ar)
}

%cond (q: (s32[], f32[16])) -> pred[] {
  %q = (s32[], f32[16]{0}) parameter(0)
  ROOT %c = pred[] constant(true)
}

ENTRY %main (a: f32[2,16], b: f32[8], init: (s32[], f32[16])) -> f32[8,16] {
  %a = f32[2,16]{1,0} parameter(0)
  %b = f32[8]{0} parameter(1)
  %init = (s32[], f32[16]{0}) parameter(2)
  %ars = f32[2,16]{1,0} all-reduce-start(f32[2,16]{1,0} %a), channel_id=1, replica_groups={}, to_apply=%add
  %ard = f32[2,16]{1,0} all-reduce-done(f32[2,16]{1,0} %ars)
  %ags = (f32[2,16]{1,0}, f32[8,16]{1,0}) all-gather-start(f32[2,16]{1,0} %ard), channel_id=2, replica_groups=[1,4]<=[4], dimensions={0}
  %agd = f32[8,16]{1,0} all-gather-done((f32[2,16]{1,0}, f32[8,16]{1,0}) %ags)
  %cps = (f32[2,16]{1,0}, f32[2,16]{1,0}, u32[], u32[]) collective-permute-start(f32[2,16]{1,0} %a), channel_id=3, source_target_pairs={{0,1},{1,2},{2,3},{3,0}}
  %cpd = f32[2,16]{1,0} collective-permute-done((f32[2,16]{1,0}, f32[2,16]{1,0}, u32[], u32[]) %cps)
  %rs = f32[4]{0} reduce-scatter(%b), channel_id=4, replica_groups=[2,2]<=[2,2]T(1,0), dimensions={0}, to_apply=%add
  %w = (s32[], f32[16]{0}) while(%init), condition=%cond, body=%body, backend_config={"known_trip_count":{"n":"3"}}
  ROOT %out = f32[8,16]{1,0} copy(%agd)
}
"""


def test_async_pairs_count_once_and_loop_bodies_count_their_trips():
    ops = {c.op: c for c in hlo.collectives(ASYNC_AND_LOOP)}
    assert len(hlo.collectives(ASYNC_AND_LOOP)) == 5
    ar, ag, cp, rs = ops["all-reduce"], ops["all-gather"], ops["collective-permute"], ops["reduce-scatter"]
    assert (ar.bytes, ar.groups) == (128, ((0, 1, 2, 3),))             # {}: one group of every partition
    assert (ag.shape, ag.bytes, ag.groups) == ((8, 16), 512, ((0, 1, 2, 3),))
    assert (cp.bytes, cp.groups) == (128, ((0, 1), (1, 2), (2, 3), (3, 0)))
    assert (rs.bytes, rs.groups) == (32, ((0, 2), (1, 3)))              # the input; transposed iota
    [looped] = [c for c in hlo.collectives(ASYNC_AND_LOOP) if c.runs != 1]
    assert (looped.runs, looped.groups) == (3, ((0, 1), (2, 3)))
    summary = hlo.summarize(hlo.collectives(ASYNC_AND_LOOP))
    assert summary["all-reduce"] == (1 + 3, 128 + 3 * 64)
    assert hlo.permute_bytes_sent(hlo.collectives(ASYNC_AND_LOOP)) == {0: 128, 1: 128, 2: 128, 3: 128}


def test_mesh_spelled_replica_groups():
    line = ("  %all-reduce.6 = (f32[32]{0}, f32[]) all-reduce(%a, %b), channel_id=2, "
            "replica_groups=mesh['axis_0'=2,'axis_1'=2] {'axis_0'}, use_global_device_ids=true, to_apply=%add")
    text = "HloModule m, num_partitions=4\n\nENTRY %main () -> f32[] {\n" + line + "\n}\n"
    [op] = hlo.collectives(text)
    assert op.groups == ((0, 2), (1, 3)) and op.shapes == ((32,), ()) and op.bytes == 132
    # with the mesh's device order given (the pipeline's combined gradient all-reduce): devices
    # [[0, 2], [1, 3]] on axes of 2, 1, 1, 2; grouped along axis_0
    ordered = line.replace("'axis_1'=2] {", "'axis_1'=1,'axis_2'=1,'axis_3'=2], device_ids=([2,2]T(1,0)) {")
    [op] = hlo.collectives(text.replace(line, ordered))
    assert op.groups == ((0, 1), (2, 3))


def test_bytes_per_device_replicated_vs_sharded():
    x = jnp.ones((8, 16), jnp.float32)
    replicated = jax.device_put(x, sharded())
    split = jax.device_put(x, sharded("data"))
    assert placement.bytes_per_device({"w": replicated}) == {d: 512 for d in range(4)}
    assert placement.bytes_per_device([split, split]) == {d: 2 * 128 for d in range(4)}
    assert placement.largest(placement.bytes_per_device(split)) == 128


def test_memory_analysis_reports_per_device_arguments():
    x = jax.device_put(jnp.ones((8, 16), jnp.float32), sharded("data"))
    compiled = jax.jit(lambda a: a * 2, out_shardings=sharded("data")).lower(x).compile()
    stats = placement.memory_analysis(compiled)
    assert set(stats) >= {"argument", "output", "temp", "alias"}
    assert stats["argument"] == 128 and stats["output"] == 128
    assert placement.memory_analysis(object()) == dict.fromkeys(placement.FIELDS)  # not compiled: None fields
