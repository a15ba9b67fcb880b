"""The checks of pipeline-schedule, run in every rank (p = 2 and 4 stages, one per rank): the
orders against plscale.predict.pipeline (the lab's schedules, activations in flight and bubble
formula), then each schedule run for real over point-to-point messages (stages.py)."""

from plscale.exercises.harness import Checks, Failed, close, expect
from plscale.exercises.pipeline_schedule.stages import (
    Deadlock,
    problem,
    run_for_real,
    timeline,
)
from plscale.predict.pipeline import (
    bubble_fraction,
    bubble_of,
    in_flight,
    order,
    peak_in_flight,
)

CHECKS = Checks()
MICRO = (1, 2, 3, 8)     # micro-batch counts the orders are checked on
REAL_MICRO = 4           # micro-batches of the real run


def _orders(schedule, p: int, m: int) -> list:
    return [[tuple(x) for x in schedule(p, s, m)] for s in range(p)]


def _valid(schedule, p: int, m: int, name: str) -> None:
    for s, stage_order in enumerate(_orders(schedule, p, m)):
        wrong = problem(stage_order, m)
        expect(wrong is None, f"{name}(p={p}, s={s}, m={m}): {wrong}")


def _reference(schedule: str, p: int, s: int, m: int) -> list:
    return [(kind, micro) for kind, micro, _ in order(schedule, p, m, s)]


def _same_order(schedule, name: str, p: int) -> None:
    for m in MICRO:
        for s, stage_order in enumerate(_orders(schedule, p, m)):
            ref = _reference(name, p, s, m)
            at = next((k for k, (a, b) in enumerate(zip(stage_order, ref)) if a != b), None)
            expect(at is None and len(stage_order) == len(ref),
                   f"stage {s} of {p}, m = {m}: the order departs from {name} at step {at + 1 if at is not None else '?'}"
                   f" of {len(ref)}")


def _real_run(schedule, p: int, rank: int) -> None:
    """Every rank checks every stage's order first (the same on all ranks, so all skip alike)."""
    orders = _orders(schedule, p, REAL_MICRO)
    bad = next((problem(o, REAL_MICRO) for o in orders if problem(o, REAL_MICRO)), None)
    expect(bad is None, f"not run: with m = {REAL_MICRO} it is not a schedule ({bad})")
    try:
        timeline(orders)
    except Deadlock as exc:
        raise Failed(f"not run: the stages' orders deadlock ({exc})") from None
    got, expected = run_for_real(orders[rank], p, rank, REAL_MICRO)
    for name, g, e in zip(("weight", "bias"), got, expected):
        close(g, e, f"stage {rank}'s {name} gradient after {REAL_MICRO} micro-batches", atol=1e-6)


@CHECKS.add("gpipe: every micro-batch once forward and once backward, forward first",
            hint="Return a list of 2m pairs (\"F\", i) and (\"B\", i), i from 0 to m - 1.")
def gpipe_valid(student, rank, world):
    for m in MICRO:
        _valid(student.gpipe, world, m, "gpipe")


@CHECKS.add("gpipe: all forwards first, then all backwards, micro-batches in order",
            hint="GPipe does not interleave: the first backward waits until every forward has run.")
def gpipe_order(student, rank, world):
    _same_order(student.gpipe, "gpipe", world)


@CHECKS.add(f"gpipe runs for real over p2p on p ranks: gradients equal the whole model's (m = {REAL_MICRO})",
            hint="Fix the checks above first: a valid order runs.")
def gpipe_real(student, rank, world):
    _real_run(student.gpipe, world, rank)


@CHECKS.add("1f1b: every micro-batch once forward and once backward, forward first",
            hint="Return a list of 2m pairs (\"F\", i) and (\"B\", i); mind m smaller than the warm-up p - s - 1.")
def one_f_one_b_valid(student, rank, world):
    for m in MICRO:
        _valid(student.one_f_one_b, world, m, "one_f_one_b")


@CHECKS.add("1f1b: stage s holds at most p - s micro-batches' activations at once",
            hint="Count the forwards not yet matched by a backward as you walk the list: the warm-up decides it.")
def one_f_one_b_memory(student, rank, world):
    for m in MICRO:
        for s, stage_order in enumerate(_orders(student.one_f_one_b, world, m)):
            held, bound = peak_in_flight(stage_order), in_flight("1f1b", world, m, s)
            expect(held <= bound, f"stage {s} of {world}, m = {m}: {held} micro-batches in flight")


@CHECKS.add("1f1b: the bubble is GPipe's, (p-1)/(m+p-1) (simulated, backward = 2 forwards)",
            hint="Without enough warm-up forwards the later stages wait for work; count what stage s must send "
                 "on before its first backward can come back.")
def one_f_one_b_bubble(student, rank, world):
    for m in MICRO:
        orders = _orders(student.one_f_one_b, world, m)
        bad = next((problem(o, m) for o in orders if problem(o, m)), None)
        expect(bad is None, f"m = {m}: not a schedule ({bad})")
        try:
            ops = timeline(orders)
        except Deadlock as exc:
            raise Failed(f"m = {m}: the stages' orders deadlock ({exc})") from None
        got, want = bubble_of(ops), bubble_fraction(world, m)
        expect(abs(got - want) < 1e-9, f"m = {m}: {got:.1%} of the step idle, GPipe's bubble is {want:.1%}")


@CHECKS.add("1f1b: warm-up forwards, then one forward one backward, then the backwards left",
            hint="The warm-up shrinks by one per stage: the first stage needs the most forwards in flight, the "
                 "last none. Micro-batches stay in order within each kind.")
def one_f_one_b_order(student, rank, world):
    _same_order(student.one_f_one_b, "1f1b", world)


@CHECKS.add(f"1f1b runs for real over p2p on p ranks: gradients equal the whole model's (m = {REAL_MICRO})",
            hint="Fix the checks above first: a valid order runs.")
def one_f_one_b_real(student, rank, world):
    _real_run(student.one_f_one_b, world, rank)
