"""The JAX lab's four layouts on paper: the mesh, the bytes each device holds, the collectives.

Host-side and pure: the JAX lab (labs/10_jax_gspmd) prints these beside what XLA placed and
what it compiled, and the same questions are asked of the PyTorch labs' strategies, so the
answers line up:

    layout     mesh axes              what is split                        the PyTorch lab's twin
    dp         data n                 the batch                            ZeRO-0 (lab 04), DDP (lab 02)
    fsdp       data n                 the batch; every tensor over data    ZeRO-3 (lab 04)
    fsdp_tp    data n/t x model t     + heads, MLP, vocabulary over model  ZeRO-3 x Megatron TP (lab 07)
    pipeline   stage p x data n/p     + layers over stage                  DeepSpeed pipeline (lab 05)

Parameters and Adam moments per device come from the memory model (plscale.predict.memory),
fp32: parameters 4Ψ, moments 8Ψ, sharded over the data axis as ZeRO-3 shards them (ZeRO-0 for
dp and pipeline), with Ψ the parameters of one model-parallel rank: tensor parallelism's
`params_per_rank` (vocabulary-parallel embedding, replicated norms) for fsdp_tp, and for the
pipeline one stage's layers plus what every stage keeps here, the embedding, the final norm and
the head (GPipe in SPMD: one program, so the pieces outside the pipelined layers are replicated;
DeepSpeed's pipeline keeps the tied embedding on its first and last stages, the same bytes on
2 stages). The optimizer is Adam stepping the fp32 weights themselves: no master copy (the
memory model's rule 1 at stage 0; DeepSpeed keeps one from stage 1 on, JAX's optimizer does not).
"""

from dataclasses import dataclass

from plscale.errors import did_you_mean
from plscale.predict import memory
from plscale.predict.errors import PredictionError
from plscale.predict.presets import ModelConfig, layer_params, param_count
from plscale.predict.tensor_parallel import check_divisible, params_per_rank
from plscale.predict.tensor_parallel import collectives as tp_collectives

LAYOUTS = ("dp", "fsdp", "fsdp_tp", "pipeline")
TWINS = {"dp": "ZeRO-0 / DDP (labs 02, 04)", "fsdp": "ZeRO-3 (lab 04)",
         "fsdp_tp": "ZeRO-3 x Megatron TP (labs 04, 07)", "pipeline": "DeepSpeed pipeline, GPipe order (lab 05)"}
FP32 = 4


@dataclass(frozen=True)
class Mesh:
    """A layout's mesh: axis names and sizes, outermost first."""
    layout: str
    axes: tuple   # ((name, size), ...)

    @property
    def shape(self) -> dict:
        return dict(self.axes)

    def size(self, axis: str) -> int:
        return self.shape.get(axis, 1)

    def __str__(self) -> str:
        return " x ".join(f"{name} {size}" for name, size in self.axes)


# How the knobs are named where the user sets them, by default: lab 10's settings. Errors carry the
# quantity ("tp", "stages", "micro_batches"): another caller words them its own way (PredictionError.named)
KNOBS = {"tp": "mesh.tp", "stages": "mesh.stages", "micro_batches": "pipeline.micro_batches"}


def mesh(layout: str, devices: int, tp: int = 2, stages: int = 2, knobs: dict = KNOBS) -> Mesh:
    """The mesh of `layout` on `devices` devices; one line when it cannot be built."""
    if layout not in LAYOUTS:
        raise PredictionError("layout", layout, f"Unknown layout {layout!r}.{did_you_mean(layout, LAYOUTS)} "
                                                f"Use {', '.join(LAYOUTS)}.", lead=False)
    split = {"fsdp_tp": ("model", tp, "tp"), "pipeline": ("stage", stages, "stages")}.get(layout)
    if split is None:
        return Mesh(layout, (("data", devices),))
    axis, k, name = split
    if k < 2 or devices % k:
        choices = [d for d in range(2, devices + 1) if devices % d == 0]
        fix = f"pick one of {choices}" if choices else "use 2 or more devices"
        raise PredictionError(name, k, f" on {devices} device{'s' * (devices != 1)}: layout {layout} needs a {axis} "
                                       f"axis of 2 or more that divides the devices; {fix}.", names=knobs)
    axes = (("data", devices // k), ("model", k)) if axis == "model" else (("stage", k), ("data", devices // k))
    return Mesh(layout, axes)


def check(config: ModelConfig, m: Mesh, batch: int, micro_batches: int = 1, knobs: dict = KNOBS) -> None:
    """What the model and batch must divide on this mesh, one line each."""
    if not isinstance(micro_batches, int) or micro_batches < 1:
        raise PredictionError("micro_batches", micro_batches, ": use a whole number, 1 or more.",
                              show=repr(micro_batches), names=knobs)
    if m.size("model") > 1:
        check_divisible(config, m.size("model"))
    if config.layers % m.size("stage"):
        raise PredictionError("stages", m.size("stage"), f"{config.layers} layers do not split into {m.size('stage')} "
                                                        f"stages: pick {{stages}} that divides {config.layers}.",
                              lead=False, names=knobs)
    if batch % m.size("data"):
        raise PredictionError("batch", batch, f"A global batch of {batch} sequences does not split over the data axis "
                                              f"of {m.size('data')}: use a multiple of {m.size('data')}.", lead=False)
    if m.layout == "pipeline" and (batch // m.size("data")) % micro_batches:
        raise PredictionError("micro_batches", micro_batches, f": each data shard holds {batch // m.size('data')} "
                                                              f"sequences; pick a divisor of it.", names=knobs)


def model_parallel_params(config: ModelConfig, m: Mesh) -> int:
    """Ψ of one model-parallel rank: what ZeRO would shard over the data axis."""
    if m.layout == "pipeline":
        outside = param_count(config) - config.layers * layer_params(config)   # embedding(s) + final norm
        return config.layers // m.size("stage") * layer_params(config) + outside
    if m.size("model") > 1:
        return params_per_rank(config, m.size("model")).total
    return param_count(config)


def setup(config: ModelConfig, m: Mesh) -> memory.Setup:
    """The memory model's question for this layout (fp32; ZeRO-3 where the data axis shards)."""
    sharded, tp = m.layout in ("fsdp", "fsdp_tp"), m.size("model")
    if tp > 1:  # the memory model splits the whole model over the TP group itself
        return memory.Setup(params=param_count(config), stage=3, dp=m.size("data"), precision="fp32", tp=tp, model=config)
    return memory.Setup(params=model_parallel_params(config, m), stage=3 if sharded else 0, dp=m.size("data"),
                        precision="fp32")


def states_per_device(config: ModelConfig, m: Mesh) -> dict:
    """Bytes of parameters and of Adam's two moments on each device, from the memory model."""
    estimate = memory.estimate(setup(config, m))
    return {name: estimate.term(name).device for name in ("parameters", "moments")}


def formulas(config: ModelConfig, m: Mesh) -> dict:
    estimate = memory.estimate(setup(config, m))
    return {name: estimate.term(name).formula for name in ("parameters", "moments")}


@dataclass(frozen=True)
class Traffic:
    """One kind of collective a strategy issues per optimizer step on one device, along one mesh axis."""
    op: str        # all_reduce, all_gather, reduce_scatter, send_recv
    phase: str     # forward or backward
    axis: str      # the mesh axis it runs along: data, model or stage
    calls: int
    bytes: int     # per call: all-reduce its tensor, all-gather its output, reduce-scatter its input
    where: str

    @property
    def total(self) -> int:
        return self.calls * self.bytes


def by_hand(config: ModelConfig, m: Mesh, seq: int, batch: int, micro_batches: int = 1) -> list[Traffic]:
    """What the PyTorch twin issues per optimizer step on one device (fp32): the collectives the
    PyTorch labs make by hand or through DeepSpeed, for the same model, mesh and batch. Gradients
    and gathered weights are counted in bytes, whatever the buckets or modules they go in."""
    grads = FP32 * model_parallel_params(config, m)
    rows = []
    if m.layout in ("dp", "pipeline") and m.size("data") > 1:
        rows.append(Traffic("all_reduce", "backward", "data", 1, grads, "gradients"))
    if m.layout == "pipeline":
        act = batch // m.size("data") // micro_batches * seq * config.hidden * FP32
        rows += [Traffic("send_recv", "forward", "stage", micro_batches, act, "activations to the next stage"),
                 Traffic("send_recv", "backward", "stage", micro_batches, act, "their gradients to the previous stage")]
    if m.layout in ("fsdp", "fsdp_tp") and m.size("data") > 1:
        rows += [Traffic("all_gather", "forward", "data", 1, grads, "weights, layer by layer"),
                 Traffic("all_gather", "backward", "data", 1, grads, "weights again, layer by layer"),
                 Traffic("reduce_scatter", "backward", "data", 1, grads, "gradients to their shards")]
    if m.layout == "fsdp_tp":
        rows += [Traffic(r.op, r.phase, "model", r.calls, r.bytes, r.where)
                 for r in tp_collectives(config, m.size("model"), seq, batch // m.size("data"), "fp32")]
    return rows


def gpipe_ticks(stages: int, micro_batches: int) -> int:
    """Ticks of GPipe written as one SPMD program: every stage works (or idles on zeros, the
    bubble) and passes its activations on at each of m + p - 1 ticks, forward and backward."""
    return micro_batches + stages - 1


def gradient_bytes(config: ModelConfig, m: Mesh) -> tuple[int, int]:
    """(least, most) bytes a device's gradients put through the data axis's reductions in one
    step when each gradient is reduced once: 4Ψ of its model-parallel part, and at most the
    tied embedding's gradient once more (XLA reduces the lookup's part and the output head's
    part of it separately, measured) plus 4 KiB of scalars (the loss). More means some
    gradient was reduced more than once (say, at every pipeline tick)."""
    if m.size("data") == 1:
        return 0, 4096
    grads = FP32 * model_parallel_params(config, m)
    tied = FP32 * config.vocab * config.hidden // m.size("model") if config.tie_embeddings else 0
    return grads, grads + tied + 4096
