"""The planner's layouts handed to a lab: `plscale lab run 4d --layout plan.json[:N]`, and the
sweep of every layout (`plscale lab run 4d --sweep`, a lab whose lab.yaml says `sweep: {layouts: planner}`).

A candidate of `plscale plan` (plscale.predict.plan.Candidate, or its JSON) becomes the lab's
settings: parallel.tp, .pp and .cp (dp follows from the ranks), ds.micro_batch, ds.grad_accum
(the micro-batches a step), ds.stage (ZeRO), tp.sequence_parallel, and `planned.*`, the planner's
step time and its terms, which the lab prints beside what it measures. The lab's own check.py
stays the judge of what it can run.

The sweep plans for this machine (plscale.run.machine: N CPU ranks measured under load) the job
the lab's settings describe (its model, sequence, micro-batch and global batch, fp32, no
recomputation, plain 1F1B), keeps for each dp x tp x pp x cp the planner's best candidate the lab
accepts, and runs them in the planner's order; sweep.json records the machine and what was left out.
"""

import json
import re
from pathlib import Path
from typing import NamedTuple

from plscale.errors import UserError
from plscale.lab.labs import Lab, Variant
from plscale.lab.settings import parse_assignment
from plscale.predict.plan import Job, plan
from plscale.predict.presets import preset
from plscale.predict.step_time import TERMS

LAYOUT_KEYS = ("parallel.tp", "parallel.pp", "parallel.cp", "ds.micro_batch", "ds.grad_accum", "ds.stage",
               "tp.sequence_parallel")     # what settings_of sets, planned.* besides
PLAN_COMMAND = ("plscale plan --here --gpus {ranks} --model {preset} --seq {seq} --global-batch {batch} "
                "--micro-batch {micro} --recompute none --virtual 1 --json > plan.json")


def name_of(c: dict) -> str:
    return f"dp{c['dp']}-tp{c['tp']}-pp{c['pp']}-cp{c['cp']}"


def settings_of(c: dict) -> list[str]:
    """A planner's candidate (its JSON) as `--set` assignments of the lab's settings."""
    if c["recompute"] != "none":
        raise UserError(f"The plan's layout {name_of(c)} recomputes ({c['recompute']}); the lab keeps every "
                        f"activation: plan with --recompute none.")
    if c.get("ep", 1) != 1:
        raise UserError(f"The plan's layout {name_of(c)} splits experts over ep {c['ep']}; the lab trains a dense "
                        f"Llama: plan one of its presets.")
    if c["virtual"] != 1:
        raise UserError(f"The plan's layout {name_of(c)} interleaves {c['virtual']} chunks a stage; the lab runs "
                        f"plain 1F1B: plan with --virtual 1.")
    return [f"parallel.tp={c['tp']}", f"parallel.pp={c['pp']}", f"parallel.cp={c['cp']}",
            f"ds.micro_batch={c['micro_batch']}", f"ds.grad_accum={c['micro_batches']}", f"ds.stage={c['zero']}",
            f"tp.sequence_parallel={str(c['sp']).lower()}", f"planned.step_s={c['step_s']:.6g}",
            *(f"planned.{t}={c['terms_s'].get(t, 0.0):.6g}" for t in TERMS)]


def job_of(settings: dict, ranks: int) -> dict:
    """What a plan for the lab's run must match: model, sequence, micro-batch, global batch."""
    par, ds = settings["parallel"], settings["ds"]
    dp = ranks // (par.get("tp", 1) * par.get("pp", 1) * par.get("cp", 1))
    return {"ranks": ranks, "preset": settings["model"]["preset"], "seq": settings["model"]["seq"],
            "batch": dp * ds["micro_batch"] * ds["grad_accum"], "micro": ds["micro_batch"]}


def variant_of(c: dict) -> Variant:
    """A planner's candidate as a variant of the lab, named after its layout (dp2-tp2-pp2-cp1)."""
    return Variant(name_of(c), dict(parse_assignment(a) for a in settings_of(c)),
                   about=f"the planner's layout {name_of(c)} on this machine")


def check_sets(sets: list[str], flag: str) -> None:
    """The user's --set may change the job, not what the layout chooses."""
    for text in sets:
        key = parse_assignment(text)[0]
        if key in LAYOUT_KEYS or key.startswith("planned."):
            raise UserError(f"--set {text}: {flag} chooses {key} itself; drop the --set, or run a variant of your own "
                            f"without {flag}.")


def split_spec(spec: str) -> tuple[Path, int]:
    """`plan.json` -> (plan.json, 1); `plan.json:3` -> (plan.json, 3); a file named `plan:3` is itself."""
    found = re.fullmatch(r"(.+):([0-9]+)", spec)
    if found is None or Path(spec).exists():
        return Path(spec), 1
    return Path(found[1]), int(found[2])


def chosen(spec: str, settings: dict, ranks: int) -> Variant:
    """`plan.json` (its first candidate) or `plan.json:N` as a variant of the lab, checked against
    the lab's run: a plan of `plscale plan --here` for the same model, sequence, batch, precision."""
    path, pick = split_spec(spec)
    want = job_of(settings, ranks)
    command = PLAN_COMMAND.format(**want)
    try:
        raw = json.loads(path.read_text())
        candidates, job, model, shape = raw["candidates"], raw["job"], raw["model"], raw["shape"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise UserError(f"--layout {spec}: not a plan's JSON ({exc.__class__.__name__}: {exc}); write one with "
                        f"`{command}`.") from None
    if "machine" not in raw:
        raise UserError(f"--layout {spec}: a plan for {raw.get('gpu', {}).get('name', 'a GPU')}, not this machine; "
                        f"the lab runs here: write one with `{command}`.")
    if not 1 <= pick <= len(candidates):
        raise UserError(f"--layout {spec}: the plan lists {len(candidates)} candidates; pick 1 to {len(candidates)} "
                        f"(plan.json:2 is the second).")
    got = {"ranks": job["gpus"], "preset": model, "seq": job["seq"], "batch": job["global_batch"],
           "precision": job["precision"]}
    want = {**want, "precision": settings["ds"]["precision"]}
    wrong = [f"{k} {got[k]} (the lab's {want[k]})" for k in got if got[k] != want[k]]
    if shape != preset(want["preset"]).to_dict():
        wrong.append(f"a changed shape of {model} (the lab's is the preset's)")
    if wrong:
        raise UserError(f"--layout {spec}: the plan is for another run: {', '.join(wrong)}; plan the lab's with "
                        f"`{command}`.")
    return variant_of(candidates[pick - 1])


class Planned(NamedTuple):
    """The layouts a sweep runs, each with its planner candidate, best predicted first."""
    runs: list          # (Variant, candidate dict)
    machine: dict       # plscale.run.machine.Machine.to_dict()
    left_out: list      # "dpX-tpY-ppZ-cpW: why", layouts the planner offered that the lab refused


def planned(lab: Lab, settings: dict, ranks: int, accepts, console) -> Planned:
    """Measure this machine, plan the lab's job on it, keep what the lab accepts (module doc).
    accepts(variant) raises UserError when the lab refuses the variant's settings."""
    from plscale.run.machine import measure_showing

    want = job_of(settings, ranks)
    config = preset(want["preset"])
    machine = measure_showing(console, ranks, config, want["micro"], want["seq"])
    job = Job(config, ranks, want["seq"], want["batch"], settings["ds"]["precision"], 1.0,
              fixed=(("recompute", "none"), ("micro_batch", want["micro"]), ("virtual", 1)), overlap=False)
    result = plan(job, machine.cluster())
    runs, refused = {}, {}
    for c in result.ranked:
        d = c.to_dict()
        name = name_of(d)
        if name in runs:
            continue
        variant = variant_of(d)
        try:
            accepts(variant)
        except UserError as exc:
            refused.setdefault(name, str(exc))
            continue
        runs[name] = (variant, d)
    left_out = [f"{name}: {why}" for name, why in refused.items() if name not in runs]
    return Planned(list(runs.values()), machine.to_dict(), left_out)
