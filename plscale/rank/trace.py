"""Read the traces of a profiled step (plscale.rank.profile): merge the ranks, measure overlap.

torch.profiler writes Chrome trace-event JSON: `X` events with a start (`ts`, microseconds) and
a duration (`dur`) on a process and thread. On CPU ranks the main thread runs the ops and gloo's
own threads run the collectives (`gloo:all_reduce`, ...); on GPUs the kernels carry both, NCCL's
named `nccl...`. From them, per rank and over the step:

- compute: the time the main thread (CPU) or the GPU's non-NCCL kernels are busy, less the
  main thread's time inside the collective calls themselves (`c10d::...`);
- communication: the time a collective is running (the gloo threads, a send or recv on the main
  thread, or the NCCL kernels), which includes waiting for the other ranks to join it: a
  pipeline's bubble shows as its stages' receives;
- hidden: the part of communication that runs while compute does, i.e. overlapped;
- idle: the rest of the step, when neither runs (waiting on another rank, or on Python).

The slowest rank is the one the others wait for: it arrives last at each collective, so it spends
the least time in them (whether it was computing, sleeping or loading data meanwhile: time
outside any recorded op counts as idle, not compute). Durations, not clocks, so this holds
across machines too.
Traces of ranks on one machine share a clock; ranks on several machines are drawn each from
its own start. Standard library only (the picture: plscale.charts.trace).
"""

import json
import statistics
from pathlib import Path

from plscale.files import write_json
from plscale.rank.metrics import figure

COMM_THREAD_OPS = ("gloo:", "nccl:")                 # the collective running (gloo: its threads; send/recv: the caller's)
COMM_CALLS = ("c10d::", "record_param_comms", "nccl:")  # the main thread inside a collective call
GLOO_P2P = ("gloo:send", "gloo:recv", "c10d::send", "c10d::recv_", "c10d::recv_any_source_")  # not in gloo's recorder
BYTES = {"float": 4, "c10::BFloat16": 2, "c10::Half": 2, "double": 8, "long int": 8, "int": 4,
         "unsigned char": 1, "signed char": 1, "bool": 1, "short int": 2}


def union(intervals) -> list[tuple[float, float]]:
    merged = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def length(intervals) -> float:
    return sum(end - start for start, end in intervals)


def intersect(a, b) -> list[tuple[float, float]]:
    """Of two unions: where both are."""
    out, i, j = [], 0, 0
    while i < len(a) and j < len(b):
        start, end = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if start < end:
            out.append((start, end))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return out


def subtract(a, b) -> list[tuple[float, float]]:
    """Of two unions: a where b is not."""
    out = []
    for start, end in a:
        for b_start, b_end in b:
            if b_end <= start or b_start >= end:
                continue
            if b_start > start:
                out.append((start, b_start))
            start = max(start, b_end)
        if start < end:
            out.append((start, end))
    return out


def events(trace: dict) -> list[dict]:
    return [e for e in trace.get("traceEvents", []) if e.get("ph") == "X" and "dur" in e and "ts" in e]


def is_gpu_kernel(e: dict) -> bool:
    return e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")


def message_bytes(e: dict) -> int | None:
    """A collective's tensor size, from the shapes torch.profiler recorded (record_shapes)."""
    args = e.get("args") or {}
    dims, types = args.get("Input Dims") or [], args.get("Input type") or []
    if not dims or not types:
        return None
    first = dims[0][0] if dims[0] and isinstance(dims[0][0], list) else dims[0]  # a TensorList's first tensor
    count = 1
    for d in first or []:
        count *= d
    size = BYTES.get(types[0] if types[0] != "TensorList" else "float")
    return count * size if size else None  # a 0-dim tensor (dims []) is one element


def parts(trace: dict) -> dict:
    """One rank's step as unions of intervals (microseconds): compute, comm, the window."""
    evs = events(trace)
    kernels = [e for e in evs if is_gpu_kernel(e)]
    host = [e for e in evs if not is_gpu_kernel(e)]
    pid_threads = [e for e in host if e.get("tid") == e.get("pid")]
    main_tid = pid_threads[0]["tid"] if pid_threads else max(
        {e.get("tid") for e in host}, key=lambda t: sum(1 for e in host if e.get("tid") == t), default=None)
    main = [e for e in host if e.get("tid") == main_tid]
    span = lambda e: (float(e["ts"]), float(e["ts"]) + float(e["dur"]))  # noqa: E731
    if kernels:
        nccl = [e for e in kernels if "nccl" in e.get("name", "").lower()]
        comm = union(span(e) for e in nccl)
        compute = union(span(e) for e in kernels if e not in nccl)
    else:
        # gloo runs a collective on its own threads, a send or recv on the caller's (it blocks there)
        comm = union(span(e) for e in host if e.get("name", "").startswith(COMM_THREAD_OPS))
        calls = [e for e in main if e.get("name", "").startswith(COMM_CALLS + COMM_THREAD_OPS)]
        compute = subtract(union(span(e) for e in main if e not in calls), union(span(e) for e in calls))
    every = [span(e) for e in main + kernels] + comm
    window = (min(s for s, _ in every), max(e for _, e in every)) if every else (0.0, 0.0)
    return {"compute": compute, "comm": comm, "window": window}


def stats(p: dict) -> dict:
    """Milliseconds of a rank's step: compute, communication, hidden, exposed, idle."""
    compute, comm = p["compute"], p["comm"]
    hidden = length(intersect(compute, comm))
    busy = length(union(compute + comm))
    step = p["window"][1] - p["window"][0]
    ms = lambda us: round(us / 1e3, 3)  # noqa: E731
    return {"step_ms": ms(step), "compute_ms": ms(length(compute)), "comm_ms": ms(length(comm)),
            "hidden_ms": ms(hidden), "exposed_ms": ms(length(comm) - hidden), "idle_ms": ms(step - busy),
            "hidden_fraction": round(hidden / length(comm), 4) if length(comm) else None}


def group_label(group) -> str:
    """A process group as the Flight Recorder names it, (name, description); torch describes every
    new_group() "undefined", so its name (a number) tells the groups apart."""
    name, desc = group
    return f"{desc} (group {name})" if desc and desc != "undefined" else f"group {name}"


def _same(e: dict, entry: dict) -> bool:
    """Whether a trace event can be the record's entry: gloo's events carry the record's op name
    (gloo:all_reduce, for a reduce-scatter too) and its input sizes; NCCL's kernels neither."""
    if is_gpu_kernel(e):
        return True
    dims = (e.get("args") or {}).get("Input Dims")
    return e.get("name") == entry["op"] and (not dims or not entry.get("sizes") or dims == entry["sizes"])


def label_groups(trace: dict, issued: list[dict]) -> int:
    """Give each collective of one rank's trace its process group and sequence number (args
    `group`, `seq`), which the profiler's events lack, from the Flight Recorder's record of the
    same step (plscale.rank.flight.issued_between). Both are in the order the rank issued them:
    what runs each collective (gloo's events, NCCL's kernels) is zipped in time order with the
    record, and must carry the record's names and sizes (gloo's); the calls (c10d::...) too when
    there are as many. Nothing is labelled when the runs are not the record's. gloo's sends and
    receives are left out: its recorder does not record them (a pipeline's keep their bytes only).
    On NCCL the kernels are zipped with the NCCL recorder's entries by order alone (not yet run
    here: a kernel carries no op name or sizes to check). Returns how many events were labelled."""
    evs = [e for e in events(trace) if e.get("name") not in GLOO_P2P]
    by_time = lambda es: sorted(es, key=lambda e: float(e["ts"]))  # noqa: E731
    calls = by_time(e for e in evs if e.get("name", "").startswith("c10d::"))
    kernels = by_time(e for e in evs if is_gpu_kernel(e) and "nccl" in e.get("name", "").lower())
    runs = kernels or by_time(e for e in evs if e.get("name", "").startswith(COMM_THREAD_OPS))
    if len(runs) != len(issued) or any(not _same(e, entry) for e, entry in zip(runs, issued)):
        return 0   # not the record's collectives in its order
    for kind in (runs, calls) if len(calls) == len(issued) else (runs,):
        for e, entry in zip(kind, issued):
            e["args"] = {**(e.get("args") or {}), "group": group_label(entry["group"]), "seq": entry["seq"]}
    return len(runs) + (len(calls) if len(calls) == len(issued) else 0)


def merge(traces: dict[int, dict], issued: dict[int, list] | None = None) -> dict:
    """One trace of every rank: process R is rank R (named so), times from the earliest event.
    Each collective gets its bytes in args (`bytes`), as Perfetto shows on a click, and, where
    the rank's Flight Recorder record of the step is given (`issued`), its group (label_groups)."""
    for rank, record in (issued or {}).items():
        if rank in traces:
            label_groups(traces[rank], record)
    starts = [min(float(e["ts"]) for e in events(t)) for t in traces.values() if events(t)]
    origin = min(starts) if starts else 0.0
    out = []
    for rank, trace in sorted(traces.items()):
        out += [{"ph": "M", "name": "process_name", "pid": rank, "tid": 0, "args": {"name": f"rank {rank}"}},
                {"ph": "M", "name": "process_sort_index", "pid": rank, "tid": 0, "args": {"sort_index": rank}}]
        for e in trace.get("traceEvents", []):
            if e.get("ph") == "M" and e.get("name") in ("process_name", "process_sort_index", "process_labels"):
                continue
            e = dict(e, pid=rank if not is_gpu_kernel(e) else f"rank {rank} GPU")
            if "ts" in e:
                e["ts"] = round(float(e["ts"]) - origin, 3)
            if e.get("name", "").startswith(COMM_THREAD_OPS + COMM_CALLS):
                size = message_bytes(e)
                if size is not None:
                    e["args"] = {**(e.get("args") or {}), "bytes": size}
            out.append(e)
    return {"traceEvents": out, "displayTimeUnit": "ms",
            "otherData": {"made_by": "plscale lab run --profile (one process per rank)"}}


def merge_run(folder: Path, world_size: int, step: int) -> list[dict]:
    """profile/rank*.json -> trace.json, timeline.png, profile.json; the summary's figures."""
    folder = Path(folder)
    traces, issued = {}, {}
    for rank in range(world_size):
        path, record = folder / f"rank{rank}.json", folder / f"collectives{rank}.json"
        if path.is_file():
            traces[rank] = json.loads(path.read_text())
        if record.is_file():
            issued[rank] = json.loads(record.read_text())
    if not traces:
        return [figure("profiled step", step, note="no rank wrote a trace: the lab logged no step "
                                                    f"{step} (ctx.metrics.step)")]
    merged = merge(traces, issued)
    (folder / "trace.json").write_text(json.dumps(merged))
    for rank in traces:
        (folder / f"rank{rank}.json").unlink()  # all in trace.json now
        (folder / f"collectives{rank}.json").unlink(missing_ok=True)
    per_rank = {rank: parts(t) for rank, t in traces.items()}
    table = {rank: stats(p) for rank, p in per_rank.items()}
    cost = _profiling_cost(folder.parent / "metrics.jsonl", step)
    write_json(folder / "profile.json", {"step": step, "ranks": table, "profiled_step_over_median": cost})
    from plscale.charts import trace as chart

    chart.draw(folder / "timeline.png", {r: {**p, "hidden": intersect(p["compute"], p["comm"])} for r, p in per_rank.items()}, f"step {step}, every rank: compute and communication")
    missing = sorted(set(range(world_size)) - set(traces))
    hidden = [s["hidden_fraction"] for s in table.values() if s["hidden_fraction"] is not None]
    slowest = min(table, key=lambda r: (table[r]["comm_ms"], -table[r]["compute_ms"]))
    waits = [table[r]["comm_ms"] - table[slowest]["comm_ms"] for r in table if r != slowest]
    idlest = max(table, key=lambda r: table[r]["idle_ms"])
    note = "profile/trace.json: open in https://ui.perfetto.dev" + (
        f"; no trace from rank(s) {', '.join(map(str, missing))} (another node's run dir)" if missing else "")
    figures = [figure("profiled step", step, note=note)]
    if hidden:
        figures.append(figure("communication hidden behind compute", round(100 * statistics.mean(hidden), 1), "%",
                              note="mean over ranks of the profiled step"))
    figures += [figure("slowest rank (the others wait for it)", slowest,
                       note=f"the others spend {statistics.mean(waits) if waits else 0:.1f} ms more in collectives; "
                            f"it computes {table[slowest]['compute_ms']:.1f} ms"),
                figure("most idle rank", idlest, note=f"{table[idlest]['idle_ms']:.1f} ms idle of "
                                                      f"{table[idlest]['step_ms']:.1f} ms")]
    if cost is not None:
        figures.append(figure("profiled step / median step", cost, "x", note="what recording costs (target 2x at most)"))
    return figures


def _profiling_cost(metrics: Path, step: int) -> float | None:
    """The profiled step's time over the median of the other train steps (from step 1), from metrics.jsonl."""
    if not metrics.is_file():
        return None
    times = {}
    for line in metrics.read_text().splitlines():
        row = json.loads(line)
        if row.get("phase", "train") == "train" and isinstance(row.get("step"), int) and row.get("step_time_s"):
            times[row["step"]] = row["step_time_s"]
    others = [t for s, t in times.items() if s not in (0, step)]
    if step not in times or not others:
        return None
    return round(times[step] / statistics.median(others), 2)
