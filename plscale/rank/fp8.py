"""Casting real tensors to fp8, with and without per-tensor scaling, measured against the
formats' predictions (plscale.predict.formats).

    e4m3  4 exponent bits, 3 mantissa: largest 448, smallest 2^-9, rounding error 2^-4
    e5m2  5 exponent bits, 2 mantissa: largest 57344, smallest 2^-16, rounding error 2^-3

Sixteen to eighteen binades: far fewer than the spread of a model's activations and
gradients. Per-tensor scaling moves each tensor into the format: s = format max / amax(x),
q = fp8(x s), and x is read back as q / s, so the largest entry lands on the format's largest
value and nothing overflows; what falls below the smallest subnormal is still lost. Recipes
use e4m3 (precision) for activations and weights, e5m2 (range) for gradients.

For one tensor and format, `cast` measures, beside what the format predicts from the values:
    flushed      non-zero entries that became 0       predicted: |x s| <= smallest / 2
    clipped      entries beyond the largest, cast to the largest or to inf (infinite: e5m2 gives
                 inf past 57344 + half a step; torch saturates e4m3 at 448)
                                                       predicted: |x s| > largest
    worst error  the largest relative error of an entry in the normal range
                                                       predicted at most: 2^-(m+1)
    error        ||q / s - x|| / ||x|| over the tensor (inf if an entry overflowed)
"""

import math
from dataclasses import asdict, dataclass

import torch

from plscale.predict.formats import Format


@dataclass
class Cast:
    entries: int = 0            # non-zero entries
    flushed: int = 0
    flushed_predicted: int = 0
    clipped: int = 0
    clipped_predicted: int = 0
    infinite: int = 0
    normal: int = 0             # entries in the normal range, where the rounding bound holds
    worst_error: float = 0.0    # largest relative error of a normal-range entry
    error_sum: float = 0.0      # sum over tensors of ||q / s - x|| / ||x||
    tensors: int = 0

    def add(self, other: "Cast") -> "Cast":
        out = Cast(**{k: v + getattr(other, k) for k, v in asdict(self).items()})
        out.worst_error = max(self.worst_error, other.worst_error)
        return out

    @property
    def error(self) -> float:
        """The tensors' relative error, averaged over tensors."""
        return self.error_sum / max(self.tensors, 1)

    def fractions(self) -> dict:
        n = max(self.entries, 1)
        return {"flushed": self.flushed / n, "flushed_predicted": self.flushed_predicted / n,
                "clipped": self.clipped / n, "clipped_predicted": self.clipped_predicted / n,
                "infinite": self.infinite / n,
                "normal": self.normal / n, "worst_error": self.worst_error, "error": self.error}


def per_tensor_scale(x: torch.Tensor, fmt: Format) -> float:
    """s = format max / amax(x): the largest entry lands on the format's largest value."""
    amax = x.detach().abs().max().item()
    return fmt.max / amax if amax > 0 else 1.0


def cast(x: torch.Tensor, fmt: Format, scaled: bool) -> Cast:
    """Cast one tensor to `fmt` (with per-tensor scaling or not) and measure what was lost."""
    x = x.detach().float().flatten()
    s = per_tensor_scale(x, fmt) if scaled else 1.0
    y = (x * s).clamp(-fmt.max, fmt.max) if scaled else x  # amax x s may round a hair above max
    q = y.to(getattr(torch, fmt.torch_name)).float()
    nonzero, size = x != 0, y.abs()
    normal = nonzero & (size >= fmt.min_normal) & (size <= fmt.max)
    relative = ((q - y).abs() / size)[normal]
    back = q / s
    error = ((back - x).norm() / x.norm()).item() if x.norm() > 0 else 0.0
    return Cast(entries=int(nonzero.sum()), flushed=int((nonzero & (q == 0)).sum()),
                flushed_predicted=int((nonzero & (size <= fmt.min_subnormal / 2)).sum()),
                clipped=int(((size > fmt.max) & ((q.abs() == fmt.max) | ~q.isfinite())).sum()),
                clipped_predicted=int((size > fmt.max).sum()), infinite=int((~q.isfinite()).sum()),
                normal=int(normal.sum()),
                worst_error=relative.max().item() if relative.numel() else 0.0,
                error_sum=float("inf") if math.isnan(error) else error, tensors=1)


def cast_all(tensors, fmt: Format, scaled: bool) -> Cast:
    """`cast` over many tensors (each with its own scale), the counts summed."""
    total = Cast()
    for t in tensors:
        total = total.add(cast(t, fmt, scaled))
    return total


def scaled(tensors, fmt: Format) -> list[torch.Tensor]:
    """Each tensor times its per-tensor scale (for histograms of what the format sees)."""
    return [t.detach().float() * per_tensor_scale(t, fmt) for t in tensors]
