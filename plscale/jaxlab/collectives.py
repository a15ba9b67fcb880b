"""The collectives under jax.shard_map, each checked against its definition, and a ring
all-reduce written by hand from ppermute.

One program runs on n devices of the mesh axis "i". Inside `jax.shard_map` the function sees
one device's block, and `lax.psum` & co. talk across the axis. Every primitive here takes an
input with one row per device (row d: what device d holds), returns one row per device, and
is checked against its definition computed with numpy on the rows, never with another
collective. The HLO op XLA compiled it to comes with the result (plscale.jaxlab.hlo).

    mesh = line_mesh(devices)               # a 1-D mesh, axis "i"
    r = psum(mesh, rows)                    # Result(name, inputs, got, expected, ok, detail, ...)
    ring_all_reduce(mesh, rows)             # ppermute only: n-1 reduce-scatter, n-1 all-gather steps
    grid_psum(devices, rows, "model")       # a 2-D mesh ("data", "model"): sums within a row only
"""

from dataclasses import dataclass, field
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import AxisType, Mesh
from jax.sharding import PartitionSpec as P

from plscale.jaxlab import hlo

AXIS = "i"


@dataclass
class Result:
    name: str
    inputs: np.ndarray            # [n, ...]: row d is device d's input
    got: np.ndarray               # [n, ...]: row d is what device d holds afterwards
    expected: np.ndarray          # the definition, computed with numpy from `inputs`
    ok: bool
    detail: str
    devices: list = field(default_factory=list)   # the jax device id of each row
    ops: list = field(default_factory=list)       # the collectives XLA compiled it to (hlo.Collective)


@dataclass(frozen=True)
class Primitive:
    name: str
    body: Callable        # (one device's block, n) -> that device's result, inside shard_map
    parts: int | None     # elements per device: parts x numel, or n x numel when None
    definition: Callable  # rows in -> rows out, numpy
    says: str             # the definition in words
    use: str              # what training uses it for


def _shift(block, n):  # device d sends to d+1: each receives its left neighbour's block
    return lax.ppermute(block, AXIS, [(d, (d + 1) % n) for d in range(n)])


PRIMITIVES = {p.name: p for p in (
    Primitive("psum", lambda b, n: lax.psum(b, AXIS), 1,
              lambda x: np.broadcast_to(x.sum(0), x.shape),
              "every device holds the sum of all inputs", "data parallelism: gradients (all-reduce)"),
    Primitive("all_gather", lambda b, n: lax.all_gather(b, AXIS, tiled=True), 1,
              lambda x: np.broadcast_to(x.reshape(-1), (len(x), x.size)),
              "every device holds every input, in device order", "FSDP / ZeRO-3: a layer's parameter shards"),
    Primitive("psum_scatter", lambda b, n: lax.psum_scatter(b, AXIS, tiled=True), None,
              lambda x: x.sum(0).reshape(len(x), -1),
              "device d holds chunk d of the sum", "FSDP / ZeRO-2/3: each device's shard of the summed gradients"),
    Primitive("ppermute", _shift, 1, lambda x: np.roll(x, 1, axis=0),
              "device d holds device d-1's input (a shift by one around the ring)",
              "pipeline stages pass activations on; the ring all-reduce's every step"),
    Primitive("all_to_all", lambda b, n: lax.all_to_all(b, AXIS, 0, 0, tiled=True), None,
              lambda x: x.reshape(len(x), len(x), -1).transpose(1, 0, 2).reshape(x.shape),
              "chunk j of device i lands as chunk i on device j (a transpose)",
              "expert parallelism: tokens to their expert's device and back"),
)}


def line_mesh(devices) -> Mesh:
    return Mesh(np.array(devices), (AXIS,), axis_types=(AxisType.Auto,))


def traceable(n: int, numel: int, parts: int = 1, dtype=np.float32) -> np.ndarray:
    """Rows easy to follow by eye: device d holds 1 2 3 ... plus base x d (base 100 for 13 elements)."""
    base = 10 ** len(str(parts * numel))
    return (np.arange(1, parts * numel + 1)[None] + base * np.arange(n)[:, None]).astype(dtype)


def run(mesh: Mesh, body: Callable, rows, name: str, definition: Callable, says: str) -> Result:
    """Run body(block) on every device of the mesh's axis "i" and check it against the definition."""
    n = mesh.shape[AXIS]
    program = jax.jit(jax.shard_map(lambda a: body(a[0])[None], mesh=mesh, in_specs=P(AXIS), out_specs=P(AXIS)))
    compiled = program.lower(rows).compile()
    got = np.asarray(compiled(rows))
    inputs = np.asarray(rows)
    return _result(name, inputs, got, definition(inputs), n, says, [d.id for d in mesh.devices.flat],
                   hlo.collectives(compiled.as_text()))


def primitive(mesh: Mesh, name: str, rows) -> Result:
    p = PRIMITIVES[name]
    n = mesh.shape[AXIS]
    return run(mesh, lambda block: p.body(block, n), rows, name, p.definition, p.says)


def psum(mesh, rows):
    return primitive(mesh, "psum", rows)


def all_gather(mesh, rows):
    return primitive(mesh, "all_gather", rows)


def psum_scatter(mesh, rows):
    return primitive(mesh, "psum_scatter", rows)


def ppermute(mesh, rows):
    return primitive(mesh, "ppermute", rows)


def all_to_all(mesh, rows):
    return primitive(mesh, "all_to_all", rows)


# ---- The ring all-reduce, by hand -------------------------------------------------------------
def chunk_bounds(numel: int, n: int) -> list[tuple[int, int]]:
    """n chunks differing by at most one element (as torch.tensor_split and lab 03 cut them)."""
    edges = np.cumsum([0] + [len(c) for c in np.array_split(np.arange(numel), n)])
    return list(zip(edges[:-1].tolist(), edges[1:].tolist()))


def ring_body(block, n: int, reduce_steps: int | None = None, gather_steps: int | None = None, record=False):
    """One device's part of the ring. At every step each device sends one chunk to its right
    neighbour. Chunks may differ in size, and a program has one shape per array, so each chunk
    travels in its own ppermute: at reduce-scatter step s chunk j goes from device j+s to j+s+1
    (mod n), which adds it to its own copy; after n-1 steps device r holds the whole sum of
    chunk r+1. At all-gather step s the finished chunk j goes from device j-1+s to j+s, which
    keeps it. record=True returns every intermediate state ([2(n-1)+1, numel]) instead."""
    me = lax.axis_index(AXIS)
    chunks = [block[a:b] for a, b in chunk_bounds(block.shape[0], n)]
    states = [block]
    for step in range(n - 1 if reduce_steps is None else reduce_steps):   # reduce-scatter
        for j, chunk in enumerate(chunks):
            src, dst = (j + step) % n, (j + step + 1) % n
            if chunk.size:
                arrived = lax.ppermute(chunk, AXIS, [(src, dst)])          # zeros on every other device
                chunks[j] = jnp.where(me == dst, chunk + arrived, chunk)
        states.append(jnp.concatenate(chunks))
    for step in range(n - 1 if gather_steps is None else gather_steps):   # all-gather
        for j, chunk in enumerate(chunks):
            src, dst = (j - 1 + step) % n, (j + step) % n
            if chunk.size:
                arrived = lax.ppermute(chunk, AXIS, [(src, dst)])
                chunks[j] = jnp.where(me == dst, arrived, chunk)
        states.append(jnp.concatenate(chunks))
    return jnp.stack(states) if record else states[-1]


def ring_all_reduce(mesh: Mesh, rows, reduce_steps: int | None = None, gather_steps: int | None = None) -> Result:
    """The ring, checked against the definition of an all-reduce (the sum on every device).
    Fewer steps than n-1 (a broken ring) leave partial sums: the check fails."""
    n = mesh.shape[AXIS]
    return run(mesh, lambda block: ring_body(block, n, reduce_steps, gather_steps), rows, "ring_all_reduce",
               PRIMITIVES["psum"].definition, "every device holds the sum of all inputs (ppermute only)")


def ring_trace(mesh: Mesh, rows) -> np.ndarray:
    """[2(n-1)+1, n, numel]: every device's vector after each step of the ring (step 0: the input)."""
    n = mesh.shape[AXIS]
    program = jax.jit(jax.shard_map(lambda a: ring_body(a[0], n, record=True)[None], mesh=mesh,
                                    in_specs=P(AXIS), out_specs=P(AXIS)))
    return np.asarray(program(rows)).transpose(1, 0, 2)


# ---- Named axes: a 2-D mesh ---------------------------------------------------------------------
def grid_psum(devices, rows, axis: str, shape: tuple[int, int] | None = None) -> Result:
    """psum over one axis of a ("data", "model") mesh (2 x n/2 unless shape is given): devices
    of one data row (model) or one model column (data) sum among themselves only."""
    n = len(devices)
    shape = shape or (2, n // 2)
    mesh = Mesh(np.array(devices).reshape(shape), ("data", "model"), axis_types=(AxisType.Auto,) * 2)
    spec = P("data", "model")
    program = jax.jit(jax.shard_map(lambda a: lax.psum(a[0, 0], axis)[None, None], mesh=mesh,
                                    in_specs=spec, out_specs=spec))
    inputs = np.asarray(rows)
    grid = inputs.reshape(*shape, -1)
    compiled = program.lower(grid).compile()
    got = np.asarray(compiled(grid)).reshape(inputs.shape)
    over = ("data", "model").index(axis)
    expected = np.broadcast_to(grid.sum(over, keepdims=True), grid.shape).reshape(inputs.shape)
    who = "column (same model index)" if axis == "data" else "row (same data index)"
    return _result(f"psum over '{axis}' on a {shape[0]}x{shape[1]} mesh", inputs, got, expected, n,
                   f"every device holds the sum of its mesh {who}", [d.id for d in mesh.devices.flat],
                   hlo.collectives(compiled.as_text()))


# ---- Checking ------------------------------------------------------------------------------------
def _result(name, inputs, got, expected, n, says, devices, ops) -> Result:
    expected = np.asarray(expected, dtype=inputs.dtype)
    wide = np.float64 if np.issubdtype(inputs.dtype, np.inexact) or inputs.dtype.kind == "V" else np.int64
    g, e = got.astype(wide), expected.astype(wide)
    if got.shape != expected.shape:
        return Result(name, inputs, got, expected, False, f"shape {got.shape}, expected {expected.shape}", devices, ops)
    # A float sum may round differently in another order: n roundings of the largest partial sum.
    tolerance = 0.0 if wide is np.int64 else n * float(jnp.finfo(inputs.dtype).eps) * float(np.abs(inputs).astype(wide).sum(0).max())
    wrong = np.abs(g - e) > tolerance
    if not wrong.any():
        return Result(name, inputs, got, expected, True, says, devices, ops)
    bad = [devices[d] if devices else d for d in range(len(got)) if wrong[d].any()]
    return Result(name, inputs, got, expected, False,
                  f"devices {bad} differ from the definition in {int(wrong.sum())} elements "
                  f"(largest gap {np.abs(g - e).max():g})", devices, ops)
