"""`plscale exercise`: every reference solution passes every check, every untouched skeleton
fails them all as "not implemented", a plausible wrong solution of each exercise fails the
property it breaks (with a hint), a deadlock stops in one line, and the CLI end to end.

Starting ranks costs about 2 s each (importing torch), so all files are checked in ONE start
of 4 ranks (the `batch` fixture); the CLI test uses the one-rank exercise.
"""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import run_cli

from plscale.exercises import EXERCISES, find
from plscale.exercises.runner import _merge, run_checks

# A plausible mistake per exercise: (a line of its solution.py, the line the student wrote instead),
# the checks it must fail, and checks it must still pass.
WRONG = {
    "ring-allreduce": (
        "    for step in range(n - 1):  # all-gather",
        "    for step in range(n - 2):  # all-gather",                   # one step short
        {"sums in place: the tensor passed in holds torch's all_reduce result", "messages: 2(N-1) calls to exchange per rank",
         "bytes: each rank sends 2(N-1)/N of the tensor"},
        {"ring neighbours: every exchange sends to rank (r+1) % N and receives from (r-1) % N",
         "point-to-point only: no collective of torch.distributed"}),
    "tp-column": (
        "        return _summed(grad)",
        "        return grad",                                            # f forgets its backward all-reduce
        {"f backward: the gradient summed over the ranks",
         "column layer backward: input, weight and bias gradients equal the whole layer's",
         "communication: the layer's forward sends nothing, its backward one all-reduce"},
        {"f forward: identity (same values, same shape)", "g forward: the sum over the ranks, the input left unchanged",
         "g backward: identity", "column layer forward: this rank's slice of the whole layer's output"}),
    "pipeline-schedule": (
        "    warmup = min(p - s - 1, m)",
        "    warmup = min(p - s, m)",                                     # one warm-up forward too many
        {"1f1b: stage s holds at most p - s micro-batches' activations at once",
         "1f1b: warm-up forwards, then one forward one backward, then the backwards left"},
        {"gpipe: all forwards first, then all backwards, micro-batches in order",
         "1f1b runs for real over p2p on p ranks: gradients equal the whole model's (m = 4)"}),
    "zero1": (
        ("        slices = [torch.empty_like(self.shard) for _ in range(self.world)]\n"
         "        dist.all_gather(slices, self.shard)\n        unflatten_into(torch.cat(slices), self.params)"),
        ("        full = torch.cat([flatten(self.params), torch.zeros(self.k * self.world - self.numel)])\n"
         "        full[self.start:self.end] = self.shard\n        unflatten_into(full, self.params)"),  # no all-gather
        {"one step: parameters equal torch's AdamW (weight decay 0.1) stepping the whole model, bit for bit",
         "replicas: every rank holds the same parameters after a step",
         "communication: one all-gather per step, no other collective"},
        {"shard bounds: rank r owns elements [r·k, (r+1)·k) of the padded vector, k = ceil(P/N)",
         "the shard and the optimizer: k fp32 elements on the parameters' device, the state of k only"}),
    "bucketed-ddp": (
        "            flat /= world\n",
        "",                                                              # the sum, not the mean
        {"gradients after finish() equal torch's DistributedDataParallel's (the mean over the ranks)",
         "three SGD steps equal torch's DDP's, and every rank holds the same parameters"},
        {"buckets: parameters in reverse order, at most bucket_bytes of fp32 gradient each",
         "overlap: one async all-reduce per bucket, each started during the backward",
         "finish() waits and copies: no collective of its own"}),
    "fsdp": (
        "        return mine / dist.get_world_size()",
        "        return mine",                                            # the sum over the ranks, not the mean
        {"backward: each shard's gradient is this rank's slice of the whole model's mean gradient",
         "three SGD steps (momentum 0.9) equal PyTorch's fully_shard (reshard_after_forward=False)"},
        {"shards: one fp32 nn.Parameter per unit, this rank's k = ceil(P/N) elements of its flat weights",
         "forward: the output equals the whole model's",
         "communication: one all-gather per unit in forward, one reduce-scatter per unit in backward"}),
    "zero-memory": (
        '            "gradients": p * psi / (dp if stage >= 2 else 1),',
        '            "gradients": p * psi / (dp if stage >= 1 else 1),',   # stage 1 shards the gradients too
        {"stage 1: the optimizer states partitioned over the data-parallel ranks"},
        {"stage 0: every rank holds all three for all of its parameters", "stage 2: the gradients partitioned too"}),
}
# More mistakes, checked like WRONG: (label, exercise, old line, new line, checks that fail, checks that pass).
MORE_WRONG = [
    ("in-place", "tp-column", "        return _summed(grad)",        # f all-reduces autograd's own tensor
     "        dist.all_reduce(grad)\n        return grad",
     {"f backward: the gradient summed over the ranks"},
     {"f forward: identity (same values, same shape)", "column layer forward: this rank's slice of the whole layer's output"}),
    ("imported", "ring-allreduce", "    n, rank = dist.get_world_size(), dist.get_rank()\n",   # torch's collective,
     "    all_reduce(tensor)\n    return\n", # reached through a name imported from torch.distributed
     {"point-to-point only: no collective of torch.distributed", "messages: 2(N-1) calls to exchange per rank"},
     {"sums in place: the tensor passed in holds torch's all_reduce result"}),
]
# a ring whose ranks all receive before they send: every rank waits forever
DEADLOCK = ("        exchange(chunks[out], right, arrived, left)",
            "        dist.recv(arrived, left)\n        dist.send(chunks[out], right)")
# a ring whose receive buffer has the wrong chunk's size: the same size on 2 ranks, and on 3 ranks
# gloo aborts the receiving rank when a message does not fit ("any size" has uneven chunks)
CRASH = ("        arrived = torch.empty_like(chunks[into])",
         "        arrived = torch.empty_like(chunks[(rank - step + 1) % n])")
# files the checks cannot run (zero-memory: one process each)
ZERO_MEMORY = find("zero-memory").solution.read_text()
BROKEN = {"exits": "import sys\nsys.exit(3)\n" + ZERO_MEMORY,
          "lacks": ZERO_MEMORY.replace("def zero_memory(", "def zero_mem("),
          # a TimeoutError of the student's own: an error, not a deadlock (the checks go on)
          "times-out": ZERO_MEMORY.replace('    psi, p = params', '    raise TimeoutError("timed out")\n    psi, p = params')}


def _mutate(name: str, old: str, new: str, folder: Path, label: str = "wrong") -> Path:
    text = find(name).solution.read_text()
    assert text.count(old) == 1, f"{name}: the solution changed, update WRONG: {old!r}"
    path = folder / f"{label}-{name}.py"
    if label == "imported":
        text = text.replace("import torch.distributed as dist\n", "import torch.distributed as dist\n"
                            "from torch.distributed import all_reduce\n")
    path.write_text(text.replace(old, new))
    return path


@pytest.fixture(scope="module")
def batch(tmp_path_factory):
    folder = tmp_path_factory.mktemp("exercises")
    jobs = [("solution", e, e.solution) for e in EXERCISES.values()]
    jobs += [("skeleton", e, e.skeleton) for e in EXERCISES.values()]
    jobs += [("wrong", find(n), _mutate(n, old, new, folder)) for n, (old, new, _, _) in WRONG.items()]
    jobs += [(label, find(n), _mutate(n, old, new, folder, label)) for label, n, old, new, _, _ in MORE_WRONG]
    for label, text in BROKEN.items():
        (folder / f"{label}.py").write_text(text)
        jobs += [(label, find("zero-memory"), folder / f"{label}.py")]
    jobs += [("deadlock", find("ring-allreduce"), _mutate("ring-allreduce", *DEADLOCK, folder, "deadlock"))]
    jobs += [("crash", find("ring-allreduce"), _mutate("ring-allreduce", *CRASH, folder, "crash"))]  # last: it stops the ranks
    results = run_checks([(e, f) for _, e, f in jobs], timeout=150, op_timeout=8)
    return {(kind, e.name): r for (kind, e, _), r in zip(jobs, results)}


def test_every_exercise_has_a_skeleton_solution_and_checks():
    assert {"ring-allreduce", "tp-column", "pipeline-schedule", "zero1", "zero-memory", "bucketed-ddp",
            "fsdp"} <= set(EXERCISES)
    for e in EXERCISES.values():
        assert "NotImplementedError" in e.skeleton.read_text() and "TODO" in e.skeleton.read_text()
        assert "NotImplementedError" not in e.solution.read_text()
        assert (e.folder / "checks.py").is_file()
        assert max(e.worlds) <= 4 and (e.worlds == (1,) or min(e.worlds) >= 2)


@pytest.mark.parametrize("name", sorted(EXERCISES))
def test_reference_solution_passes_every_check(batch, name):
    result = batch[("solution", name)]
    assert result.passed, [(c.name, c.detail) for c in result.checks if not c.passed] or result.problem
    assert len(result.checks) >= 6


@pytest.mark.parametrize("name", sorted(EXERCISES))
def test_untouched_skeleton_fails_every_check_as_not_implemented(batch, name):
    result, solved = batch[("skeleton", name)], batch[("solution", name)]
    assert [c.name for c in result.checks] == [c.name for c in solved.checks]
    assert not any(c.passed for c in result.checks)
    assert all(c.status == "todo" and c.detail.startswith("not implemented yet: ") for c in result.checks)
    assert result.not_implemented  # the functions named, e.g. ring_all_reduce


@pytest.mark.parametrize("name", sorted(WRONG))
def test_a_wrong_solution_fails_the_property_it_breaks_with_a_hint(batch, name):
    result = batch[("wrong", name)]
    _, _, must_fail, must_pass = WRONG[name]
    failed = {c.name: c for c in result.checks if not c.passed}
    assert must_fail <= set(failed), set(failed)
    assert must_pass.isdisjoint(failed), set(failed) & must_pass
    for check in (failed[n] for n in must_fail):
        assert check.status == "fail" and check.detail and check.hint, check
    code = [line.strip() for line in find(name).solution.read_text().splitlines()
            if len(line.strip()) > 12 and not line.strip().startswith(("#", '"', "def ", "class ", "import ", "from "))]
    leaked = [(c.name, line) for c in failed.values() for line in code if line in c.hint + c.detail]
    assert not leaked  # hints and details are prose: no line of the reference solution


@pytest.mark.parametrize("label", [case[0] for case in MORE_WRONG])
def test_more_mistakes_fail_their_property(batch, label):
    _, name, _, _, must_fail, must_pass = next(case for case in MORE_WRONG if case[0] == label)
    result = batch[(label, name)]
    failed = {c.name: c for c in result.checks if not c.passed}
    assert must_fail <= set(failed) and must_pass.isdisjoint(failed), set(failed)
    assert all(failed[n].status == "fail" and failed[n].hint for n in must_fail)
    if label == "in-place":
        assert "changed in place" in failed[next(iter(must_fail))].detail
    else:
        assert "called dist.all_reduce" in failed["point-to-point only: no collective of torch.distributed"].detail


def test_a_check_passes_only_on_every_rank_count_and_a_crash_names_where(batch):
    result = batch[("crash", "ring-allreduce")]
    assert not result.passed and not any(c.passed for c in result.checks)
    assert 'crashed in check "any size' in result.problem and "on 3 ranks" in result.problem
    assert "a receive buffer's size differs from what the neighbour sent" in result.problem
    checks = {c.name: c for c in result.checks}
    crashed = checks["any size: 10 and 3 elements (chunks of different sizes, some empty) and a 3 x 5 matrix"]
    assert crashed.status == "crashed" and crashed.detail.startswith("3 ranks, rank ") and crashed.hint
    first = checks["sums in place: the tensor passed in holds torch's all_reduce result"]
    assert first.status == "not run" and first.detail.startswith("passed on 2, 3 ranks; not run on 4 ranks")
    later = checks["messages: 2(N-1) calls to exchange per rank"]
    assert later.status == "not run" and later.detail.startswith("passed on 2 ranks; not run on 3, 4 ranks")


def test_a_file_that_cannot_be_checked_says_why_once(batch):
    exits, lacks = batch[("exits", "zero-memory")], batch[("lacks", "zero-memory")]
    assert exits.problem.startswith("your file exited while being imported (exit code 3)") and not exits.checks
    assert lacks.problem.startswith("your file defines no `zero_memory`") and not lacks.checks
    assert not exits.passed and not lacks.passed


def test_a_timeout_error_of_the_students_own_is_no_deadlock(batch):
    result = batch[("times-out", "zero-memory")]
    statuses = {c.status for c in result.checks}
    assert "hung" not in statuses and "skipped" not in statuses and "error" in statuses, statuses


def test_wrong_ring_reports_where_it_failed(batch):
    counted = {c.name: c for c in batch[("wrong", "ring-allreduce")].checks}["messages: 2(N-1) calls to exchange per rank"]
    assert counted.detail == "2 ranks, rank 0: 1 call to exchange on a ring of 2 ranks"


def test_a_deadlocked_ring_fails_in_one_line_and_skips_the_rest(batch):
    result = batch[("deadlock", "ring-allreduce")]
    assert not result.passed and not result.problem  # stopped inside the check, not by the run's time limit
    first, *rest = result.checks
    assert first.status == "hung" and "deadlock" in first.detail
    assert rest and all(c.status == "skipped" for c in rest)


def test_host_side_imports_no_torch():
    code = "import sys, plscale.cli.exercise, plscale.exercises.runner; print('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False).stdout.strip() == "False"


def test_cli_start_check_fails_then_passes(tmp_path):
    started = run_cli("exercise", "start", "zero-memory", cwd=tmp_path)
    assert started.returncode == 0, started.stderr
    mine = tmp_path / "exercises" / "zero-memory.py"
    lesson = next(line for line in started.stdout.splitlines() if line.startswith("lesson: "))
    assert Path(lesson.removeprefix("lesson: ")).is_absolute() and Path(lesson.removeprefix("lesson: ")).is_file()
    assert mine.read_text() == find("zero-memory").skeleton.read_text()

    failing = run_cli("exercise", "check", "zero-memory", cwd=tmp_path, timeout=120)
    assert failing.returncode == 1, failing.stdout + failing.stderr
    assert "not implemented yet: zero_memory" in failing.stdout and "0 of 6 checks pass" in failing.stdout

    shutil.copyfile(find("zero-memory").solution, mine)
    passing = run_cli("exercise", "check", "zero-memory", cwd=tmp_path, timeout=120)
    assert passing.returncode == 0, passing.stdout + passing.stderr
    assert "All 6 checks pass" in passing.stdout and "FAIL" not in passing.stdout

    (tmp_path / "quits.py").write_text("import os\nos._exit(0)\n")  # dies at import: no result line
    quits = run_cli("exercise", "check", "zero-memory", "--file", str(tmp_path / "quits.py"), cwd=tmp_path, timeout=120)
    assert quits.returncode == 1 and "your file exited while being imported (exit code 0)" in quits.stdout, quits.stdout
    assert "0 of 0" not in quits.stdout

    listed = run_cli("exercise", "list", cwd=tmp_path)
    row = next(line for line in listed.stdout.splitlines() if "zero-memory" in line)
    assert "passing" in row and "not started" in next(line for line in listed.stdout.splitlines() if "zero1" in line)


def test_bad_input_is_one_line_and_exit_2(tmp_path, quick_cli):
    # refused (or only files written) before any rank starts: the same main() in this process
    unknown = quick_cli("exercise", "check", "ring-alreduce", cwd=tmp_path)
    assert unknown.returncode == 2 and "Did you mean: ring-allreduce" in unknown.stderr
    assert "Traceback" not in unknown.stderr and len(unknown.stderr.strip().splitlines()) == 1

    not_started = quick_cli("exercise", "check", "zero1", cwd=tmp_path)
    assert not_started.returncode == 2 and "plscale exercise start zero1" in not_started.stderr

    assert quick_cli("exercise", "start", "zero1", cwd=tmp_path).returncode == 0
    (tmp_path / "exercises" / "zero1.py").write_text("# my work\n")
    again = quick_cli("exercise", "start", "zero1", cwd=tmp_path)
    assert again.returncode == 2 and "--force" in again.stderr
    assert (tmp_path / "exercises" / "zero1.py").read_text() == "# my work\n"  # nothing overwritten

    folder = quick_cli("exercise", "check", "zero1", "--file", str(tmp_path), cwd=tmp_path)
    assert folder.returncode == 2 and "is a folder" in folder.stderr


def test_a_hang_on_one_rank_explains_its_neighbours_broken_connection():
    """In a deadlock the rank that times out first closes the pair: its neighbour sees a closed
    connection, not a timeout. The check reads as the hang, whichever rank reported it."""
    rows = [{"name": "sums", "world": 2, "rank": 0, "status": "error", "detail": "raised RuntimeError: Connection closed by peer"},
            {"name": "sums", "world": 2, "rank": 1, "status": "hung", "detail": "timed out waiting for a message"}]
    merged = _merge("sums", rows, [2], "")
    assert merged.status == "hung" and merged.detail == "2 ranks, rank 1: timed out waiting for a message"
