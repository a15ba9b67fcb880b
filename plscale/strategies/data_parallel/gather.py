"""Evaluation across ranks: gather every rank's predictions, keyed by sample index, so the
padding repeats of the sampler (plscale/strategies/data_parallel/sampler.py) are counted once.

    rank 0: idx [3 0 4]  pred [1 0 1]        all_gather        idx  0 1 2 3 4
    rank 1: idx [1 2 3]  pred [1 1 1]   ----------------->    pred  0 1 1 1 1   (3 twice, kept once)

Summing per-rank "correct" counts instead would count sample 3 twice and divide by 6.
"""

import torch
import torch.distributed as dist


def gather_predictions(indices: torch.Tensor, predictions: torch.Tensor, n: int) -> torch.Tensor:
    """Every rank passes the sample indices it scored and its predictions (the same count on
    every rank, as the sampler guarantees); every rank gets back the (n,) predictions of the
    whole split. Raises if a sample was scored by no rank."""
    pairs = torch.stack([indices.long(), predictions.long()])             # (2, per_rank)
    if dist.is_initialized() and dist.get_world_size() > 1:
        parts = [torch.empty_like(pairs) for _ in range(dist.get_world_size())]
        dist.all_gather(parts, pairs)
        pairs = torch.cat(parts, dim=1)
    out = torch.full((n,), -1, dtype=torch.long, device=pairs.device)
    out[pairs[0]] = pairs[1]                                                # repeats overwrite themselves
    missing = int((out < 0).sum())
    if missing:
        raise RuntimeError(f"{missing} of {n} samples were scored by no rank: the sampler lost them")
    return out


def accuracy(indices: torch.Tensor, predictions: torch.Tensor, labels: torch.Tensor) -> float:
    """Accuracy over the whole split, each sample once."""
    gathered = gather_predictions(indices, predictions, len(labels))
    return (gathered == labels.to(gathered.device)).float().mean().item()
