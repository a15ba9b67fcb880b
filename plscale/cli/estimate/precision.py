"""`plscale estimate precision`: number formats' range and precision from their bits, and the
bytes per parameter each training precision keeps. Registered on `plscale estimate`
(plscale/cli/estimate/__init__.py)."""

import json

import typer
from rich.table import Table

from plscale.cli.flags import speaks_flags
from plscale.cli.output import console
from plscale.predict.formats import FORMATS
from plscale.predict.memory import LABELS, MODEL_STATES, Setup, estimate

TRAINING_PRECISIONS = ("fp32", "bf16", "fp16")


def format_rows() -> list[dict]:
    """Each format's bits, range and precision (plscale/predict/formats.py)."""
    return [{"name": f.name, "bits": f.bits, "exponent_bits": f.exponent_bits, "mantissa_bits": f.mantissa_bits,
             "max": f.max, "min_normal": f.min_normal, "min_subnormal": f.min_subnormal, "epsilon": f.epsilon,
             "rounding_error": f.rounding_error, "binades": f.binades, "torch_dtype": f.torch_name}
            for f in FORMATS.values()]


def bytes_per_parameter(precision: str) -> dict[str, float]:
    """Model states per parameter at ZeRO stage 0, from the memory model: parameters, gradients,
    fp32 master, Adam moments, and their sum."""
    terms = {t.name: t.total for t in estimate(Setup(params=1, stage=0, precision=precision)).terms}
    return {**{name: terms[name] for name in MODEL_STATES}, "total": sum(terms[name] for name in MODEL_STATES)}


@speaks_flags()
def precision(
    as_json: bool = typer.Option(False, "--json", help="Print the formats and the bytes per parameter as JSON."),
) -> None:
    """Number formats from their bits, and the bytes per parameter of each training precision.

    A float is (-1)^sign x 2^(exponent - bias) x 1.mantissa: e exponent bits,
    m mantissa bits, bias 2^(e-1) - 1. Largest (2 - 2^-m) x 2^bias (e4m3:
    448, its top exponent holds numbers), smallest normal 2^(1-bias),
    smallest subnormal 2^(1-bias-m), epsilon 2^-m, rounding error at most
    2^-(m+1). Training at ZeRO stage 0 keeps p bytes per weight and per
    gradient (4 fp32, 2 bf16/fp16), a 4-byte fp32 master copy in mixed
    precision (fp32 steps the weights themselves) and 8 bytes of Adam
    moments. See plscale/predict/formats.py and plscale/predict/memory.py.
    """
    formats = format_rows()
    states = {p: bytes_per_parameter(p) for p in TRAINING_PRECISIONS}
    if as_json:
        typer.echo(json.dumps({"formats": formats, "bytes_per_parameter": states}, indent=2))
        return

    table = Table(title="number formats: range and precision from their bits", title_justify="left")
    for column in ("format", "bits", "e", "m", "largest", "smallest normal", "smallest subnormal", "epsilon",
                   "max rounding error", "binades"):
        table.add_column(column, justify="left" if column == "format" else "right")
    for f in formats:
        table.add_row(f["name"], str(f["bits"]), str(f["exponent_bits"]), str(f["mantissa_bits"]),
                      *(f"{f[key]:.4g}" for key in ("max", "min_normal", "min_subnormal", "epsilon",
                                                     "rounding_error")), f"{f['binades']:.0f}")
    console.print(table)
    console.print("e4m3 (fn) has no inf: its top exponent holds numbers, largest 448; e5m2 keeps inf and NaN, "
                  "largest 57344.", highlight=False)

    table = Table(title="bytes per parameter, ZeRO stage 0, Adam (plscale/predict/memory.py)", title_justify="left")
    for column in ("precision", *(LABELS[name] for name in MODEL_STATES), "total"):
        table.add_column(column, justify="left" if column == "precision" else "right")
    for p, row in states.items():
        table.add_row(p, *(f"{row[name]:g}" for name in MODEL_STATES), f"[bold]{row['total']:g}[/]")
    console.print(table)
    console.print("mixed precision halves the weights and gradients and adds an fp32 master copy (small updates "
                  "would round away in 16 bits): the same 16 bytes a parameter; it saves activations and time.",
                  highlight=False)
