"""Why a run failed, from what its ranks left in the run directory: which rank, in which call.

A distributed failure seldom says so itself. A rank that skipped a collective does not hang
where it skipped: gloo and NCCL match collectives by their order in the group, so the next
ones pair up wrongly and the run hangs later, where the counts no longer match, and every
rank reports only "timed out". Three records tell the story:

    flight/rank_N.pkl   the Flight Recorder (plscale/rank/flight.py): every collective each rank
                        issued, numbered in its group, with its op, sizes and Python stack
    rank_N.error        the traceback of a rank that raised (a timeout, a mismatch, an OOM)
    stacks/rank_N.txt   where a rank was when the launcher terminated it (faulthandler)

`lines(run_dir)` reads them and names the first collective the ranks disagree on, or the rank
that issued fewer, with the line of code that issued each; then torch's own analyser
(python -m torch.distributed.flight_recorder.fr_trace) gives its verdict on the same records.
Host side: plain data (pickle) and a subprocess, no torch import here.
"""

import pickle
import re
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # paths under the checkout are shown relative to it
LIBRARIES = ("site-packages", "dist-packages", "/lib/python")  # frames inside torch, deepspeed, the stdlib
MISMATCH = re.compile(r"Detected mismatch between collectives on ranks\. Rank (\d+) is running collective: "
                      r"CollectiveFingerPrint\((.*?)\), but Rank (\d+) is running collective: CollectiveFingerPrint\((.*?)\)")
FIELDS = re.compile(r"(SequenceNumber|OpType|TensorShape|TensorDtypes)=([^,]*(?:\[[^\]]*\])?)")


class _PlainData(pickle.Unpickler):
    """The dumps are dicts, lists, strings and numbers: anything else (a class to build, code to
    run, in a run directory fetched from elsewhere) is refused."""

    def find_class(self, module, name):
        raise pickle.UnpicklingError(f"{module}.{name} is not plain data")


def records(run_dir: Path, folder: str = "flight") -> dict[int, dict]:
    """rank -> its Flight Recorder dump, from `folder` of the run directory: flight/ (written when a
    rank failed, this attempt's: plscale.rank.logs moves an earlier attempt's aside) or flight/live/
    (asked for by `plscale stacks`). NCCL's own dumps (TORCH_NCCL_DUMP_ON_TIMEOUT) are rank_N."""
    found = {}
    for path in sorted((Path(run_dir) / folder).glob("rank_*")):
        rank = path.name.removeprefix("rank_").removesuffix(".pkl")
        if not rank.isdigit():
            continue
        try:
            with open(path, "rb") as f:
                found[int(rank)] = _PlainData(f).load()
        except Exception:  # half-written, damaged, or not plain data: left out, never trusted
            continue
    return found


def started(run_dir: Path) -> set[int]:
    """The ranks that started (each wrote pids/rank_N at start)."""
    return {int(p.name.removeprefix("rank_")) for p in (Path(run_dir) / "pids").glob("rank_*")
            if p.name.removeprefix("rank_").isdigit()}


def caller(frames: list[dict], root: Path | None = ROOT) -> str:
    """The frames outside the libraries (frames come innermost first), outermost first: the lab's
    line, then the shared helper it called that issued the collective."""
    ours = [f for f in frames if not any(part in f["filename"] for part in LIBRARIES)]
    if not ours:
        return f"{frames[0]['filename']}:{frames[0]['line']}" if frames else "(no stack recorded)"

    def short(frame) -> str:
        name = frame["filename"]
        if root is not None and name.startswith(str(root) + "/"):
            name = name[len(str(root)) + 1:]
        return f"{name}:{frame['line']} ({frame['name']})"
    shown = [short(f) for f in ours[:3][::-1]]
    labs = f"{root}/labs/" if root is not None else "/labs/"
    lab = next((f for f in ours if f["filename"].startswith(labs)), None)   # the lab's own line, innermost
    if lab is not None and lab not in ours[:3]:
        shown = [short(lab), "..."] + shown[-2:]
    return " > ".join(shown)


def _op(entry: dict) -> str:
    sizes = ", ".join("x".join(map(str, s)) or "scalar" for s in entry["input_sizes"])
    return f"{entry['profiling_name'].split(':')[-1]}" + (f" of [{sizes}]" if sizes else "")


def group_label(group) -> str:
    """A process group as the recorder names it: (name, description); every new_group() is
    described "undefined", so the name (its number) tells groups apart."""
    name, desc = group
    return f"{desc} (group {name})" if desc and desc != "undefined" else f"group {name}"


def disagreement(recs: dict[int, dict], root: Path | None = ROOT, live: bool = False) -> list[str]:
    """The first collective of each group the ranks disagree on, and who issued what. `live`: the
    run is still going, so a collective some rank has not issued yet is not a disagreement."""
    out = []
    groups = sorted({e["process_group"][0]: tuple(e["process_group"]) for r in recs.values()
                     for e in r.get("entries", [])}.items())
    for key, group in groups:
        issued = {rank: {e["collective_seq_id"]: e for e in r.get("entries", []) if e["process_group"][0] == key
                         and not e.get("is_p2p")} for rank, r in recs.items()}
        issued = {rank: seqs for rank, seqs in issued.items() if seqs}
        if len(issued) < 2:
            continue
        name = group_label(group)
        last = {rank: max(seqs) for rank, seqs in issued.items()}
        first = max(min(seqs) for seqs in issued.values())  # the ring may have dropped older entries
        for seq in range(first, max(last.values()) + 1):
            ops = {rank: _op(seqs[seq]) if seq in seqs else None for rank, seqs in issued.items()}
            if len(set(ops.values())) == 1 or (live and None in ops.values()):
                continue
            votes = Counter(ops.values())
            common = max(votes, key=lambda op: (votes[op], -min(r for r, o in ops.items() if o == op)))
            odd = sorted(r for r, op in ops.items() if op != common)
            said = lambda op: op or "nothing"  # noqa: E731 (None: that rank never issued it)
            out.append(f"collective #{seq} of {name} is where the ranks part: rank(s) "
                       f"{', '.join(map(str, odd))} issued {', '.join(sorted({said(ops[r]) for r in odd}))} where "
                       f"the others issued {said(common)}")
            for rank, op in sorted(ops.items()):
                if op is None:
                    out.append(f"  rank {rank}: never issued it (its last was #{last[rank]})")
                else:
                    out.append(f"  rank {rank}: {op} at {caller(issued[rank][seq].get('frames', []), root)}")
            out.extend(_counts(issued, seq))
            break
    return out


def _counts(issued: dict[int, dict], upto: int) -> list[str]:
    """Each op's count per rank before the parting collective: a skipped one shows as one fewer."""
    counts = {rank: Counter(_op(e) for s, e in seqs.items() if s < upto) for rank, seqs in issued.items()}
    out = []
    for op in sorted(set().union(*counts.values())):
        per = {rank: c[op] for rank, c in counts.items()}
        if len(set(per.values())) > 1:
            most = max(per.values())
            fewer = [f"rank {r} {n}" for r, n in sorted(per.items()) if n < most]
            out.append(f"  before it, {op}: {', '.join(fewer)}, the others {most}: "
                       f"{'that rank' if len(fewer) == 1 else 'those ranks'} skipped {most - min(per.values())}")
    return out


def last_collectives(recs: dict[int, dict], root: Path | None = ROOT) -> list[str]:
    """Each rank's newest collective per group: where a live run's ranks are, by the recorder."""
    out = []
    for rank, rec in sorted(recs.items()):
        newest = {}
        for e in rec.get("entries", []):
            key = e["process_group"][0]
            if key not in newest or e["collective_seq_id"] >= newest[key]["collective_seq_id"]:
                newest[key] = e
        for _, e in sorted(newest.items()):
            out.append(f"  rank {rank}: {group_label(e['process_group'])} #{e['collective_seq_id']} {_op(e)}, "
                       f"{e['state']}, at {caller(e.get('frames', []), root)}")
    return out


def mismatch(run_dir: Path) -> list[str]:
    """TORCH_DISTRIBUTED_DEBUG=DETAIL's verdict (it checks each collective across ranks first), in one line."""
    for path in sorted(Path(run_dir).glob("rank_*.error")):
        found = MISMATCH.search(path.read_text(errors="replace"))
        if found:
            a, b = (dict(FIELDS.findall(found.group(i))) for i in (2, 4))
            return [f"collective #{a.get('SequenceNumber', '?')}: rank {found.group(1)} runs {a.get('OpType', '?')} of "
                    f"{a.get('TensorShape', '?')} {a.get('TensorDtypes', '')}, rank {found.group(3)} runs "
                    f"{b.get('OpType', '?')} of {b.get('TensorShape', '?')} {b.get('TensorDtypes', '')} "
                    f"(TORCH_DISTRIBUTED_DEBUG=DETAIL)"]
    return []


def where(run_dir: Path, root: Path | None = ROOT) -> dict[int, str]:
    """rank -> the last line of the lab's own code each rank was in: from its traceback, or the
    stack faulthandler wrote when the rank was terminated or crashed (stacks/rank_N.exit.txt)."""
    out = {}
    tb_line = re.compile(r'File "([^"]+)", line (\d+), in (\S+)')
    for path in Path(run_dir).glob("rank_*.error"):
        frames = [{"filename": f, "line": int(n), "name": fn} for f, n, fn in tb_line.findall(path.read_text(errors="replace"))]
        error = (path.read_text(errors="replace").strip().splitlines()[-1:] or [""])[0]
        error = re.sub(r"\[[^\]]*(third_party|/c10/)[^\]]*\] ", "", error)  # the C++ source line of the message
        error = re.sub(r"\[enforce fail at [^\]]*\] [^.]*\. ", "", error)  # c10's check, before the allocator's words
        error = error if len(error) < 160 else error.split(". ")[0] + " (...)"
        out[int(path.stem.split("_")[1])] = f"{caller(frames[::-1], root)}: {error[:160]}"
    fh_line = re.compile(r'File "([^"]+)", line (\d+) in (\S+)')
    for path in (Path(run_dir) / "stacks").glob("rank_*.exit.txt"):
        rank = int(path.name.split("_")[1].split(".")[0])
        text = path.read_text(errors="replace")
        blocks = [b for b in text.split("\n\n") if "most recent call first" in b]
        if rank not in out and blocks:
            main = next((b for b in reversed(blocks) if "Current thread" in b), blocks[-1])
            frames = [{"filename": f, "line": int(n), "name": fn} for f, n, fn in fh_line.findall(main)]
            fatal = re.search(r"Fatal Python error: (.*)", text)  # a crash (SIGABRT, SIGSEGV); else a SIGTERM
            out[rank] = f"{caller(frames, root)}: " + (fatal.group(1) if fatal else "terminated while there")
    return out


OUT_OF_MEMORY = re.compile(r"DefaultCPUAllocator: can't allocate memory: you tried to allocate (?P<cpu>\d+) bytes"
                           r"|CUDA out of memory\. Tried to allocate (?P<cuda>[\d.]+ (?:[KMGT]i)?B|\d+ bytes)"
                           r"|(?P<other>^MemoryError|std::bad_alloc)", re.MULTILINE)


def out_of_memory(run_dir: Path) -> list[str]:
    """One line when ranks ran out of memory: which, the request refused, the fixes. torch's CPU
    and CUDA allocators say how much; Python (MemoryError) and C++ (std::bad_alloc) do not."""
    refused = {}
    for path in Path(run_dir).glob("rank_*.error"):
        found = OUT_OF_MEMORY.search(path.read_text(errors="replace"))
        if found:
            cpu, cuda, _ = found.group("cpu", "cuda", "other")
            refused[int(path.stem.split("_")[1])] = (f"a {int(cpu) / 2 ** 20:.2f} MiB request refused" if cpu else
                                                     f"a {cuda} request refused" if cuda else f"{found.group('other')}, no size said")
    if not refused:
        return []
    ranks = "; ".join(f"rank {r}: {refused[r]}" for r in sorted(refused))
    return [f"out of memory ({ranks}): the step needs less at its peak: a smaller micro-batch, recomputation, "
            f"sharded states (ZeRO-3, FSDP2) or offload (docs/troubleshooting.md, Out of memory)"]


def torch_verdict(run_dir: Path, recs: dict[int, dict]) -> list[str]:
    """torch's Flight Recorder analyser on these records. gloo's dumps leave the group's name out
    of pg_config, which the analyser keys on: a copy with the names the entries carry is analysed."""
    if len(recs) < 2:
        return []
    folder = Path(run_dir) / "flight" / "for_analyser"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    members = {}  # group name -> the ranks whose records hold it (gloo's pg_config may say '[]')
    for rank, rec in recs.items():
        for e in rec.get("entries", []):
            members.setdefault(tuple(e["process_group"]), set()).add(rank)
    for rank, rec in recs.items():
        config = {k: v for k, v in rec.get("pg_config", {}).items() if k}
        for (name, desc), ranks in members.items():
            config.setdefault(name, {"name": name, "desc": desc, "ranks": str(sorted(ranks))})
        (folder / f"rank_{rank}").write_bytes(pickle.dumps({**rec, "pg_config": config}))
    try:
        done = subprocess.run([sys.executable, "-m", "torch.distributed.flight_recorder.fr_trace", str(folder),
                               "-p", "rank_", "--allow-incomplete-ranks"], capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired):
        return []
    text = done.stdout + "\n" + done.stderr  # it reports through logging, on stderr
    (Path(run_dir) / "flight" / "analysis.txt").write_text(text)
    keep = []
    for block in re.split(r"\n(?=Collective sequence number)", text):  # its verdicts, each a block
        if block.startswith("Collective sequence number") and "has errors" in block:
            keep += [line for line in block.splitlines() if line.startswith(
                ("Collective sequence number", "group info", "collective:", "input sizes", "error msg"))]
    return [f"  {line}" for line in keep[:10]]


def lines(run_dir: Path, root: Path | None = ROOT) -> list[str]:
    """The diagnosis, line by line (empty when the records say nothing); also written to diagnosis.txt."""
    run_dir = Path(run_dir)
    recs = records(run_dir)
    named = mismatch(run_dir) or out_of_memory(run_dir)
    out = named or disagreement(recs, root)
    if out and not named:  # the records disagree: torch's analyser on the same records
        verdict = torch_verdict(run_dir, recs)
        out += ["torch's Flight Recorder analyser (flight/analysis.txt):"] + verdict if verdict else []
    silent = sorted(started(run_dir) - set(recs)) if out and not named else []
    if silent:
        out.append(f"no Flight Recorder record from rank(s) {', '.join(map(str, silent))} (killed before it could "
                   f"write one: see stacks/rank_N.exit.txt)")
    places = where(run_dir, root)
    if places:
        out += ["where each rank was:"] + [f"  rank {r}: {places[r]}" for r in sorted(places)]
    if out:
        (run_dir / "diagnosis.txt").write_text("\n".join(out) + "\n")
    return out
