"""Resolve a run once: settings, the lab's checks, the DeepSpeed config.

    defaults (lab.yaml) -> variant overrides -> --set k=v, --steps N -> check.py -> DeepSpeed config

The DeepSpeed config, generated or a user's --ds-config, is checked against the topology's device
too: DeepSpeed's fp16 section does not run on CPUs (plscale.dsconfig.valid.fp16_section_problem);
and by the lab's check.py when it has a check_ds_config(config, settings, topology) (lab 10's optimizer reads
only Adam's hyperparameters from it, so it refuses what it would ignore).

A lab that splits the model states its degrees in `settings.parallel` ({tp, pp, cp, ep}; absent
means pure data parallelism): its ranks build their process groups from them
(`Mesh.build(**settings["parallel"])`), and the DeepSpeed batch counts data-parallel ranks
only, world / (tp x pp x cp). A degree given as `world` takes every rank of the run
(`parallel: {cp: world}`: --gpus 4 gives cp 4); the ranks read the number.

`plscale lab run` does this on the host and writes the result into the run directory
(settings.json, ds_config.json), which the ranks read. Under a plain launcher
(`deepspeed`/`torchrun` on the script) each rank does the same, with the same code.
"""

from dataclasses import dataclass, replace

from plscale.dsconfig import valid
from plscale.dsconfig.check import check as check_config
from plscale.dsconfig.check import load
from plscale.dsconfig.spec import DSSpec, build
from plscale.errors import UserError, did_you_mean
from plscale.lab.labs import Lab, Variant
from plscale.lab.settings import flatten, resolve
from plscale.predict.errors import PredictionError
from plscale.predict.grid import Layout


@dataclass
class Topology:
    """What the lab's checks may ask of the launch: how many ranks, on which device, running
    which of the lab's scripts."""
    world_size: int
    device: str      # "cuda" or "cpu"
    entry: str = ""  # the script the variant's ranks run ("precision.py"); resolve_run fills it in
    profile: int | None = None  # --profile STEP (a lab that runs torch.profiler itself may refuse it)


@dataclass
class Resolved:
    lab: Lab
    variant: Variant
    settings: dict
    ds_config: dict
    ds_config_file: str | None = None  # the user's --ds-config, when it replaced the generated one
    profile: int | None = None         # --profile: the step every rank records (plscale.rank.profile)

    def record(self) -> dict:
        """What settings.json says: exactly what the ranks run."""
        return {"lab": self.lab.id, "variant": self.variant.name, "settings": self.settings,
                "ds_config": self.ds_config_file or "generated from settings.ds",
                **({"profile": self.profile} if self.profile is not None else {})}


def resolve_run(lab: Lab, variant: Variant, topology, sets=(), steps: int | None = None,
                ds_config_file: str | None = None, profile: int | None = None) -> Resolved:
    sets = list(sets)
    if steps is not None:
        if steps < 1:
            raise UserError(f"--steps {steps}: use 1 or more.")
        if lab.steps_setting not in flatten(lab.settings):
            raise UserError(f"Lab {lab.id} has no setting {lab.steps_setting!r} for --steps: fix 'steps:' in "
                            f"{lab.folder / 'lab.yaml'}.")
        sets.append(f"{lab.steps_setting}={steps}")
    settings = resolve(lab.settings, variant.overrides, sets)
    if settings.get("parallel"):
        settings["parallel"] = {k: topology.world_size if v == "world" else v for k, v in settings["parallel"].items()}
    layout = layout_of(settings, topology.world_size)
    topology = replace(topology, entry=lab.entry_of(variant).name, profile=profile)
    lab.check_settings(settings, topology)
    config = _ds_config(settings, layout, topology.device, ds_config_file)
    try:
        lab.check_ds_config(config, settings, topology)
    except UserError as exc:
        raise UserError(f"{ds_config_file}: {exc}" if ds_config_file else str(exc)) from None
    if profile is not None:
        check_profile(lab, settings, profile)
    return Resolved(lab, variant, settings, config, ds_config_file, profile)


def check_profile(lab: Lab, settings: dict, step: int) -> None:
    """--profile STEP: a step the run has (from 1: step 0 holds the setup), on a lab torch.profiler can see."""
    if lab.launcher == "jax":
        raise UserError(f"--profile records torch ranks; lab {lab.id} runs JAX: use jax.profiler there "
                        f"(https://docs.jax.dev/en/latest/profiling.html).")
    steps = flatten(settings).get(lab.steps_setting)
    if not isinstance(steps, int):
        raise UserError(f"--profile: lab {lab.id} has no step count ({lab.steps_setting!r}) to profile a step of.")
    if not 1 <= step < steps:
        raise UserError(f"--profile {step}: this run's steps are 0 to {steps - 1}; profile one of 1 to {steps - 1} "
                        f"(step 0 holds the setup and the first-call costs), or raise --steps.")


def layout_of(settings: dict, world: int) -> Layout:
    """The parallel layout `settings.parallel` asks of `world` ranks; one line when it cannot be."""
    degrees = settings.get("parallel") or {}
    for key in degrees:
        if key not in ("tp", "pp", "cp", "ep"):
            raise UserError(f"Unknown parallel degree {key!r}.{did_you_mean(key, ['tp', 'pp', 'cp', 'ep'])} "
                            f"Use parallel.tp, .pp, .cp or .ep.")
    try:
        return Layout(world, **degrees)
    except PredictionError as exc:  # the quantities as this layer's settings: parallel.tp, ...
        exc = exc.named({"gpus": "world size", **{k: f"parallel.{k}" for k in ("tp", "pp", "cp", "ep")}})
        names = ", ".join(f"parallel.{k}={v}" for k, v in degrees.items())
        raise UserError(f"{names} on {world} rank{'s' * (world != 1)}: {exc}") from None


def _ds_config(settings: dict, layout: Layout, device: str, path: str | None) -> dict:
    """The run's DeepSpeed config: a user's file (checked) or the one built from settings, either
    one runnable on `device`. Its batch counts data-parallel ranks: train_batch_size = micro x
    accumulation x dp."""
    dp, label = layout.dp, "world size" if layout.dp == layout.world else "data-parallel size"
    if path:
        config = load(path)
        problems = check_config(config, dp, label)
        if problems:
            raise UserError(f"{path}: " + " | ".join(problems))
    else:
        config = build(DSSpec.from_dict({**settings.get("ds", {}), "world_size": dp}))
    problem = valid.fp16_section_problem(config, device)
    if problem:
        raise UserError(f"{path}: {problem}" if path else f"ds.precision fp16: {problem}")
    return config
