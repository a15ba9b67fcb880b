"""Lab 10, variant `collectives`: a device mesh with named axes, and the collectives under shard_map.

JAX runs one program over every device (not one process per rank as torch.distributed does).
A Mesh names the devices' axes; inside `jax.shard_map` a function sees one device's block and
talks across an axis by name: lax.psum, all_gather, psum_scatter, ppermute, all_to_all. This
script runs each one on small inputs, prints every device's input and output, checks them
against their definitions (numpy on the inputs), shows the HLO collective XLA compiled each
to, sums over one axis of a 2-D ("data", "model") mesh, and builds lab 03's ring all-reduce
from ppermute alone: its trace, its check, and the bytes each device sends, 2(N-1)/N x S.

    plscale lab run jax-collectives                          (4 simulated CPU devices)
    XLA_FLAGS=--xla_force_host_platform_device_count=4 python labs/10_jax_gspmd/collectives.py --variant collectives
"""

import numpy as np

from plscale.jaxlab import runtime

ctx = runtime.start(__file__)  # before jax picks its devices

from jax import lax  # noqa: E402

from plscale.jaxlab import collectives as C  # noqa: E402
from plscale.jaxlab import hlo  # noqa: E402
from plscale.predict.busbw import bus_factor, ring_bytes_sent  # noqa: E402
from plscale.rank.metrics import figure  # noqa: E402

N, K = ctx.world_size, int(ctx.settings["collectives"]["numel"])  # K: elements per device, not a multiple of N
mesh = C.line_mesh(ctx.devices)
figures = []


def text(values, chunk=None):
    """Numbers separated by spaces; ' | ' between chunks of `chunk` elements."""
    words = [str(int(v)) if v == int(v) else f"{v:g}" for v in np.asarray(values, dtype=np.float64).ravel()]
    if chunk and len(words) > chunk:
        words = [" ".join(words[i:i + chunk]) for i in range(0, len(words), chunk)]
        return " | ".join(words)
    return " ".join(words)


def show(r, use="", rows=True):
    """Every device's input and output, the collective XLA compiled, the check."""
    ctx.log(f"\n{r.name}{': ' + use if use else ''}\n  compiled to: {hlo.describe(r.ops)}")
    for device, before, after in zip(r.devices, r.inputs, r.got) if rows else ():
        ctx.log(f"  device {device}: {text(before, K)}\n        -> {text(after, K)}")
    ctx.check(r.name, r.ok, r.detail)
    return r.ok


# ---- 1. The mesh: one program, N devices, an axis with a name ------------------------------------
first, second = C.traceable(2, K)
ctx.log(f"{N} devices ({ctx.backend}) on a 1-D mesh {dict(mesh.shape)}; device d's input is "
        f"{text(first[:3])} ... {first[-1]:g} plus {second[0] - first[0]:g} x d ('|' between chunks of {K})")

# ---- 2. The tour: each primitive beside its definition -------------------------------------------
traffic, passed = [], 0
for name, p in C.PRIMITIVES.items():
    r = C.primitive(mesh, name, C.traceable(N, K, p.parts or N))
    passed += show(r, p.use)
    traffic += [(name, c) for c in r.ops]
figures.append(figure("primitives that match their definition", passed, f"of {len(C.PRIMITIVES)}",
                      len(C.PRIMITIVES), f"{N} devices, {K} elements per device"))

# The identity the ring stands on: all-reduce = reduce-scatter, then all-gather.
r = C.run(mesh, lambda b: lax.all_gather(lax.psum_scatter(b, C.AXIS, tiled=True), C.AXIS, tiled=True),
          C.traceable(N, K, N), "psum_scatter then all_gather", C.PRIMITIVES["psum"].definition,
          "the same as psum: every device holds the sum of all inputs")
show(r, "all-reduce = reduce-scatter + all-gather", rows=False)

ctx.log("\nbytes per device (S as nccl-tests counts it; 'sent': what a ring sends, S x the bus factor)")
for name, c in traffic:
    ctx.log(f"  {name:<13} {c.op:<19} S = {c.bytes:>5} B   sent {c.sent:>7.1f} B")
    ctx.metrics.step(primitive=name, hlo_op=c.op, bytes=c.bytes, sent=c.sent)
psum_op = dict(traffic)["psum"]
figures.append(figure("psum: all-reduce bytes in the HLO", psum_op.bytes, "B", 4 * K,
                      f"{K} float32 per device: XLA moves what the program holds"))

# ---- 3. Named axes: a 2-D mesh, a sum over one axis only -----------------------------------------
shape = (2, N // 2)
ctx.log(f"\nthe same {N} devices as a {shape[0]}x{shape[1]} mesh ('data' x 'model'), "
        f"device ids row by row: {np.array([d.id for d in ctx.devices]).reshape(shape).tolist()}")
for axis in ("model", "data"):
    show(C.grid_psum(ctx.devices, C.traceable(N, 3), axis, shape),
         "tensor parallelism sums over 'model'" if axis == "model" else "data parallelism sums over 'data'")

# ---- 4. The ring all-reduce, by hand from ppermute -----------------------------------------------
# Watch it: one-element chunks; device r adds 10^r, so the digits of a partial sum say whose
# parts it holds (1111 = all four). Reduce-scatter n-1 steps, then all-gather n-1 steps.
# (Shown on at most 4 devices: 8 digits per number would not fit a line.)
n = min(N, 4)
trace = C.ring_trace(C.line_mesh(ctx.devices[:n]), np.array([[10 ** r] * n for r in range(n)], np.int32))
phases = ["start"] + [f"reduce-scatter {s + 1}" for s in range(n - 1)] + [f"all-gather {s + 1}" for s in range(n - 1)]
ctx.log(f"\nring all-reduce on {n} devices, step by step (device r adds 10^r to each of its {n} chunks)")
ctx.log(f"  {'step':<17}" + "".join(f"{f'device {d}':<{5 * n + 3}}" for d in range(n)))
for phase, state in zip(phases, trace):
    ctx.log(f"  {phase:<17}" + "".join(f"{text(row):<{5 * n + 3}}" for row in state))
ctx.check("ring trace", bool((trace[-1] == int("1" * n)).all()), f"every chunk holds {'1' * n} on every device")

# Check it: K elements (chunks of different sizes), against the definition of an all-reduce.
ring = C.ring_all_reduce(mesh, C.traceable(N, K))
show(ring, f"{2 * (N - 1)} steps; chunks of {[b - a for a, b in C.chunk_bounds(K, N)]} elements")
broken = C.ring_all_reduce(mesh, C.traceable(N, K), reduce_steps=N - 2)
ctx.check("a ring one step short fails", not broken.ok, f"the definition catches it: {broken.detail}")

# Count the traffic: bytes each device sends, read from the compiled program's collective-permutes.
size = K * 4
sent = hlo.permute_bytes_sent(ring.ops)
want = ring_bytes_sent(K, 4, N)
ctx.log(f"\nring traffic, S = {size} B: every chunk but two leaves each device")
for d in range(N):
    ctx.log(f"  device {d}: sent {sent.get(d, 0)} B = {sent.get(d, 0) / size:.3f} S   (by the definition {want[d]} B)")
mean = sum(sent.values()) / N / size
factor = bus_factor("all_reduce", N)  # 2(N-1)/N
ctx.check("ring traffic", [sent.get(d, 0) for d in range(N)] == want and abs(mean - factor) < 1e-9,
          f"{mean:.3f} S per device on average, 2(N-1)/N = {factor:.3f}")
figures += [
    figure("ring: bytes sent per device / S", round(mean, 4), "x", round(factor, 4),
           f"mean over devices, read from the HLO's collective-permutes; {K} elements do not split evenly"),
    figure("ring: collective-permutes compiled", len(ring.ops), "", 2 * (N - 1) * N,
           "one per chunk per step: chunks differ in size, a program has static shapes"),
    figure("psum: collectives compiled", len(C.psum(mesh, C.traceable(N, K)).ops), "", 1,
           "XLA's all-reduce is one op; the hand ring is many"),
]
ctx.finish(figures)
