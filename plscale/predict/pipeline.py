"""Pipeline schedules on paper: the order of work per rank, its timeline, the bubble.

Pure Python. p pipeline ranks (stages), m micro-batches per step, v model chunks per rank
(interleaved only: virtual stage = chunk * p + rank). A forward of one (virtual) stage
takes f, its backward b (the planned unit: f = 1, b = 2).

    gpipe        all F, then all B (GPipe; picotron's AFAB)           holds m micro-batches
    1f1b         p-rank-1 F, then F B F B ..., then the B left        holds min(m, p-rank)
    interleaved  1F1B over v chunks, Megatron's order (m % p == 0)    smaller bubble, v x the p2p
    zb           ZB-H1: 1F1B with B split in B (input grad) and W (weight grad)

Each rank idles (p-1)(f+b) per step in gpipe and 1f1b: the first forward takes (p-1)f to
reach the last stage, the last backward (p-1)b to come back. Busy m(f+b), so

    bubble = (p-1) / (m + p-1)          interleaved: (p-1) / (v*m + p-1)

(with v chunks the fill and drain go through chunks of 1/v of the model). 1F1B, p = 4,
m = 8, drawn with f = b = 1 (`text_timeline(simulate("1f1b", 4, 8, b=1))`):

    rank 0  F0 F1 F2 F3 .. .. .. B0 F4 B1 F5 B2 F6 B3 F7 B4 .. B5 .. B6 .. B7
    rank 1  .. F0 F1 F2 .. .. B0 F3 B1 F4 B2 F5 B3 F6 B4 F7 B5 .. B6 .. B7 ..
    rank 2  .. .. F0 F1 .. B0 F2 B1 F3 B2 F4 B3 F5 B4 F6 B5 F7 B6 .. B7 .. ..
    rank 3  .. .. .. F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5 F6 B6 F7 B7 .. .. ..

ZB-H1 (Qi et al., "Zero Bubble Pipeline Parallelism", 2023): a B only waits for the next
stage's B, a W only for its own B, so the backward comes back faster and the W's fill the
drain. What is implemented: 1F1B's order, each B followed by its W, except that rank r lets
up to r W's wait (the last rank the most: it is the one idle at the end, as in the paper's
figure); the waiting W's run at the end. Activations held are 1F1B's. With B = b - w and
W = w (default b/2) and m >= p, each rank idles

    (p-1)(f + B - W)      when W <= f and W <= B (the paper's case); in general
    (p-1) max(f, B, f + B - W)                      (found by simulation)

so f = B = W gives (p-1) / (3m + p-1): a third of 1F1B's idle time. (Letting rank 0 keep
the most W's instead gives exactly 1F1B's bubble: nothing there to fill.)

`simulate` runs a schedule's orders against the dependencies (F on stage s after F on s-1,
B on s after B on s+1, the last stage's B after its F, W after its B; communication is free)
through `play`, which runs any explicit orders (the pipeline-schedule exercise plays the
student's); `bubble_of` measures a timeline's idle fraction, planned or measured.
"""

from dataclasses import dataclass

from plscale.errors import did_you_mean
from plscale.predict.errors import PredictionError


@dataclass(frozen=True)
class Op:
    """One piece of work on one pipeline rank: planned (time in units of one forward) or
    measured (seconds of time.perf_counter(), made relative to the step's start for drawing)."""
    rank: int          # pipeline rank: the row it is drawn on (0 .. p-1)
    kind: str          # "F" forward, "B" backward, "W" weight gradients (zero bubble), "send", "recv"
    micro: int         # micro-batch, 0 .. m-1
    start: float
    end: float
    stage: int = -1    # the (virtual) stage it ran on; -1: the rank's only stage (= rank)

    def to_dict(self) -> dict:
        return {"rank": self.rank, "kind": self.kind, "micro": self.micro, "start": self.start,
                "end": self.end, "stage": self.stage}


SCHEDULES = ("gpipe", "1f1b", "interleaved", "zb")
COMPUTE = ("F", "B", "W")


def check(schedule: str, p: int, m: int, v: int = 1) -> None:
    """A schedule's inputs, each error naming its quantity: schedule, stages (p), micro (m), virtual (v)."""
    if schedule not in SCHEDULES:
        raise PredictionError("schedule", schedule, f"Unknown schedule {schedule!r}.{did_you_mean(schedule, SCHEDULES)} "
                                                    f"Use one of {', '.join(SCHEDULES)}.", lead=False)
    for quantity, value in (("stages", p), ("micro", m), ("virtual", v)):
        if value < 1:
            raise PredictionError(quantity, value, f" must be a whole number of at least 1 (got {value}).", show="")
    if schedule == "interleaved" and v < 2:
        raise PredictionError("virtual", v, ": interleaved 1F1B gives each rank v >= 2 chunks; with 1 it is plain "
                                            "1F1B ({schedule} 1f1b).")
    if schedule == "interleaved" and m % p:
        near = sorted({max(p, m // p * p), -(-m // p) * p})
        raise PredictionError("micro", m, f" is not a multiple of {{stages}} {p}: interleaved 1F1B sends micro-batches "
                                          f"round in groups of p; use {{micro}} {' or '.join(map(str, near))}.")


def order(schedule: str, p: int, m: int, rank: int, v: int = 1) -> list[tuple[str, int, int]]:
    """(kind, micro, chunk) in the order pipeline rank `rank` runs them. Interleaved (Megatron):
    the k-th forward is chunk (k // p) % v of micro-batch (k // (p*v)) * p + k % p, the k-th
    backward the same micro-batch of chunk v-1 - (k // p) % v; warm-up 2(p-rank-1) + (v-1)p."""
    check(schedule, p, m, v)
    if not 0 <= rank < p:
        raise ValueError(f"rank {rank} is not a pipeline rank of {p} stages (0 .. {p - 1})")
    if schedule == "gpipe":
        return [("F", i, 0) for i in range(m)] + [("B", i, 0) for i in range(m)]
    if schedule == "interleaved":
        def micro(k):
            return k // (p * v) * p + k % p
        warmup = min((p - rank - 1) * 2 + (v - 1) * p, m * v)
        return _warmup_steady_cooldown(warmup, m * v, lambda k: (micro(k), k // p % v),
                                       lambda k: (micro(k), v - 1 - k // p % v))
    ops = _warmup_steady_cooldown(min(p - rank - 1, m), m, lambda k: (k, 0), lambda k: (k, 0))
    return _delay_weight_gradients(ops, keep=rank) if schedule == "zb" else ops


def _warmup_steady_cooldown(warmup, total, forward, backward) -> list[tuple[str, int, int]]:
    ops = [("F", *forward(k)) for k in range(warmup)]
    for k in range(total - warmup):
        ops += [("F", *forward(warmup + k)), ("B", *backward(k))]
    return ops + [("B", *backward(k)) for k in range(total - warmup, total)]


def _delay_weight_gradients(ops, keep: int) -> list[tuple[str, int, int]]:
    """Each B followed by its W, except that up to `keep` W's wait: after a B, the oldest W
    runs only when more than `keep` are pending; the rest run at the end."""
    out, pending = [], []
    for kind, micro, chunk in ops:
        out.append((kind, micro, chunk))
        if kind == "B":
            pending.append(("W", micro, chunk))
            if len(pending) > keep:
                out.append(pending.pop(0))
    return out + pending


def _per_stage(value, stages: int, name: str) -> list[float]:
    values = list(value) if isinstance(value, (list, tuple)) else [float(value)] * stages
    if len(values) != stages:
        raise ValueError(f"{name} has {len(values)} durations for {stages} (virtual) stages")
    return values


def simulate(schedule: str, p: int, m: int, v: int = 1, f=1.0, b=2.0, w=None) -> list[Op]:
    """The timeline of one step: each rank runs its order, an op starts when the rank is free
    and its input is there. f, b: durations of a forward and of a whole backward, one number
    or one per virtual stage; for zb, W takes w (default b/2) and B the rest, b - w."""
    check(schedule, p, m, v)
    v = v if schedule == "interleaved" else 1
    stages = p * v
    f, b = _per_stage(f, stages, "f"), _per_stage(b, stages, "b")
    weight = _per_stage([x / 2 for x in b] if w is None else w, stages, "w") if schedule == "zb" else [0.0] * stages
    if any(y < 0 or y > x for x, y in zip(b, weight)):
        raise ValueError(f"w must be less than b (B = b - w, W = w): got b={b}, w={weight}")
    orders = [order(schedule, p, m, rank, v) for rank in range(p)]
    try:
        return play(orders, f, [x - y for x, y in zip(b, weight)], weight)
    except Deadlock as exc:
        stuck = "; ".join(f"rank {r} at {op}" for r, op in exc.stuck)
        raise ValueError(f"{schedule} with p={p}, m={m}, v={v} deadlocks: {stuck}") from None


class Deadlock(ValueError):
    """Orders that cannot all finish: `stuck` holds (rank, the op it waits at forever)."""

    def __init__(self, stuck: list):
        self.stuck = stuck
        super().__init__("; ".join(f"rank {r} waits forever at {op}" for r, op in stuck))


def play(orders, f=1.0, b=2.0, w=0.0) -> list[Op]:
    """Explicit orders against the dependencies: orders[rank] lists (kind, micro) or (kind,
    micro, chunk), chunk c of rank r being virtual stage c*p + r. F on a stage waits for F on
    the one before, B for B on the one after (the last stage's B for its own F), W for its
    own B; an op starts when its rank is free and its input is there (communication free).
    f, b, w: durations of F, B and W, one number or one per virtual stage. Deadlock when some
    rank can never go on."""
    p = len(orders)
    stages = p * (1 + max((item[2] for o in orders for item in o if len(item) > 2), default=0))
    duration = {"F": _per_stage(f, stages, "f"), "B": _per_stage(b, stages, "b"), "W": _per_stage(w, stages, "w")}
    done, ops, free, position = {}, [], [0.0] * p, [0] * p
    progress = True
    while progress:
        progress = False
        for rank in range(p):
            while position[rank] < len(orders[rank]):
                kind, micro, *chunk = orders[rank][position[rank]]
                stage = (chunk[0] if chunk else 0) * p + rank
                needs = {"F": ("F", stage - 1, micro) if stage else None,
                         "B": ("B", stage + 1, micro) if stage < stages - 1 else ("F", stage, micro),
                         "W": ("B", stage, micro)}[kind]
                if needs is not None and needs not in done:
                    break
                start = max(free[rank], done.get(needs, 0.0))
                free[rank] = done[(kind, stage, micro)] = start + duration[kind][stage]
                ops.append(Op(rank, kind, micro, start, free[rank], stage))
                position[rank] += 1
                progress = True
    stuck = [(r, orders[r][i]) for r, i in enumerate(position) if i < len(orders[r])]
    if stuck:
        raise Deadlock(stuck)
    return sorted(ops, key=lambda op: (op.rank, op.start))


def bubble_fraction(p: int, m: int, v: int = 1) -> float:
    """The theory: (p-1) / (v*m + p-1)."""
    return (p - 1) / (v * m + p - 1)


def bubble_theory(schedule: str, p: int, m: int, v: int = 1, f: float = 1.0, b: float = 2.0, w=None) -> float:
    """The predicted bubble of a schedule with equal stages (the module doc's formulas;
    for zb only with m >= p: fewer micro-batches leave too few W's to fill the drain)."""
    if schedule == "zb":
        w = b / 2 if w is None else w
        idle = (p - 1) * max(f, b - w, f + b - 2 * w)
        return idle / (m * (f + b) + idle)
    return bubble_fraction(p, m, v if schedule == "interleaved" else 1)


def bubble_of(ops: list[Op]) -> float:
    """Measured idle fraction: 1 - (time in F, B, W) / span per rank, the mean over ranks."""
    span = max(op.end for op in ops) - min(op.start for op in ops)
    ranks = sorted({op.rank for op in ops})
    busy = {r: sum(op.end - op.start for op in ops if op.rank == r and op.kind in COMPUTE) for r in ranks}
    return sum(1 - busy[r] / span for r in ranks) / len(ranks)


def peak_in_flight(order_list) -> int:
    """Most micro-batches (of all chunks) whose forward has run and backward (B) has not."""
    held = peak = 0
    for kind, *_ in order_list:
        held += {"F": 1, "B": -1}.get(kind, 0)
        peak = max(peak, held)
    return peak


def peak_bytes(order_list, bytes_per_chunk: dict) -> float:
    """The most activation bytes a rank holds: each forward of chunk c adds bytes_per_chunk[c]
    (one micro-batch of that chunk's layers), its backward (B) gives them back."""
    held = peak = 0.0
    for kind, _, chunk in order_list:
        held += {"F": 1, "B": -1}.get(kind, 0) * bytes_per_chunk[chunk]
        peak = max(peak, held)
    return peak


def in_flight(schedule: str, p: int, m: int, rank: int, v: int = 1) -> int:
    return peak_in_flight(order(schedule, p, m, rank, v))


def text_timeline(ops: list[Op], cell: float = 1.0) -> str:
    """A planned timeline as text, one row per rank, one column per `cell` of time: the
    op's kind and micro-batch ('F3', 'B3'; lower case on odd chunks), '.' where idle."""
    ranks = sorted({op.rank for op in ops})
    width = 2 + len(str(max(op.micro for op in ops)))
    columns = round(max(op.end for op in ops) / cell)
    rows = []
    for rank in ranks:
        cells = ["." * (width - 1)] * columns
        for op in (op for op in ops if op.rank == rank and op.kind in COMPUTE):
            odd_chunk = op.stage >= 0 and op.stage // len(ranks) % 2
            label = (op.kind.lower() if odd_chunk else op.kind) + str(op.micro)
            for column in range(round(op.start / cell), round(op.end / cell)):
                cells[column] = label.ljust(width - 1)
        rows.append(f"rank {rank}  " + " ".join(cells))
    return "\n".join(rows)
