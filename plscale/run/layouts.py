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
from pathlib import Path
from typing import NamedTuple

from plscale.errors import UserError
from plscale.lab.labs import Lab, Variant
from plscale.lab.settings import parse_assignment
from plscale.predict.plan import Job, plan
from plscale.predict.presets import preset
from plscale.predict.step_time import TERMS

PLAN_COMMAND = ("plscale plan --here --gpus {ranks} --model {preset} --seq {seq} --global-batch {batch} "
                "--micro-batch {micro} --recompute none --virtual 1 --json > plan.json")


def name_of(c: dict) -> str:
    return f"dp{c['dp']}-tp{c['tp']}-pp{c['pp']}-cp{c['cp']}"


def settings_of(c: dict) -> list[str]:
    """A planner's candidate (its JSON) as `--set` assignments of the lab's settings."""
    if c["recompute"] != "none":
        raise UserError(f"The plan's layout {name_of(c)} recomputes ({c['recompute']}); the lab keeps every "
                        f"activation: plan with --recompute none.")
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


def chosen(spec: str, settings: dict, ranks: int) -> tuple[dict, list[str]]:
    """`plan.json` (its first candidate) or `plan.json:N`: the candidate and its --set assignments,
    checked against the lab's run (module doc)."""
    path, _, pick = spec.rpartition(":") if ":" in spec and spec.rpartition(":")[2].isdigit() else (spec, "", "1")
    want = job_of(settings, ranks)
    command = PLAN_COMMAND.format(**want)
    try:
        raw = json.loads(Path(path).read_text())
        candidates, job, model = raw["candidates"], raw["job"], raw["model"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise UserError(f"--layout {spec}: not a plan's JSON ({exc.__class__.__name__}: {exc}); write one with "
                        f"`{command}`.") from None
    if not 1 <= int(pick) <= len(candidates):
        raise UserError(f"--layout {spec}: the plan lists {len(candidates)} candidates; pick 1 to {len(candidates)} "
                        f"(plan.json:2 is the second).")
    got = {"ranks": job["gpus"], "preset": model, "seq": job["seq"], "batch": job["global_batch"]}
    wrong = [f"{k} {got[k]} (the lab's {want[k]})" for k in got if got[k] != want[k]]
    if wrong:
        raise UserError(f"--layout {spec}: the plan is for another run: {', '.join(wrong)}; plan the lab's with "
                        f"`{command}`.")
    c = candidates[int(pick) - 1]
    return c, settings_of(c)


class Planned(NamedTuple):
    """The layouts a sweep runs, each with its planner candidate, best predicted first."""
    runs: list          # (Variant, candidate dict)
    machine: dict       # plscale.run.machine.Machine.to_dict()
    left_out: list      # "dpX-tpY-ppZ-cpW: why", layouts the planner offered that the lab refused


def planned(lab: Lab, settings: dict, ranks: int, accepts, console) -> Planned:
    """Measure this machine, plan the lab's job on it, keep what the lab accepts (module doc).
    accepts(variant) raises UserError when the lab refuses the variant's settings."""
    from plscale.run.machine import measure

    want = job_of(settings, ranks)
    config = preset(want["preset"])
    with console.status(f"measuring this machine: {ranks} CPU ranks at once (about 10 s)"):
        machine = measure(ranks, config, want["micro"], want["seq"])
    console.print(f"this machine: {machine.describe()}", highlight=False)
    job = Job(config, ranks, want["seq"], want["batch"], settings["ds"]["precision"], 1.0,
              fixed=(("recompute", "none"), ("micro_batch", want["micro"]), ("virtual", 1)), overlap=False)
    result = plan(job, machine.cluster())
    runs, refused = {}, {}
    for c in result.ranked:
        d = c.to_dict()
        name = name_of(d)
        if name in runs:
            continue
        variant = Variant(name, dict(parse_assignment(a) for a in settings_of(d)),
                          about=f"the planner's layout {name} on this machine")
        try:
            accepts(variant)
        except UserError as exc:
            refused.setdefault(name, str(exc))
            continue
        runs[name] = (variant, d)
    left_out = [f"{name}: {why}" for name, why in refused.items() if name not in runs]
    return Planned(list(runs.values()), machine.to_dict(), left_out)
