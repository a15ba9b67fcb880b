"""Where fp16 puts a gradient at a loss scale S: flushed to 0, subnormal, normal or overflowed.
Pure: the thresholds are plscale.predict.formats'; the mixed-precision lab (lab 09) counts real
gradients against them (plscale.strategies.precision.loss_scaling: predicted_underflow from fp32
gradients x S, measured_underflow from an fp16 backward) and prints the two side by side.

A gradient g (non-zero in fp32) is computed in fp16 as g x S. With the format's thresholds:

    |g| x S <= smallest subnormal / 2               flushed: rounds to 0
    smallest subnormal / 2 < |g| x S < smallest normal   subnormal: fewer significant bits
    |g| x S > largest                                overflowed: inf

fp16: smallest subnormal 2^-24, smallest normal 2^-14, largest 65504. The tests work on any
magnitude that compares elementwise (a float, a numpy array, a torch tensor): the rank side
passes whole tensors of |g| x S and sums what they say.

    >>> lands = Landing(2.0 ** 8)
    >>> lands.where(2.0 ** -40), lands.where(2.0 ** -30), lands.where(1.0), lands.where(2.0 ** 8)
    ('flushed', 'subnormal', 'normal', 'overflowed')
"""

from dataclasses import dataclass

from plscale.predict.formats import FORMATS, Format


@dataclass(frozen=True)
class Landing:
    """The bands a format puts fp32 magnitudes in once multiplied by the loss scale."""
    scale: float = 1.0
    format: Format = FORMATS["fp16"]

    def flushed(self, scaled):
        """|g| x S at or below half the smallest subnormal: 0 in the format."""
        return scaled <= self.format.flush_limit

    def subnormal(self, scaled):
        """|g| x S above the flush limit and below the smallest normal: kept with fewer bits."""
        return (scaled > self.format.flush_limit) & (scaled < self.format.min_normal)

    def overflowed(self, scaled):
        """|g| x S beyond the largest: inf."""
        return scaled > self.format.max

    def where(self, magnitude: float) -> str:
        """One fp32 magnitude |g|: flushed, subnormal, normal or overflowed at this scale."""
        scaled = abs(magnitude) * self.scale
        for band in ("flushed", "subnormal", "overflowed"):
            if getattr(self, band)(scaled):
                return band
        return "normal"


@dataclass
class Underflow:
    """Gradient entries (non-zero in fp32) against fp16's range, as fractions of them."""
    entries: int
    flushed: float      # rounded to 0: below half the smallest subnormal
    subnormal: float    # kept with fewer bits: below the smallest normal (flushed ones apart)
    overflowed: float   # beyond the largest: inf


def fractions(counts: list[tuple]) -> Underflow:
    """(entries, flushed, subnormal, overflowed) counts, tensor by tensor, as one Underflow."""
    entries = sum(c[0] for c in counts)
    return Underflow(entries, *(sum(c[i] for c in counts) / max(entries, 1) for i in (1, 2, 3)))
