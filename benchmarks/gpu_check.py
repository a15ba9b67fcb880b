"""Every lab on this machine's GPUs, in one command, and one table of what they measured.

    python benchmarks/gpu_check.py                      # every lab's default variant on 1, 2 and all GPUs
    python benchmarks/gpu_check.py --dry-run --gpus 8   # the plan only: what would run (no GPU needed)
    python benchmarks/gpu_check.py --labs zero,pipeline --steps 10 --out gpu_check
    python benchmarks/gpu_check.py --cpu --gpus 2 --labs zero --steps 3    # the same on CPU ranks (a rehearsal)

For each lab (the JAX lab only when jax is installed), the default variant runs through the real
CLI (`plscale lab run LAB --gpus G --steps N`, NCCL between the GPUs) on 1, 2 and the machine's
GPU count, each where the lab allows that many ranks; then the MFU target, first: the zero2 lab on the
124M preset in bf16 on one GPU, and its FSDP2 variant with torch.compile. Each run's summary gives the row: tokens/s, MFU against the
measured matmul peak and against the datasheet, model states per rank against the ZeRO model,
resident memory, the collectives' bus bandwidth. The first run that fails stops the check: its
command, its exit code and the end of its output are printed, and the exit code is 1.

The table is printed and written with every run's figures to OUT/gpu_check.json and
OUT/gpu_check.md (OUT: --out, default runs/gpu_check-<time>); the run directories are in OUT/runs.
"""

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from plscale.errors import UserError  # noqa: E402  (host side: no torch)
from plscale.lab.labs import all_labs  # noqa: E402
from plscale.lab.resolve import Topology, resolve_run  # noqa: E402

# a lab that compares runs prefixes their figures ("none: MFU", "fp32: MFU"): the first run's is the row's
WANTED = re.compile(r"^(?:[\w+-]+: )?(throughput|MFU|MFU \(datasheet\)|HFU|model states per rank \(max\)|"
                    r"resident memory per rank \(max\)|memory per rank \(max\)|step time)$|busbw", re.IGNORECASE)
COLUMNS = ("throughput", "MFU", "MFU (datasheet)", "model states per rank (max)", "resident memory per rank (max)",
           "busbw")
SHAPE_124M = ["model.preset=124m", "model.seq=1024", "ds.micro_batch=8"]
# the MFU target, under DeepSpeed and under PyTorch's own path (FSDP2, each layer compiled); they run first,
# so that a short lease records them before anything else
TARGETS = [{"lab": "zero", "variant": "zero2", "gpus": 1, "settings": SHAPE_124M + ["ds.precision=bf16"],
            "why": "MFU target: the 124M preset in bf16 on one GPU, >= 45% of the datasheet peak"},
           {"lab": "zero", "variant": "fsdp2-bf16", "gpus": 1, "settings": SHAPE_124M + ["fsdp.compile=true"],
            "why": "MFU target under FSDP2 with torch.compile: the 124M preset in bf16 on one GPU"}]


def gpu_count() -> int:
    """The GPUs nvidia-smi lists, as CUDA_VISIBLE_DEVICES narrows them."""
    from plscale.hardware import cuda_gpus
    return len(cuda_gpus())


def has_jax() -> bool:
    import importlib.util
    return importlib.util.find_spec("jax") is not None


def plan(gpus: int, names: list[str] | None, with_jax: bool, steps: int = 20,
         device: str = "cuda") -> tuple[list[dict], list[str]]:
    """The runs, in order, and why the others are left out: each is resolved here as `plscale lab
    run` would resolve it with the lab's own settings (a layout a rank count cannot take is left
    out, with the CLI's reason; a bad --set fails the run itself, loudly)."""
    runs, skipped = [], []
    labs = [lab for lab in all_labs() if not names or lab.id in names or str(lab.number) in names]
    for lab in labs:
        if lab.launcher == "jax" and not with_jax:
            skipped.append(f"{lab.id}: jax is not installed (pip install -e '.[jax]'; on GPUs jax[cuda12])")
            continue
        variant = lab.variants[lab.default_variant]
        fixed = variant.ranks
        most = max((n for n in lab.allowed_ranks if n <= gpus), default=gpus)   # all the GPUs, or as many as it takes
        counts = [fixed] if fixed else sorted({1, 2, most})
        for g in counts:
            if g > gpus or g not in lab.allowed_ranks:
                skipped.append(f"{lab.id} on {g} GPU{'s' * (g != 1)}: "
                               + ("more than this machine has" if g > gpus else
                                  f"the lab runs on {', '.join(map(str, lab.allowed_ranks))} ranks"))
                continue
            try:
                resolve_run(lab, variant, Topology(g, device), [], steps)
            except UserError as exc:
                skipped.append(f"{lab.id} on {g} GPU{'s' * (g != 1)}: {str(exc).splitlines()[0]}")
                continue
            runs.append({"lab": lab.id, "variant": lab.default_variant, "gpus": g, "settings": []})
    if not names or "zero" in names:
        runs = [dict(t) for t in TARGETS] + runs
    return runs, skipped


def command(run: dict, steps: int, cpu: bool, extra: list[str]) -> list[str]:
    """plscale's argv for a run (after `python -m plscale.cli.main`)."""
    argv = ["lab", "run", run["lab"], "--variant", run["variant"], "--gpus", str(run["gpus"]), "--steps", str(steps)]
    for s in run["settings"] + extra:
        argv += ["--set", s]
    return argv + (["--cpu"] if cpu else [])


def row_of(summary: dict) -> dict:
    out = {}
    for f in summary.get("figures", []):
        if found := WANTED.search(f["name"]):
            key = "busbw" if "busbw" in f["name"].lower() else found.group(1)
            out.setdefault(key, f)
    return out


def shown(f: dict | None) -> str:
    if not f:
        return ""
    value = f["value"]
    text = f"{value:,.4g}" if isinstance(value, (int, float)) else str(value)
    if f.get("predicted") is not None:
        text += f" / {f['predicted']:,.4g}"
    return f"{text} {f.get('unit', '')}".strip()


def table(results: list[dict]) -> str:
    head = "| lab | variant | GPUs | result | " + " | ".join(COLUMNS) + " |"
    lines = [head, "|" + "---|" * (4 + len(COLUMNS))]
    for r in results:
        result = ("passed" if r["passed"] else "checks failed") if r.get("exit_code", 0) in (0, 1) and r["run_dir"] \
            else f"failed (exit {r['exit_code']})"
        lines.append(f"| {r['lab']} | {r['variant']} | {r['gpus']} | {result} | "
                     + " | ".join(shown(r["figures"].get(c)) for c in COLUMNS) + " |")
    return "\n".join(lines) + "\n\n(measured / predicted where the lab predicts it)"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gpus", type=int, default=None, help="GPUs to use at most (default: nvidia-smi -L's count)")
    ap.add_argument("--labs", default="", help="comma-separated lab ids or numbers (default: every lab)")
    ap.add_argument("--steps", type=int, default=20, help="training steps a run (default 20)")
    ap.add_argument("--out", type=Path, default=None, help="folder for the table and the runs")
    ap.add_argument("--dry-run", action="store_true", help="print the plan and the commands, run nothing")
    ap.add_argument("--cpu", action="store_true", help="run on CPU ranks over gloo instead (a rehearsal)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a setting for every run")
    ap.add_argument("--keep-going", action="store_true",
                    help="after a failed run, go on with the next (its row says failed); the exit code is still 1")
    ap.add_argument("--timeout-s", type=int, default=1800, help="a run still going after this long fails the check")
    args = ap.parse_args(argv)
    for flag, value in (("--gpus", args.gpus), ("--steps", args.steps), ("--timeout-s", args.timeout_s)):
        if value is not None and value < 1:
            print(f"gpu_check: {flag} {value}: use 1 or more", file=sys.stderr)
            return 2

    gpus = args.gpus if args.gpus is not None else gpu_count()
    if gpus < 1:
        print("gpu_check: no GPU found (nvidia-smi -L lists none); give --gpus N with --dry-run or --cpu",
              file=sys.stderr)
        return 2
    names = [n.strip() for n in args.labs.split(",") if n.strip()]
    known = {lab.id for lab in all_labs()} | {str(lab.number) for lab in all_labs()}
    if unknown := [n for n in names if n not in known]:
        print(f"gpu_check: unknown lab(s) {', '.join(unknown)}; the labs: {', '.join(sorted(known))}", file=sys.stderr)
        return 2
    runs, skipped = plan(gpus, names, has_jax(), args.steps, "cpu" if args.cpu else "cuda")
    if args.cpu:  # the MFU target is a GPU's
        runs = [r for r in runs if "why" not in r]
    for r in runs:  # the --set values on every run, before anything runs or is written
        lab = next(lab for lab in all_labs() if lab.id == r["lab"])
        try:
            resolve_run(lab, lab.variants[r["variant"]], Topology(r["gpus"], "cpu" if args.cpu else "cuda"),
                        r["settings"] + args.set, args.steps)
        except UserError as exc:
            print(f"gpu_check: {r['lab']} with --set {' --set '.join(args.set)}: {str(exc).splitlines()[0]}",
                  file=sys.stderr)
            return 2
    print(f"gpu_check: {len(runs)} runs on up to {gpus} {'CPU ranks' if args.cpu else 'GPUs'}, {args.steps} steps each")
    for s in skipped:
        print(f"  left out: {s}")
    if args.dry_run:
        for r in runs:
            print("  plscale " + " ".join(command(r, args.steps, args.cpu, args.set))
                  + (f"   # {r['why']}" if "why" in r else ""))
        return 0

    out = args.out or ROOT / "runs" / time.strftime("gpu_check-%Y%m%d-%H%M%S")
    (out / "runs").mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PLSCALE_RUNS_DIR": str(out / "runs")}
    results, failed = [], 0
    for i, r in enumerate(runs, 1):
        argv = command(r, args.steps, args.cpu, args.set)
        print(f"[{i}/{len(runs)}] plscale {' '.join(argv)}", flush=True)
        before = set((out / "runs").iterdir())
        t0 = time.perf_counter()
        done = subprocess.Popen([sys.executable, "-m", "plscale.cli.main", *argv], cwd=ROOT, env=env, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
        try:
            done.stdout, done.stderr = done.communicate(timeout=args.timeout_s)
        except subprocess.TimeoutExpired:  # a hung run: its whole process group (CLI, launcher, ranks) ends
            os.killpg(done.pid, signal.SIGTERM)
            done.stdout, done.stderr = done.communicate()
            done.returncode = f"none: still running after {args.timeout_s} s (--timeout-s), stopped"
        new = sorted(set((out / "runs").iterdir()) - before)
        summary_file = next((d / "summary.json" for d in new if (d / "summary.json").is_file()), None)
        if done.returncode != 0 or summary_file is None:
            print(f"\nFAILED: plscale {' '.join(argv)}\n  exit code {done.returncode}"
                  f"{'' if summary_file else ', no summary.json'}; the end of its output:\n"
                  + (done.stdout[-4000:] + done.stderr[-4000:]), file=sys.stderr, flush=True)
            failed += 1
            if not args.keep_going:
                return 1
        summary = json.loads(summary_file.read_text()) if summary_file else {}
        results.append({**r, "run_dir": str(summary_file.parent) if summary_file else None,
                        "wall_s": round(time.perf_counter() - t0, 1), "exit_code": done.returncode,
                        "passed": summary.get("passed"), "figures": row_of(summary)})
        write(out, results, skipped)   # after every run: a machine taken back early keeps what ran
        print(f"    {results[-1]['wall_s']} s; " + "; ".join(f"{k} {shown(v)}" for k, v in results[-1]["figures"].items()
                                                          if k in COLUMNS), flush=True)
    text = write(out, results, skipped)
    print("\n" + text + f"\n\nwritten: {out / 'gpu_check.md'}, {out / 'gpu_check.json'}")
    return 1 if failed else 0


def write(out: Path, results: list[dict], skipped: list[str]) -> str:
    """The table and the record so far, into OUT; the table's text."""
    text = table(results)
    for r in results:
        if "why" in r and (mfu := r["figures"].get("MFU (datasheet)")):
            text += (f"\n\n{r['why']}: {mfu['value']:.1f}% MFU against the datasheet peak: "
                     + ("met" if mfu["value"] >= 45 else "NOT met"))
    (out / "gpu_check.json").write_text(json.dumps({"skipped": skipped, "results": results}, indent=2))
    (out / "gpu_check.md").write_text(text + "\n")
    return text


if __name__ == "__main__":
    sys.exit(main())
