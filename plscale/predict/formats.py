"""Floating-point formats from their bits: range and precision, predicted before any cast.

A float is (-1)^sign x 2^(exponent - bias) x 1.mantissa, with e exponent bits and m mantissa
bits. From e and m alone, for the IEEE-style formats:

    bias            2^(e-1) - 1
    largest         (2 - 2^-m) x 2^bias          (the top exponent is kept for inf and NaN)
    smallest normal 2^(1 - bias)
    smallest        2^(1 - bias - m)             (subnormal: below it, a value rounds to 0)
    epsilon         2^-m                         (the gap after 1.0)
    rounding error  2^-(m+1)                     (relative, at most, for a normal value)

Where a value x lands (round to nearest even), the one classification every cast is measured
against (`flush_limit`, `max`):
    |x| <= smallest / 2                    flushed to 0 (half the smallest subnormal ties to even: 0)
    smallest / 2 < |x| < smallest normal   subnormal: fewer significant bits
    |x| > largest                          beyond the largest: inf, or saturated at the largest

FP8's e4m3 ("fn": finite, no inf) keeps only one bit pattern for NaN and uses the top
exponent for numbers: its largest is 1.75 x 2^8 = 448, not 240. e5m2 is IEEE-style
(largest 57344). Host-side and pure: `plscale estimate precision` prints the table, and the
mixed-precision lab prints each prediction beside what casting real tensors gives.
"""

import math
from dataclasses import dataclass

from plscale.errors import did_you_mean
from plscale.predict.errors import PredictionError


@dataclass(frozen=True)
class Format:
    name: str
    exponent_bits: int
    mantissa_bits: int
    finite_only: bool = False   # e4m3fn: the top exponent holds numbers too (no inf)
    torch_name: str = ""        # the torch dtype's name (torch.float8_e4m3fn, ...)

    @property
    def bits(self) -> int:
        return 1 + self.exponent_bits + self.mantissa_bits

    @property
    def bias(self) -> int:
        return 2 ** (self.exponent_bits - 1) - 1

    @property
    def max(self) -> float:
        if self.finite_only:  # all exponents are numbers; mantissa all-ones at the top is NaN
            return (2 - 2 ** -(self.mantissa_bits - 1)) * 2.0 ** (self.bias + 1)
        return (2 - 2 ** -self.mantissa_bits) * 2.0 ** self.bias

    @property
    def min_normal(self) -> float:
        return 2.0 ** (1 - self.bias)

    @property
    def min_subnormal(self) -> float:
        return 2.0 ** (1 - self.bias - self.mantissa_bits)

    @property
    def flush_limit(self) -> float:
        """|x| at or below it rounds to 0: half the smallest subnormal."""
        return self.min_subnormal / 2

    @property
    def epsilon(self) -> float:
        return 2.0 ** -self.mantissa_bits

    @property
    def rounding_error(self) -> float:
        """The largest relative error of rounding a value in the normal range to this format."""
        return 2.0 ** -(self.mantissa_bits + 1)

    @property
    def binades(self) -> float:
        """Powers of two between the smallest subnormal and the largest value."""
        return math.log2(self.max / self.min_subnormal)


FORMATS = {
    "fp32": Format("fp32", 8, 23, torch_name="float32"),
    "bf16": Format("bf16", 8, 7, torch_name="bfloat16"),
    "fp16": Format("fp16", 5, 10, torch_name="float16"),
    "e4m3": Format("e4m3", 4, 3, finite_only=True, torch_name="float8_e4m3fn"),
    "e5m2": Format("e5m2", 5, 2, torch_name="float8_e5m2"),
}


def number_format(name: str) -> Format:
    if name not in FORMATS:
        raise PredictionError("format", name, f"No number format {name!r}.{did_you_mean(name, FORMATS)} "
                                              f"Formats: {', '.join(FORMATS)}.", lead=False)
    return FORMATS[name]
