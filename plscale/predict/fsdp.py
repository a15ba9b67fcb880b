"""FSDP2 on paper: what each rank holds and what one step sends (plscale.strategies.fsdp).

Host-side and pure. Groups: every decoder layer one, the root the rest (the embedding and its
tied head, the final norm). N = the shard group's ranks (HSDP: a 2D mesh of R replicas x N).

Memory (torch.distributed.fsdp, fully_shard's docstring and _fsdp_param.py, torch 2.13). Each
tensor is split on dim 0 into N chunks of k = ceil(rows / N) rows, padded: a rank holds
k x cols elements of every tensor, Ψ_k in all (Ψ/N when N divides every dim 0). In fp32 and in
FSDP2's mixed precision (bf16 compute, fp32 reduction) alike:

    parameters   4Ψ_k          the sharded fp32 parameters, which the optimizer steps: no master
                 + pΨ gathered  between a micro-batch's forward and its backward, without reshard
                                (p: the compute dtype's bytes, 2 in bf16)
    gradients    4Ψ_k          sharded, reduce-scattered after every micro-batch's backward
    moments      8Ψ_k          Adam's two, sharded like the parameters

DeepSpeed's ZeRO-3 in fp32 holds 20Ψ/N (plscale.predict.memory: it keeps a 4Ψ/N master partition
even of an fp32 model); FSDP2 16Ψ/N.

Collectives a step, m micro-batches, G = layers + 1 groups, each group's bytes B_g = N k_g
cols (its padded whole):

    all_gather forward       G m calls   the gathered B_g in the compute dtype
    all_gather backward      G m calls   with reshard (gathered again), none without
    reduce_scatter backward  G m calls   the group's B_g of gradients in the reduction dtype
    all_reduce backward      G m calls   HSDP only: each shard (B_g / N) across the R replicas
"""

from plscale.predict.errors import PredictionError
from plscale.predict.presets import ModelConfig
from plscale.predict.units import BYTES


def shapes(c: ModelConfig) -> list[list[tuple[int, int]]]:
    """(rows, cols) of each parameter, group by group: every layer's, then the root's."""
    d, kv, f = c.hidden, c.kv_dim, c.ffn
    layer = [(d, 1), (d, d), (kv, d), (kv, d), (d, d), (d, 1), (f, d), (f, d), (d, f)]
    root = [(c.vocab, d), (d, 1), *([] if c.tie_embeddings else [(c.vocab, d)])]
    return [layer] * c.layers + [root]


def shard_elements(group: list[tuple[int, int]], n: int) -> int:
    """Elements one rank holds of a group: k = ceil(rows / n) rows of every tensor."""
    return sum(-(-rows // n) * cols for rows, cols in group)


def check(c: ModelConfig, ranks: int, replicate: int) -> None:
    if replicate < 1 or ranks % replicate:
        raise PredictionError("replicate", replicate, f" does not divide {{ranks}} {ranks}: HSDP's mesh is "
                              f"replicate x shard, so use 1 or a divisor of {ranks}.")


def states(c: ModelConfig, ranks: int, replicate: int = 1, gathered: bool = False, precision: str = "fp32") -> dict:
    """{term: bytes} one rank holds; `gathered`: between forward and backward without reshard."""
    check(c, ranks, replicate)
    n = ranks // replicate
    psi_k = sum(shard_elements(g, n) for g in shapes(c))
    whole = sum(rows * cols for g in shapes(c) for rows, cols in g)
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
