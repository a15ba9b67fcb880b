"""The shard_map collectives and the hand-written ring all-reduce (plscale/jaxlab/collectives.py),
on sub-meshes of the 4 simulated CPU devices that tests/conftest.py asks XLA for."""

import numpy as np
import pytest

jax = pytest.importorskip("jax", reason="JAX is an optional extra: pip install -e '.[jax]'")

from plscale.jaxlab import collectives as C  # noqa: E402
from plscale.jaxlab import hlo  # noqa: E402
from plscale.predict.busbw import ring_bytes_sent  # noqa: E402

pytestmark = pytest.mark.usefixtures("four_jax_devices")

HLO_OP = {"psum": "all-reduce", "all_gather": "all-gather", "psum_scatter": "reduce-scatter",
          "ppermute": "collective-permute", "all_to_all": "all-to-all"}
DTYPES = [np.float32, jax.numpy.bfloat16, np.int32]


def mesh(n, first=0):
    return C.line_mesh(jax.devices()[first:first + n])


@pytest.mark.parametrize("n", [2, 4])
@pytest.mark.parametrize("name", list(C.PRIMITIVES))
def test_each_primitive_matches_its_definition(n, name):
    p = C.PRIMITIVES[name]
    for dtype in DTYPES:
        rows = C.traceable(n, 5, p.parts or n, dtype)  # 5 elements: divisible by neither 2 nor 4
        r = C.primitive(mesh(n), name, rows)
        assert r.ok, (dtype, r.detail)
        assert r.got.shape == r.expected.shape and r.got.dtype == rows.dtype
        assert [c.op for c in r.ops] == [HLO_OP[name]]


def test_definitions_by_example():
    """Two devices, what each one holds afterwards, written out."""
    m = mesh(2)
    x = np.array([[1, 2], [10, 20]], np.int32)
    assert C.psum(m, x).got.tolist() == [[11, 22], [11, 22]]
    assert C.all_gather(m, x).got.tolist() == [[1, 2, 10, 20]] * 2
    assert C.ppermute(m, x).got.tolist() == [[10, 20], [1, 2]]
    y = np.array([[1, 2, 3, 4], [10, 20, 30, 40]], np.int32)
    assert C.psum_scatter(m, y).got.tolist() == [[11, 22], [33, 44]]
    assert C.all_to_all(m, y).got.tolist() == [[1, 2, 10, 20], [3, 4, 30, 40]]


def test_a_wrong_result_fails_the_check():
    r = C.run(mesh(4), lambda block: block, C.traceable(4, 3), "not a psum", C.PRIMITIVES["psum"].definition, "")
    assert not r.ok and "differ" in r.detail


@pytest.mark.parametrize("n", [2, 4])
def test_ring_all_reduce_any_size_and_dtype(n):
    cases = [(13, dtype) for dtype in DTYPES] + [(1, np.float32)]  # 1 < n: empty chunks
    for numel, dtype in cases:  # 13: a size n does not divide
        rows = (C.traceable(n, numel) % 50).astype(dtype)  # integer values: every partial sum exact
        r = C.ring_all_reduce(mesh(n, first=4 - n), rows)
        assert r.ok, (numel, dtype, r.detail)
        assert {c.op for c in r.ops} == {"collective-permute"}  # ppermute only


def test_ring_on_random_floats_within_rounding():
    rows = np.random.default_rng(0).standard_normal((4, 101)).astype(np.float32)
    r = C.ring_all_reduce(mesh(4), rows)
    assert r.ok, r.detail
    np.testing.assert_allclose(r.got, np.broadcast_to(rows.sum(0), rows.shape), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("n", [2, 4])
def test_a_broken_ring_fails(n):
    rows = C.traceable(n, 13)
    short_reduce = C.ring_all_reduce(mesh(n), rows, reduce_steps=n - 2)
    short_gather = C.ring_all_reduce(mesh(n), rows, gather_steps=n - 2)
    assert not short_reduce.ok and not short_gather.ok
    assert "differ" in short_reduce.detail


def test_ring_trace_reads_like_lab_03():
    """Device r adds 10^r to each of 4 one-element chunks: the digits say whose parts a sum holds."""
    rows = np.array([[10 ** r] * 4 for r in range(4)], np.int32)
    trace = C.ring_trace(mesh(4), rows)
    assert trace.shape == (7, 4, 4)
    after_reduce_scatter = trace[3]
    for r in range(4):  # device r holds the whole sum of chunk r+1
        assert after_reduce_scatter[r][(r + 1) % 4] == 1111
    assert (trace[-1] == 1111).all()
    assert trace[1][0].tolist() == [1, 1, 1, 1001]  # the first step: chunk 3 arrived from device 3


@pytest.mark.parametrize("n, numel", [(2, 13), (4, 13), (4, 12)])
def test_ring_sends_2_n_minus_1_over_n_of_the_data(n, numel):
    """Bytes each device sends, read from the compiled program's collective-permutes."""
    r = C.ring_all_reduce(mesh(n), C.traceable(n, numel))
    sent = hlo.permute_bytes_sent(r.ops)
    size = numel * 4
    assert [sent[d] for d in range(n)] == ring_bytes_sent(numel, 4, n)
    assert sum(sent.values()) == 2 * (n - 1) * size  # mean: 2(n-1)/n x S
    if numel % n == 0:
        assert set(sent.values()) == {2 * (n - 1) * size // n}


def test_sub_mesh_reports_its_devices():
    r = C.psum(mesh(2, first=2), C.traceable(2, 3))
    assert r.ok and r.devices == [2, 3]
    assert r.ops[0].groups == ((0, 1),)  # partition ids: positions in the mesh, not device ids


def test_named_axes_on_a_2d_mesh():
    rows = C.traceable(4, 3)  # devices 0..3 as a 2x2 grid: rows (0, 1) and (2, 3)
    by_model = C.grid_psum(jax.devices(), rows, "model")
    by_data = C.grid_psum(jax.devices(), rows, "data")
    assert by_model.ok and by_data.ok
    assert by_model.got[:, 0].tolist() == [12, 12, 52, 52]  # 1+11 and 21+31: per-row sums
    assert by_data.got[:, 0].tolist() == [22, 42, 22, 42]   # 1+21 and 11+31: per-column sums
    assert by_model.ops[0].groups == ((0, 1), (2, 3)) and by_data.ops[0].groups == ((0, 2), (1, 3))
