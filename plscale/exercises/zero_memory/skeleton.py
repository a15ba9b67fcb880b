"""Exercise zero-memory: the memory of one rank's model states at each ZeRO stage.

Lab 04 (labs/04_zero) measures it rank by rank; `plscale estimate memory` predicts it.
Check with

    plscale exercise check zero-memory

Mixed-precision training with Adam keeps, for each of the Ψ parameters a rank is
responsible for (Rajbhandari et al., ZeRO, 2020, section 3):

    parameters   p bytes each: 2 in bf16 or fp16
    gradients    p bytes each
    optimizer    K = 12 bytes each: an fp32 master copy of the parameter (4) and Adam's
                 two fp32 moments (4 + 4)

Without ZeRO (stage 0) each of the N data-parallel ranks holds all three for all Ψ. Each
stage partitions one more of them over the N ranks, so each rank keeps 1/N of it:
stage 1 the optimizer states; stage 2 the optimizer states and the gradients; stage 3 the
optimizer states, the gradients and the parameters.

Tensor and pipeline parallelism come first: with tp tensor-parallel and pp pipeline ranks
a rank is responsible for Ψ = params / (tp · pp) parameters, and ZeRO partitions that over
the N = dp data-parallel ranks.

Write zero_memory: the bytes one rank holds, as floats (no rounding). As in the paper, the
gradients are held whole while micro-batches accumulate at stage 1 (DeepSpeed also
partitions them when each step has a single micro-batch: not part of this exercise).
The checks compare it with the project's memory model on cases you do not see.
"""


def zero_memory(params: int, stage: int, dp: int, precision: str = "bf16", tp: int = 1, pp: int = 1) -> dict:
    """Bytes per rank: {"parameters": ..., "gradients": ..., "optimizer": ...}.

    params: the model's parameters; stage: ZeRO stage 0-3; dp: data-parallel ranks N;
    precision: "bf16" or "fp16"; tp, pp: tensor- and pipeline-parallel ranks."""
    # TODO: your code here
    raise NotImplementedError("zero_memory")
