"""Measured beside predicted: the tables and checks labs print for memory per rank and for the
collectives of a step, each measurement next to what plscale/predict says it should be.

    everyone = gathered(census(zero_states(engine)))            # rank.distributed: every rank calls it
    rows = per_rank(everyone, (*MODEL_STATES, "model_states"))   # name -> [bytes on rank 0, 1, ...]
    if ctx.is_main:
        ctx.log("\\nmemory per rank, MiB, measured / predicted")
        shown, figures = memory_table(ctx.log, rows, predicted)      # predicted: name -> bytes
        ctx.check(*within("model states match the model",
                          [(v, predicted["model_states"]) for v in rows["model_states"]], tolerance))

        wire = collectives_table(ctx.log, tally, want, ranks)     # (op, phase) -> (calls, bytes)
        ctx.check(*same_collectives("collectives per step as predicted", tally, want))

Every check comes back as a Check, (name, ok, detail), which ctx.check takes as it is.
"""

from plscale.predict.busbw import bus_factor
from plscale.predict.memory import LABELS, MODEL_STATES
from plscale.predict.units import MiB
from plscale.rank.against_dense import Check
from plscale.rank.metrics import figure


def per_rank(everyone: list[dict], names) -> dict:
    """name -> [that count on rank 0, 1, ...] from every rank's census; "model_states" is the
    sum of the four model states (parameters, gradients, fp32 master, Adam's moments)."""
    return {name: [sum(m[k] for k in MODEL_STATES) if name == "model_states" else m[name] for m in everyone]
            for name in names}


def largest_error(pairs) -> float:
    """The largest relative error of (measured, predicted) pairs: |measured - predicted| / predicted."""
    return max(abs(got - want) / want for got, want in pairs)


def within(name: str, pairs, tolerance: float, what: str = "worst rank", digits: int = 2) -> Check:
    """Passes when every (measured, predicted) pair is within `tolerance` (relative)."""
    worst = largest_error(pairs)
    return Check(name, worst <= tolerance, f"{what} off by {100 * worst:.{digits}f}% (tolerance {100 * tolerance:g}%)")


def mib_figure(name: str, measured: float, predicted: float | None = None, note: str = "") -> dict:
    """A figure in MiB from bytes, measured beside predicted (None: not predicted)."""
    return figure(name, round(measured / MiB, 3), "MiB", None if predicted is None else round(predicted / MiB, 3), note)


def memory_table(log, rows: dict, predicted: dict, labels: dict = LABELS, width: int = 34) -> tuple[dict, list]:
    """One line per row, MiB on each rank beside the prediction and the worst rank's error.
    rows: name -> [bytes per rank]; predicted: name -> bytes (missing or None: measured only).
    Returns ({name: {"measured_bytes", "predicted_bytes"}}, the figures of the predicted rows)."""
    log(f"  {'':{width}}" + "".join(f"{'rank ' + str(r):>10}" for r in range(len(next(iter(rows.values())))))
        + f"{'predicted':>11}{'error':>9}")
    shown, figures = {}, []
    for name, values in rows.items():
        guess = predicted.get(name)
        line = f"  {labels[name]:{width}}" + "".join(f"{v / MiB:10.2f}" for v in values)
        if guess is not None:
            error = largest_error((v, guess) for v in values) if guess else 0.0 if set(values) == {0} else None
            line += f"{guess / MiB:11.2f}" + ("" if error is None else f"{100 * error:8.1f}%")
            figures.append(mib_figure(f"{labels[name]} per rank (max)", max(values), guess,
                                      "" if error is None else f"error {100 * error:.1f}%"))
        log(line)
        shown[name] = {"measured_bytes": values, "predicted_bytes": guess}
    return shown, figures


def collectives_table(log, measured: dict, predicted: dict, ranks: int) -> float:
    """(op, phase) -> (calls, bytes of each call's whole tensor, nccl-tests' S) measured and
    predicted: one line each, and what a ring of `ranks` makes each rank send. Returns those
    bytes on the wire, all collectives together (measured)."""
    wire = 0.0
    for key in sorted(set(predicted) | set(measured)):
        (calls, nbytes), (want_calls, want_bytes) = measured.get(key, (0, 0)), predicted.get(key, (0, 0))
        sent = nbytes * bus_factor(key[0], ranks)
        wire += sent
        log(f"  {key[0]:15}{key[1]:9}{calls:5} / {want_calls:<5} calls {nbytes / MiB:9.3f} / {want_bytes / MiB:.3f} MiB   "
            f"{sent / MiB:7.3f} MiB on the wire")
    return wire


def per_rank_counts(log, name: str, everyone) -> Check:
    """One line per rank of its (op, what) -> (calls, bytes) measured / predicted, MiB; everyone:
    [(measured, predicted)] by rank. Passes when every rank's equal its prediction."""
    for r, (got, want) in enumerate(everyone):
        log(f"  r{r}  " + ";  ".join(f"{op} {what} {got.get((op, what), (0, 0))[0]}/{c} "
                                     f"{got.get((op, what), (0, 0))[1] / MiB:.3f}/{b / MiB:.3f}"
                                     for (op, what), (c, b) in want.items()))
    return Check(name, all(got == want for got, want in everyone),
                 f"{sum(c for got, _ in everyone for c, _ in got.values())} calls measured on {len(everyone)} ranks, "
                 f"{sum(c for _, want in everyone for c, _ in want.values())} predicted")


def same_collectives(name: str, measured: dict, predicted: dict) -> Check:
    """Passes when every (op, phase) ran as many calls of as many bytes as predicted."""
    return Check(name, measured == predicted,
                 f"{sum(c for c, _ in measured.values())} calls, {sum(b for _, b in measured.values()) / MiB:.2f} MiB "
                 f"measured; {sum(c for c, _ in predicted.values())} calls predicted")


def in_mib(shown: dict, names: dict | None = None) -> dict:
    """memory_table's rows ({name: {"measured_bytes", "predicted_bytes"}}) as the bars of one
    panel of plots.measured_vs_predicted: {label: (measured MiB, predicted MiB or None)};
    `names`: name -> its label (default: the name)."""
    return {(names or {}).get(name, name): (v["measured_bytes"] / MiB,
                                            None if v["predicted_bytes"] is None else v["predicted_bytes"] / MiB)
            for name, v in shown.items()}
