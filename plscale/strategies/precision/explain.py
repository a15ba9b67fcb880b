"""Lab 09's precision runs in words: the formats' table, what the loss scaler's log shows, and what
the gradient probe (loss_scaling.probe) found, as the lines the lab prints under its tables.
Pure functions of the results; each returns lines (one may hold a line break).

    for line in explain.formats(FORMATS[n] for n in ("fp32", "bf16", "fp16")): ctx.log(line)
    for line in explain.scaler(log.summary(), window): ctx.log("  " + line)
    for line in explain.probe(pr, overflowed_at, tokens): ctx.log("  " + line)
"""

import math

from plscale.predict.formats import FORMATS

FP16 = FORMATS["fp16"]


def power(v: float, spec: str = "g") -> str:
    """A scale as a power of 2: 2^16."""
    return f"2^{math.log2(v):{spec}}"


def clean_steps(window: int) -> str:
    return f"{window} clean step{'s' * (window > 1)}"


def formats(numbers) -> list[str]:
    """Each format's range and precision, from its bits (plscale/predict/formats.py)."""
    return [f"{'format':8}{'largest':>12}{'smallest normal':>17}{'smallest':>11}{'rounding error':>16}{'binades':>9}"] + [
        f"{f.name:8}{f.max:12.6g}{f.min_normal:17.3g}{f.min_subnormal:11.3g}{f.rounding_error:16.3g}{f.binades:9.0f}"
        for f in numbers]


def scaler(summary: dict, window: int) -> list[str]:
    """What one fp16 run's dynamic loss scale did (ScalerLog.summary()): the sawtooth, or why not."""
    if summary["overflows"]:
        return [f"an overflow: the scaled gradients passed fp16's largest, {FP16.max:g}, and became inf; the step is "
                f"skipped and the scale halves.\n  After {clean_steps(window)} it doubles to look for more room, "
                f"overflows again, halves: the sawtooth (loss_scale.png)"]
    return [f"no overflow: from {power(summary['smallest_scale'])} the scaled gradients stayed below fp16's largest, "
            f"{FP16.max:g}, so no step was skipped and the scale only " + (
                f"grew, doubling after each {clean_steps(window)}, to {power(summary['final_scale'])}; a larger "
                f"fp16.initial_scale_power, or more steps, reaches an overflow (the sawtooth)"
                if summary["growths"] else f"stayed: fewer than {clean_steps(window)} ran before the end")]


def probe(pr, overflowed_at: list[float], tokens: int) -> list[str]:
    """Why one probe (loss_scaling.Probe) overflowed where it did, or did not where the scaler did:
    `overflowed_at`, the scales at or below the probe's at which a run's step overflowed;
    `tokens`, the batch's."""
    peak = f"the largest |dW| x S, {pr.weights.largest_in}'s, is {power(pr.weights.largest, '.3g')}"
    if pr.carried:
        return [f"* at S = {power(pr.scale)} the gradient at {pr.layers[-1]}'s output overflowed, and the backward "
                f"carries the inf on: each dL/dx = dL/dy W\n    sums it with the rest (inf - inf = NaN), so the "
                f"{len(pr.carried)} layers after {pr.layers[-1]} are {100 * pr.carried_nonfinite:.1f}% inf or NaN "
                f"and say nothing about fp16's range;\n    the row covers the {len(pr.layers)} of "
                f"{len(pr.layers) + len(pr.carried)} layers up to the first inf (the step itself is skipped)"]
    if pr.weights.measured:
        return [f"no gradient at a linear's output overflows at S = {power(pr.scale)}, but the scaler checks the "
                f"weights' gradients, dW = the sum over\n    the batch's {tokens} tokens of dL/dy x "
                f"input, larger than any one dL/dy: on this batch {peak}, past {FP16.max:g}:\n    "
                f"{pr.weights.measured} entries inf (predicted from fp32 dW x S: {pr.weights.predicted}): at this "
                f"S the scaler would skip this batch's step"]
    if overflowed_at:
        return [f"the scaler overflowed at {', '.join(power(v) for v in overflowed_at)}, yet no gradient here does: it "
                f"checks the weights' gradients, dW = the sum over\n    the batch's tokens of dL/dy x input, and on this "
                f"batch {peak}, below {FP16.max:g} (inf: {pr.weights.measured}, predicted "
                f"{pr.weights.predicted});\n    those overflows came on other steps: other batches (every rank's: "
                f"the gradients are averaged before the check) and weights moved by the steps before"]
    return []


AUTOCAST_ACTIVATIONS = ("under autocast the weights, gradients and optimizer stay fp32 (predicted as fp32). Its "
                        "activations are not predicted:\n  the norms, softmax and loss keep fp32 tensors, each linear "
                        "keeps an fp16 copy of its input, and the memory model knows one width per activation")
CPU_FP16 = ("on a CPU without fp16 kernels, fp16 autocast is the slow one: each fp16 op runs a fallback path and casts "
            "to and from fp32; on GPUs 16-bit matmuls are the fast ones")


def scaler_check(summary: dict, broken: list[str], window: int) -> str:
    """The detail of the check that a run's scale followed dynamic loss scaling."""
    if broken:
        return "; ".join(broken[:3])
    return (f"{summary['overflows']} overflows, each skipped and halved; " if summary["overflows"] else
            "no overflow, nothing skipped; ") + \
        f"{summary['growths']} doubling{'s' * (summary['growths'] != 1)} after {clean_steps(window)}"


def probe_rows(labels: list[str], probes: list, columns: tuple) -> list[str]:
    """The probe's table: per scale, each column's fraction measured in fp16 / predicted from fp32 x S."""
    return [f"{'':22}{'flushed to 0':>20}{'subnormal (< 2^-14)':>24}{'overflowed':>20}"] + [
        f"{label:22}" + "".join(f"{100 * getattr(pr.measured, k):11.3f}% / {100 * getattr(pr.predicted, k):.3f}%"
                                .rjust(w) for k, w in zip(columns, (20, 24, 20))) + (" *" if pr.carried else "")
        for label, pr in zip(labels, probes)]


def losses(skipped: dict, unscaled: list[str]) -> list[str]:
    """What the loss curves show: skipped steps (run -> count), and fp16 without loss scaling."""
    out = []
    if any(skipped.values()):
        out.append("a skipped step (an overflow) does not move the weights: " + ", ".join(
            f"{run} trails by its {n} skipped step{'s' * (n > 1)}" for run, n in skipped.items() if n))
    if unscaled:
        out.append(f"How far fp16 without loss scaling ({', '.join(unscaled)}) falls behind depends on how many "
                   f"gradients it loses (the table above): a flushed gradient teaches nothing, a subnormal one keeps "
                   f"fewer bits")
    return out


def probe_figures(label: str, pr) -> list[dict]:
    """One probe's figures: the gradients flushed, subnormal and overflowed in fp16 (% of those
    non-zero in fp32), measured beside predicted, and the weight-gradient entries past 65504."""
    from plscale.rank.metrics import figure

    notes = {"flushed": ("flushed to 0", f"of {pr.measured.entries:,} non-zero in fp32, in {len(pr.layers)} layers"),
             "subnormal": ("subnormal", "fewer significant bits"), "overflowed": ("overflowed", "inf: past 65504")}
    return [figure(f"gradients {name} in fp16, {label}", round(100 * getattr(pr.measured, k), 4), "%",
                   round(100 * getattr(pr.predicted, k), 4), note) for k, (name, note) in notes.items()] + [
        figure(f"weight-gradient entries past 65504, {label}", pr.weights.measured, "entries", pr.weights.predicted,
               f"largest |dW| x S {pr.weights.largest:.4g} ({pr.weights.largest_in})")]


def widest_gap(labels: list[str], probes: list, columns: tuple) -> tuple[float, str, str]:
    """The largest gap, in fractions, between a measured and a predicted column: (gap, label, column)."""
    return max((abs(getattr(pr.measured, k) - getattr(pr.predicted, k)), label, k)
               for label, pr in zip(labels, probes) for k in columns)
