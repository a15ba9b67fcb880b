"""Reference solution of the zero-memory exercise (the task: skeleton.py). Not copied by
`plscale exercise start`; plscale/predict/memory.py is the project's whole model (offload,
fp32, DeepSpeed's own accounting, activations)."""

BYTES = {"bf16": 2, "fp16": 2}
OPTIMIZER = 12  # fp32 master 4 + Adam's moments 4 + 4


def zero_memory(params: int, stage: int, dp: int, precision: str = "bf16", tp: int = 1, pp: int = 1) -> dict:
    """Bytes per rank: {"parameters": ..., "gradients": ..., "optimizer": ...}."""
    psi, p = params / (tp * pp), BYTES[precision]
    return {"parameters": p * psi / (dp if stage >= 3 else 1),
            "gradients": p * psi / (dp if stage >= 2 else 1),
            "optimizer": OPTIMIZER * psi / (dp if stage >= 1 else 1)}
