"""The collectives of one 4D training step outside the tp and cp groups (lab 11), per rank.

Host-side and pure. tp's all-reduces are tensor_parallel.collectives, cp's ring is
context_parallel.ring_bytes; the rest of a step, what a rank of pipeline stage `stage` issues:

    send forward    m activations [micro, s/cp, h] to the next stage (not the last stage);
                    [micro, s/(cp t), h] under sequence parallelism
    send backward   m gradients of the same shape to the previous stage (not the first)
    tied            one all-reduce of the tied embedding/head shard, V/t x h, over the first
                    and last stage of the pipeline (pp > 1, first and last stage only)
    dp-cp           the stage's gradients, Ψ_stage (tensor_parallel.stage_params) elements:
                    ZeRO 0  one all-reduce of them all, flattened
                    ZeRO 1  a reduce-scatter of them padded to N ceil(Ψ_stage / N), N = dp x cp,
                            then an all-gather of the parameters, as many

Each entry: (op, what) -> (calls, bytes), a call's bytes the whole tensor's (nccl-tests' S:
an all-reduce its buffer, a reduce-scatter its input, an all-gather its output).
"""

from plscale.predict.presets import ModelConfig
from plscale.predict.tensor_parallel import stage_params


def step_collectives(c: ModelConfig, tp: int, pp: int, stage: int, dp: int, cp: int, micro: int, seq: int,
                     micro_batches: int, zero_stage: int = 0, sp: bool = False, nbytes: int = 4) -> dict:
    """What one rank of stage `stage` sends or reduces per step besides tp's and cp's collectives."""
    out = {}
    boundary = micro * (seq // cp // (tp if sp else 1)) * c.hidden * nbytes
    if stage < pp - 1:
        out[("send", "forward")] = (micro_batches, micro_batches * boundary)
    if stage > 0:
        out[("send", "backward")] = (micro_batches, micro_batches * boundary)
    if pp > 1 and stage in (0, pp - 1):
        out[("all_reduce", "tied")] = (1, c.vocab * c.hidden // tp * nbytes)
    psi, n = stage_params(c, tp, pp, stage).total, dp * cp
    if zero_stage == 1:
        padded = -(-psi // n) * n * nbytes
        out[("reduce_scatter", "dp-cp")] = (1, padded)
        out[("all_gather", "dp-cp")] = (1, padded)
    else:
        out[("all_reduce", "dp-cp")] = (1, psi * nbytes)
    return out
