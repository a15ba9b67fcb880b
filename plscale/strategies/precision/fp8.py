"""Casting real tensors to fp8, with and without per-tensor scaling, measured against the
formats' predictions (plscale.predict.formats).

    e4m3  4 exponent bits, 3 mantissa: largest 448, smallest 2^-9, rounding error 2^-4
    e5m2  5 exponent bits, 2 mantissa: largest 57344, smallest 2^-16, rounding error 2^-3

About 18 binades (e4m3) or 32 (e5m2): fewer than the spread of a model's activations and
gradients together. Per-tensor scaling moves each tensor into the format: s = format max /
amax(x) (rounded down so that amax x s stays within max), q = fp8(x s), and x is read back as
q / s, so the largest entry lands on the format's largest value and nothing overflows; what
falls below the smallest subnormal is still lost. Recipes use e4m3 (precision) for
activations and weights, e5m2 (range) for gradients.

For one tensor and format, `cast` measures from the cast result q, beside what the format
predicts from x s alone (`Format.flush_limit`, `Format.max`):
    flushed      non-zero entries whose q is 0          predicted: |x s| <= smallest / 2
    clipped      entries whose q is inf or NaN, or saturated at the largest from beyond it
                 (e5m2 gives inf past 57344 + half a step; torch saturates e4m3 at 448)
                                                        predicted: |x s| > largest
    worst error  the largest relative error of an entry in the normal range
                                                        predicted at most: 2^-(m+1)
    error        ||q / s - x|| / ||x|| of each tensor (inf if an entry overflowed); `Cast.error`
                 is its mean over the tensors cast
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
        """The mean over the tensors of each one's ||q / s - x|| / ||x||."""
        return self.error_sum / max(self.tensors, 1)

    def fractions(self) -> dict:
        n = max(self.entries, 1)
        return {"flushed": self.flushed / n, "flushed_predicted": self.flushed_predicted / n,
                "clipped": self.clipped / n, "clipped_predicted": self.clipped_predicted / n,
                "infinite": self.infinite / n,
                "normal": self.normal / n, "worst_error": self.worst_error, "error": self.error}


def per_tensor_scale(x: torch.Tensor, fmt: Format) -> float:
    """s = format max / amax(x), in fp32 and rounded down until amax x s <= max: the largest
    entry lands on the format's largest value, not a hair beyond it."""
    amax = x.detach().abs().max().float()
    if amax == 0:
        return 1.0
    s = torch.tensor(fmt.max, dtype=torch.float32, device=amax.device) / amax
    while amax * s > fmt.max:
        s = torch.nextafter(s, torch.zeros_like(s))
    return s.item()


def cast(x: torch.Tensor, fmt: Format, scaled: bool) -> Cast:
    """Cast one tensor to `fmt` (with per-tensor scaling or not) and measure what was lost."""
    x = x.detach().float().flatten()
    s = per_tensor_scale(x, fmt) if scaled else 1.0
    y = x * s                                   # what the format is asked to hold
    q = y.to(getattr(torch, fmt.torch_name)).float()
    nonzero, size = x != 0, y.abs()
    beyond = size > fmt.max
    normal = nonzero & (size >= fmt.min_normal) & ~beyond
    relative = ((q - y).abs() / size)[normal]
    error = ((q / s - x).norm() / x.norm()).item() if x.norm() > 0 else 0.0
    lost_top = ~q.isfinite() | ((q.abs() == fmt.max) & beyond)  # from q: inf/NaN, or saturated from beyond
    return Cast(entries=int(nonzero.sum()), flushed=int((nonzero & (q == 0)).sum()),
                flushed_predicted=int((nonzero & (size <= fmt.flush_limit)).sum()),
                clipped=int((nonzero & lost_top).sum()), clipped_predicted=int(beyond.sum()),
                infinite=int((~q.isfinite()).sum()), normal=int(normal.sum()),
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
