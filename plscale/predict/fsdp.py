"""FSDP2 on paper: what each rank holds and what one step sends (plscale.strategies.fsdp).

Host-side and pure. Groups: every decoder layer one, the root the rest (the embedding and its
tied head, the final norm; a Hugging Face model's as predict.tensors lists them). N = the shard group's ranks (HSDP: a 2D mesh of R replicas x N).

Memory (torch.distributed.fsdp, fully_shard's docstring and _fsdp_param.py, torch 2.13). Each
tensor is split on dim 0 into N chunks of k = ceil(rows / N) rows, padded: a rank holds
k x cols elements of every tensor, Ψ_k in all (Ψ/N when N divides every dim 0). In fp32 and in
FSDP2's mixed precision (bf16 compute, fp32 reduction) alike:

    parameters   4Ψ_k          the sharded fp32 parameters, which the optimizer steps: no master
                 + pΨ gathered  between a micro-batch's forward and its backward, without reshard
                                (p: the compute dtype's bytes, 2 in bf16)
    gradients    4Ψ_k          sharded, reduce-scattered after every micro-batch's backward
    moments      8Ψ_k          Adam's two, sharded like the parameters

Composed with tensor parallelism and a pipeline (plscale.strategies.fsdp.composed, lab 11), a rank
holds its stage's tensors as tp cut them (q, k, v, gate, up: rows / tp; o, down: cols / tp; the
norms, the embedding and the head whole), each then split on dim 0 over the dp ranks, N = dp.

DeepSpeed's ZeRO-3 in fp32 holds 20Ψ/N (plscale.predict.memory: it keeps a 4Ψ/N master partition
even of an fp32 model); FSDP2 16Ψ/N.

Collectives a step, m micro-batches, G = layers + 1 groups, each group's bytes B_g = N k_g
cols (its padded whole):

    all_gather forward       G m calls   the gathered B_g in the compute dtype
    all_gather backward      G m calls   with reshard (gathered again), none without
    reduce_scatter backward  G m calls   the group's B_g of gradients in the reduction dtype
    all_reduce backward      G m calls   HSDP only: each shard (B_g / N) across the R replicas
"""

from plscale.predict import tensors
from plscale.predict.errors import PredictionError
from plscale.predict.presets import ModelConfig
from plscale.predict.tensor_parallel import check_divisible
from plscale.predict.units import BYTES


def shapes(c: ModelConfig, tp: int = 1, pp: int = 1, stage: int = 0) -> list[list[tuple[int, int]]]:
    """(rows, cols) of each parameter a rank of pipeline stage `stage` holds before FSDP2 splits
    it (a tp rank's slice), group by group: the stage's layers', then its root's (the first
    stage's embedding; the last stage's norm and head, a copy of the tied embedding when pp > 1)."""
    if tp == 1 and pp == 1:   # any model: each layer's tensors, then the root's (predict.tensors)
        return [tensors.layer(c)] * c.layers + [tensors.embeddings(c) + tensors.final(c)]
    if c.origin != "plscale":
        raise PredictionError("tp", tp, f" x pp {pp}: FSDP2 composed with tensor and pipeline parallelism is modelled "
                              f"for plscale's Llama only (lab 11), not a Hugging Face model's modules.")
    d, kv, f, t = c.hidden, c.kv_dim, c.ffn, tp
    layer = [(d, 1), (d // t, d), (kv // t, d), (kv // t, d), (d, d // t), (d, 1), (f // t, d), (f // t, d),
             (d, f // t)]
    head = [] if c.tie_embeddings and pp == 1 else [(c.vocab, d)]
    root = [(c.vocab, d)] * (stage == 0) + ([(d, 1), *head] if stage == pp - 1 else [])
    return [layer] * (c.layers // pp) + ([root] if root else [])


def shard_elements(group: list[tuple[int, int]], n: int) -> int:
    """Elements one rank holds of a group: k = ceil(rows / n) rows of every tensor."""
    return sum(-(-rows // n) * cols for rows, cols in group)


def check(c: ModelConfig, ranks: int, replicate: int, tp: int = 1, pp: int = 1) -> None:
    if replicate < 1 or ranks % replicate:
        raise PredictionError("replicate", replicate, f" does not divide {{ranks}} {ranks}: HSDP's mesh is "
                              f"replicate x shard, so use 1 or a divisor of {ranks}.")
    if ranks % (replicate * tp * pp):
        raise PredictionError("tp", tp, f" x pp {pp} x replicate {replicate} does not divide {{ranks}} {ranks}: "
                              f"the mesh is pp x dp x tp.")
    check_divisible(c, tp)
    if c.layers % pp:
        raise PredictionError("pp", pp, f": {c.layers} layers do not split into {pp} stages evenly.")


def states(c: ModelConfig, ranks: int, replicate: int = 1, gathered: bool = False, precision: str = "fp32",
           tp: int = 1, pp: int = 1, stage: int = 0) -> dict:
    """{term: bytes} one rank holds; `gathered`: between forward and backward without reshard.
    With tp and pp, `ranks` is the whole world and a stage's tp slices are split over dp."""
    check(c, ranks, replicate, tp, pp)
    n, groups = ranks // (replicate * tp * pp), shapes(c, tp, pp, stage)
    psi_k = sum(shard_elements(g, n) for g in groups)
    whole = sum(rows * cols for g in groups for rows, cols in g)
    return {"parameters": 4 * psi_k + (BYTES[precision] * whole if gathered else 0),
            "gradients": 4 * psi_k, "master": 0, "moments": 8 * psi_k}


def collectives(c: ModelConfig, ranks: int, micro_batches: int, reshard: bool, replicate: int = 1,
                precision: str = "fp32") -> dict:
    """{(op, phase): (calls, bytes)} of one step on every rank."""
    check(c, ranks, replicate)
    n, p = ranks // replicate, BYTES[precision]
    padded = [n * shard_elements(g, n) for g in shapes(c)]
    calls, m = len(padded), micro_batches
    out = {("all_gather", "forward"): (calls * m, p * sum(padded) * m)}
    if reshard:
        out[("all_gather", "backward")] = (calls * m, p * sum(padded) * m)
    if replicate > 1:
        out[("all_reduce", "backward")] = (calls * m, 4 * sum(padded) // n * m)
    out[("reduce_scatter", "backward")] = (calls * m, 4 * sum(padded) * m)
    return dict(sorted(out.items()))


def composed_collectives(c: ModelConfig, ranks: int, micro_batches: int, tp: int, pp: int, stage: int) -> dict:
    """{(op, "step"): (calls, bytes)} of one step on a rank of FSDP2 x tp x pp (lab 11's
    torchtitan.py), but tensor parallelism's own (plscale.predict.tensor_parallel), after the
    first step (where torch's schedule runs an extra forward and backward to learn the shapes).

    torch's PipelineStage runs the m micro-batches' backwards with FSDP2's gradient sync off and
    without resharding after backward, and reduces once, at the step's end (perform_reduce_grad):
    one fp32 reduce-scatter a group a step, whatever m. A layer's group is freed after each
    forward (reshard after forward) and kept after each backward, so it is gathered at the step's
    first op and after every forward: m + 1 all-gathers, in any schedule's order (each of the m
    forwards is followed by another op). The stage's root group (embedding; norm, head) is not
    freed after forward (FSDP2's root): gathered once. The tied embedding and head then sum their
    dp shards between the first and last stage."""
    check(c, ranks, 1, tp, pp)
    n, groups, m = ranks // (tp * pp), shapes(c, tp, pp, stage), micro_batches
    padded = [4 * n * shard_elements(g, n) for g in groups]   # each group's whole, padded, fp32
    layers, root = padded[:c.layers // pp], padded[c.layers // pp:]
    out = {("all_gather", "step"): (len(layers) * (m + 1) + len(root), sum(layers) * (m + 1) + sum(root)),
           ("reduce_scatter", "step"): (len(padded), sum(padded))}
    if c.tie_embeddings and pp > 1 and stage in (0, pp - 1):
        out[("all_reduce", "step")] = (1, 4 * shard_elements([(c.vocab, c.hidden)], n))
    return out
