"""What DeepSpeed's checkpoint leaves out, and an exact resume needs: every random stream.

DeepSpeed saves model, optimizer and scheduler; its `client_state` is written by rank 0
only. So each rank saves its own file: Python's, NumPy's and torch's RNG (CPU, and every
CUDA device). The data position needs no state of its own here: the lab's shards give
the batch of step t as a pure function of (seed, t), so the step number is the position.
"""

import random
from pathlib import Path

import numpy as np
import torch


def file_name(rank: int) -> str:
    return f"rank_{rank}_rng.pt"


def capture() -> dict:
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def save(folder: Path, rank: int) -> None:
    torch.save(capture(), Path(folder) / file_name(rank))


def restore(folder: Path, rank: int) -> bool:
    """Put this rank's random streams back; False when the checkpoint has no file for it
    (another world size: the run goes on from fresh streams, close but not bit-exact)."""
    path = Path(folder) / file_name(rank)
    if not path.is_file():
        return False
    state = torch.load(path, weights_only=False)
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    return True
