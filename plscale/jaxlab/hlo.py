"""The collectives XLA put into a compiled program, read from its HLO text.

    text = jax.jit(f).lower(*args).compile().as_text()
    ops = collectives(text)        # [Collective(op, shapes, dtype, bytes, groups), ...]
    summarize(ops)                 # {"all-reduce": (count, bytes), ...}

The text before compiling (`.lower(...).as_text()`) has sharding annotations only: the
partitioner inserts the collectives while compiling. Ops read here: all-reduce, all-gather,
reduce-scatter, collective-permute, all-to-all. An asynchronous pair (`all-reduce-start` /
`all-reduce-done`, GPU) counts once; a collective wrapped in `async-start` is counted inside
its wrapped computation. A tuple-shaped op (XLA's combiner fuses several gradients into one
all-reduce) is one Collective with all its shapes and their total bytes. One inside a loop
body (lax.scan over layers) is listed once with `runs` = the loop's trip count, which
summarize() multiplies in.

`bytes` is the message size S per device as nccl-tests counts it (plscale.predict.busbw):
the tensor for all-reduce and collective-permute, the gathered output for all-gather, the
input for reduce-scatter, the whole buffer for all-to-all; that is, the larger of what goes
in and what comes out. `groups` are partition ids: positions in the mesh's device array
(num_partitions = the mesh's size), not jax device ids; for collective-permute they are the
(source, target) pairs.
"""

import re
from dataclasses import dataclass

import numpy as np

from plscale.predict.busbw import bus_factor

OPS = ("all-reduce", "all-gather", "reduce-scatter", "collective-permute", "all-to-all")
_BUS_NAMES = {"all-reduce": "all_reduce", "all-gather": "all_gather", "reduce-scatter": "reduce_scatter",
              "all-to-all": "all_to_all"}
_BITS = {"pred": 8, "bf16": 16, "c64": 64, "c128": 128, "token": 0}
_ARRAY = re.compile(r"\b(pred|bf16|token|c64|c128|[fsu]\d+|f8\w*)\[([^\]]*)\]")
_COMPUTATION = re.compile(r"^(ENTRY\s+)?%?([\w.\-]+)\s+\(.*->.*\{\s*$")
_CALLS = r"\b(body|condition|calls|to_apply|branch_computations|true_computation|false_computation)=(\{[^}]*\}|%[\w.\-]+)"
_INSTRUCTION = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*(.*)$")


@dataclass(frozen=True)
class Collective:
    op: str                       # one of OPS
    shapes: tuple                 # the result's shape(s): one per element of a tuple-shaped op
    dtype: str                    # "f32"; "f32,s32" when a combined op mixes them
    bytes: int                    # S per device (see the module's docstring)
    groups: tuple | None          # replica groups (partition ids), or (source, target) pairs
    name: str = ""                # the HLO instruction's name
    runs: int | None = 1          # times it runs per call of the program (loop trip counts); None: unknown
    phase: str = "forward"        # "backward" when autodiff's transpose made it (its op_name says transpose(...))

    @property
    def shape(self):
        return self.shapes[0] if len(self.shapes) == 1 else self.shapes

    @property
    def group_size(self) -> int | None:
        if not self.groups:
            return None
        return 2 if self.op == "collective-permute" else len(self.groups[0])

    @property
    def sent(self) -> float | None:
        """Bytes each device sends under the bandwidth-optimal algorithm (ring): S x the
        nccl-tests bus factor (2(n-1)/n for all-reduce); a permute's sources send S."""
        if self.op == "collective-permute":
            return float(self.bytes)
        n = self.group_size
        return None if n is None else self.bytes * bus_factor(_BUS_NAMES[self.op], n)


def collectives(hlo_text: str) -> list[Collective]:
    """Every collective of a compiled module, in program order."""
    partitions = int(m.group(1)) if (m := re.search(r"num_partitions=(\d+)", hlo_text)) else None
    parsed, computation, entry = [], None, None
    for line in hlo_text.splitlines():
        if header := _COMPUTATION.match(line):
            computation = header.group(2)
            entry = computation if header.group(1) else entry
        elif p := _parse(line):
            parsed.append((computation, *p))
    runs = _runs(parsed, entry)
    types = {name: type_ for _, name, type_, _, _, _ in parsed}
    done = {operands[0][0]: type_ for _, _, type_, opcode, operands, _ in parsed
            if opcode.endswith("-done") and operands}
    found = []
    for computation, name, type_, opcode, operands, attrs in parsed:
        op = opcode[:-len("-start")] if opcode.endswith("-start") else opcode
        if op not in OPS:
            continue
        result = done.get(name, type_) if opcode.endswith("-start") else type_
        arrays = _arrays(result)
        into = sum(_bytes(_arrays(t or types.get(n, ""))) for n, t in operands)
        groups = _pairs(attrs) if op == "collective-permute" else _groups(attrs, partitions)
        source = re.search(r'op_name="([^"]*)"', attrs)
        phase = "backward" if source and "transpose(" in source.group(1) else "forward"
        found.append(Collective(op, tuple(s for _, s in arrays), ",".join(dict.fromkeys(d for d, _ in arrays)),
                                max(into, _bytes(arrays)), groups, name, runs.get(computation, 1), phase))
    return found


def _runs(parsed, entry) -> dict:
    """{computation: times it runs per call of the entry}: a while body runs its known trip
    count times per run of its caller (None when XLA does not know it); other calls once."""
    callers = {}  # callee: [(caller, factor)]
    for computation, _, _, opcode, _, attrs in parsed:
        trips = re.search(r'"known_trip_count":\{"n":"(\d+)"', attrs)
        for key, names in re.findall(_CALLS, attrs):
            factor = (int(trips.group(1)) if trips else None) if opcode == "while" and key == "body" else 1
            for callee in re.findall(r"%([\w.\-]+)", names):
                callers.setdefault(callee, []).append((computation, factor))
    runs = {entry: 1}

    def count(computation):  # HLO's call graph is acyclic
        if computation not in runs:
            total = 0 if computation in callers else 1
            for caller, factor in callers.get(computation, ()):
                caller_runs = count(caller)
                total = None if None in (total, caller_runs, factor) else total + caller_runs * factor
            runs[computation] = total
        return runs[computation]

    for computation in {c for c, *_ in parsed}:
        count(computation)
    return runs


def summarize(ops: list[Collective]) -> dict[str, tuple[int, int]]:
    """{op: (how many, total bytes S)}, in the order ops first appear."""
    summary = {}
    for c in ops:
        count, total = summary.get(c.op, (0, 0))
        summary[c.op] = (count + (c.runs or 1), total + c.bytes * (c.runs or 1))
    return summary


def axes_of(c: Collective, mesh_axes) -> tuple:
    """The mesh axes a collective runs along: those its groups' members differ in (for a permute,
    its sources and targets). mesh_axes: ((name, size), ...) in the mesh's order, as
    jax's `mesh.shape.items()` lists them; partition ids are positions in that array."""
    if not c.groups:
        return ()
    names, sizes = zip(*mesh_axes)
    coords = np.stack(np.unravel_index(np.arange(int(np.prod(sizes))), sizes), axis=1)
    varying = set()
    for group in c.groups:
        if max(group) >= len(coords):
            raise ValueError(f"{c.name}: group {group} names a partition beyond the mesh's {len(coords)}: "
                             f"jax device ids where partition ids belong?")
        ids = list(group)
        varying |= {i for i in range(len(names)) if len({int(coords[p][i]) for p in ids}) > 1}
    return tuple(names[i] for i in sorted(varying))


def tally(ops: list[Collective], mesh_axes) -> dict[tuple, tuple[int, int]]:
    """{(op, phase, axes): (how many, total bytes S)}: what ran along which mesh axis, forward or
    backward."""
    out = {}
    for c in ops:
        key = (c.op, c.phase, axes_of(c, mesh_axes))
        count, total = out.get(key, (0, 0))
        out[key] = (count + (c.runs or 1), total + c.bytes * (c.runs or 1))
    return out


# The XLA ops that do the work of each collective the PyTorch labs issue by hand
# (plscale.predict.sharding.by_hand). On CPU XLA writes a reduce-scatter as an all-reduce and a
# slice (measured), so both count for it.
CARRIES = {"all_reduce": ("all-reduce",), "all_gather": ("all-gather",),
           "reduce_scatter": ("reduce-scatter", "all-reduce"), "send_recv": ("collective-permute",)}


def carried(tallied: dict, op: str, phase: str, axis: str) -> tuple[int, int]:
    """(how many, bytes) of XLA's collectives (a `tally`) doing the work of by-hand `op` along
    mesh axis `axis` in `phase`."""
    rows = [v for (o, p, axes), v in tallied.items() if o in CARRIES[op] and p == phase and axes == (axis,)]
    return sum(n for n, _ in rows), sum(b for _, b in rows)


def permute_bytes_sent(ops: list[Collective]) -> dict[int, int]:
    """{partition: bytes it sends} over every collective-permute: the sources of each pair
    send that op's S. Exact, unlike `sent`: this is what the program moves, step by step."""
    sent = {}
    for c in ops:
        if c.op == "collective-permute":
            for source, _ in c.groups or ():
                sent[source] = sent.get(source, 0) + c.bytes * (c.runs or 1)
    return sent


def describe(ops: list[Collective]) -> str:
    """One line: '1 all-reduce (52 B)', 'none'."""
    return ", ".join(f"{n} {op} ({total:,} B)" for op, (n, total) in summarize(ops).items()) or "none"


# ---- parsing ---------------------------------------------------------------------------------
def _parse(line: str):
    """(name, result type, opcode, [(operand name, inline type or None)], attributes) or None."""
    m = _INSTRUCTION.match(line)
    if not m:
        return None
    name, rest = m.groups()
    type_, rest = _split_type(rest)
    op = re.match(r"\s*([a-z][\w\-]*)\(", rest)
    if not op:
        return None
    inside, attrs = _balanced(rest[op.end() - 1:], "(", ")")
    operands = [(o.group(2), o.group(1) or None) for o in re.finditer(r"(?:(\S+\]\S*|\([^%]*\))\s+)?%([\w.\-]+)", inside)]
    return name, type_, op.group(1), operands, attrs


def _split_type(text: str) -> tuple[str, str]:
    text = text.lstrip()
    if text.startswith("("):
        inside, rest = _balanced(text, "(", ")")
        return f"({inside})", rest
    type_, _, rest = text.partition(" ")
    return type_, rest


def _balanced(text: str, open_: str, close: str) -> tuple[str, str]:
    """('inside of the first bracket pair', 'what follows') for text starting with open_."""
    depth = 0
    for i, ch in enumerate(text):
        depth += (ch == open_) - (ch == close)
        if depth == 0:
            return text[1:i], text[i + 1:]
    return text[1:], ""


def _arrays(type_text: str) -> list[tuple[str, tuple[int, ...]]]:
    return [(dt, tuple(int(d.lstrip("<=")) for d in dims.split(",") if d)) for dt, dims in _ARRAY.findall(type_text)
            if dt != "token"]


def _bytes(arrays) -> int:
    return sum(int(np.prod(shape, dtype=np.int64)) * _bits(dt) // 8 for dt, shape in arrays)


def _bits(dtype: str) -> int:
    return _BITS.get(dtype) or (8 if dtype.startswith("f8") else int(dtype[1:]))


def _pairs(attrs: str):
    m = re.search(r"source_target_pairs=\{", attrs)
    if not m:
        return None
    inside, _ = _balanced(attrs[m.end() - 1:], "{", "}")
    return tuple(tuple(int(v) for v in p.split(",")) for p in re.findall(r"\{([\d,]+)\}", inside))


def _groups(attrs: str, partitions: int | None):
    """Replica groups in any of XLA's three spellings: {{0,1},{2,3}}; iota [2,2]<=[4] or
    [2,2]<=[2,2]T(1,0); mesh['axis_0'=2,'axis_1'=2] {'axis_0'} (groups along the named axes).
    An empty list means one group of every partition."""
    m = re.search(r"replica_groups=", attrs)
    if not m:
        return None
    text = attrs[m.end():]
    if text.startswith("{"):
        inside, _ = _balanced(text, "{", "}")
        groups = tuple(tuple(int(v) for v in g.split(",") if v) for g in re.findall(r"\{([\d,]*)\}", inside))
        return groups or ((tuple(range(partitions)),) if partitions else None)
    if iota := re.match(r"\[([\d,]+)\]<=\[([\d,]+)\](?:T\(([\d,]+)\))?", text):
        shape, dims = [int(v) for v in iota.group(1).split(",")], [int(v) for v in iota.group(2).split(",")]
        ids = np.arange(int(np.prod(dims))).reshape(dims)
        if iota.group(3):
            ids = ids.transpose([int(v) for v in iota.group(3).split(",")])
        return tuple(tuple(int(v) for v in row) for row in ids.reshape(shape))
    if mesh := re.match(r"mesh\[([^\]]*)\](?:,\s*device_ids=\((\[[\d,]+\](?:T\([\d,]+\))?)\))?\s*\{([^}]*)\}", text):
        axes = re.findall(r"'([^']+)'=(\d+)", mesh.group(1))
        if re.sub(r"'[^']+'=\d+|[,\s]", "", mesh.group(1)):  # sub-axes: not read here
            return None
        names, sizes = [a for a, _ in axes], [int(s) for _, s in axes]
        ids = np.arange(int(np.prod(sizes)))
        if mesh.group(2):  # the mesh's device order: an iota, maybe transposed ([2,2]T(1,0))
            order = re.match(r"\[([\d,]+)\](?:T\(([\d,]+)\))?", mesh.group(2))
            ids = ids.reshape([int(v) for v in order.group(1).split(",")])
            if order.group(2):
                ids = ids.transpose([int(v) for v in order.group(2).split(",")])
        grouped = [names.index(a) for a in re.findall(r"'([^']+)'", mesh.group(3))]
        rest = [i for i in range(len(names)) if i not in grouped]
        ids = ids.reshape(sizes).transpose(rest + grouped)
        return tuple(tuple(int(v) for v in row) for row in ids.reshape(-1, int(np.prod([sizes[i] for i in grouped]))))
    return None
