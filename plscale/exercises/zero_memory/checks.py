"""The checks of zero-memory (one rank): the student's formula against the project's memory
model, plscale.predict.memory (the paper's accounting, micro-batches accumulating), on cases
the student does not see. The formula itself lives only there."""

import math

from plscale.exercises.harness import Checks, expect
from plscale.predict.memory import Setup, estimate
from plscale.predict.units import GiB

CHECKS = Checks()
TERMS = ("parameters", "gradients", "optimizer")
MODELS = (124_439_808, 1_300_000_000, 6_738_415_616, 70_553_706_496)   # GPT-2 small, 1.3B, Llama 2 7B, 70B


def expected(params: int, stage: int, dp: int, precision: str, tp: int = 1, pp: int = 1) -> dict:
    """The memory model's bytes per rank; grad_accum 2: gradients whole at stage 1, as in the paper."""
    est = estimate(Setup(params=params, stage=stage, dp=dp, precision=precision, tp=tp, pp=pp, grad_accum=2))
    return {"parameters": est.term("parameters").total, "gradients": est.term("gradients").total,
            "optimizer": est.term("master").total + est.term("moments").total}


def _compare(student, stage: int, cases) -> None:
    for params, dp, precision, tp, pp in cases:
        got = student.zero_memory(params, stage, dp, precision, tp=tp, pp=pp)
        want = expected(params, stage, dp, precision, tp, pp)
        case = f"stage {stage}, {params / 1e9:.2f}B parameters, dp {dp}, {precision}" \
            + (f", tp {tp}, pp {pp}" if (tp, pp) != (1, 1) else "")
        for term in TERMS:
            value = got.get(term) if isinstance(got, dict) else None
            expect(isinstance(value, (int, float)), f"{case}: {term} is {value!r}, not a number of bytes")
            expect(math.isclose(value, want[term], rel_tol=1e-9),
                   f"{case}: {term} is wrong (yours {value / GiB:.4g} GiB)")


def _cases(tp: int = 1, pp: int = 1):
    return [(params, dp, precision, tp, pp) for params in MODELS for dp in (1, 2, 8, 64) for precision in ("bf16", "fp16")]


@CHECKS.add("returns a dict of bytes: parameters, gradients, optimizer",
            hint="Return {\"parameters\": ..., \"gradients\": ..., \"optimizer\": ...}, each a number of bytes.")
def returns_terms(student, rank, world):
    got = student.zero_memory(1_000_000, 0, 1, "bf16")
    expect(isinstance(got, dict), f"returned {type(got).__name__}, not a dict")
    missing = [t for t in TERMS if t not in got]
    expect(not missing, f"no {', '.join(missing)} in the dict")


@CHECKS.add("stage 0: every rank holds all three for all of its parameters",
            hint="Count the bytes per parameter of each term in mixed precision: the weights, their "
                 "gradients, and what Adam keeps in fp32.")
def stage0(student, rank, world):
    _compare(student, 0, _cases())


@CHECKS.add("stage 1: the optimizer states partitioned over the data-parallel ranks",
            hint="Stage 1 partitions one term only; the other two stay whole on every rank.")
def stage1(student, rank, world):
    _compare(student, 1, _cases())


@CHECKS.add("stage 2: the gradients partitioned too",
            hint="Stage 2 partitions what stage 1 did, and one term more.")
def stage2(student, rank, world):
    _compare(student, 2, _cases())


@CHECKS.add("stage 3: the parameters partitioned too",
            hint="At stage 3 no term stays whole.")
def stage3(student, rank, world):
    _compare(student, 3, _cases())


@CHECKS.add("tensor and pipeline parallelism: a rank holds its tp x pp share before ZeRO partitions it",
            hint="Model parallelism first divides the parameters a rank is responsible for; ZeRO then "
                 "partitions that share over dp.")
def model_parallel(student, rank, world):
    for stage in range(4):
        for tp, pp in ((2, 1), (8, 1), (1, 4), (8, 4)):
            _compare(student, stage, _cases(tp, pp))
