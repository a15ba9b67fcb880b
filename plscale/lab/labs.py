"""The lab registry: every labs/NN_slug/lab.yaml, and lookup by id, alias or variant.

A lab is named on the command line by its id (`mnist-pseudo-dp`), an alias
(`mnist-dp`), its number (`1`), or a variant alias that picks a variant too (`zero2`).
"""

import os
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from plscale.errors import UserError, did_you_mean

REQUIRED = ("id", "title", "sections", "entry", "ranks", "settings")


def labs_root() -> Path:
    return Path(os.environ.get("PLSCALE_LABS_DIR", Path(__file__).resolve().parents[2] / "labs"))


@dataclass
class Variant:
    name: str
    overrides: dict = field(default_factory=dict)
    aliases: list = field(default_factory=list)
    about: str = ""
    launcher: str | None = None  # a variant may require a launcher (e.g. torchrun for DDP)
    ranks: int | None = None     # a variant may need another rank count than the lab's default
    restarts: int | None = None  # a variant may need elastic restarts (e.g. one that kills a rank)
    entry: str | None = None     # a variant may run another script of the lab's folder (default: the lab's)
    data: str | None = None      # ... and read another dataset (default: the lab's)


@dataclass
class Lab:
    id: str
    number: int
    folder: Path
    title: str
    sections: dict  # course section id (slides/course.yaml) -> the topics the lab covers there
    entry: str
    default_ranks: int
    allowed_ranks: list
    settings: dict
    variants: dict
    default_variant: str
    aliases: list = field(default_factory=list)
    cpu_minutes: float = 1.0
    gpu_required: bool = False
    predicts: list = field(default_factory=list)
    data: str | None = None  # the dataset, so the host can check --data-dir before launching
    sweep: list = field(default_factory=list)  # variants `--sweep` runs in turn
    sweep_report: str | None = None            # script run on the sweep directory afterwards
    sweep_layouts: str | None = None           # "planner": --sweep runs the planner's layouts (plscale.run.layouts)
    check: str | None = None                   # check(settings, topology) raises UserError on bad settings
    steps_setting: str = "train.steps"         # the setting `--steps N` sets
    launcher: str | None = None                # every variant's launcher (jax: one process, N devices)

    def check_settings(self, settings: dict, topology) -> None:
        """Run the lab's own checks (topology: world_size, device), so bad settings fail
        before anything launches."""
        if module := self._checks():
            module.check(settings, topology)

    def check_ds_config(self, config: dict, settings: dict, topology) -> None:
        """check.py's optional check_ds_config(config, settings, topology): the DeepSpeed config the
        run will use, a user's --ds-config included, checked before anything launches."""
        if (module := self._checks()) and hasattr(module, "check_ds_config"):
            module.check_ds_config(config, settings, topology)

    def _checks(self):
        """The lab's check.py as a module; None when the lab has none."""
        if not self.check:
            return None
        import importlib.util

        if not (self.folder / self.check).is_file():
            raise UserError(f"{self.folder / 'lab.yaml'} names check: {self.check}, which is missing: "
                            f"add it or drop the key.")
        spec = importlib.util.spec_from_file_location(f"plscale_check_{self.number}", self.folder / self.check)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module

    @property
    def entry_path(self) -> Path:
        return self.folder / self.entry

    def entry_of(self, variant: Variant) -> Path:
        """The script a variant's ranks run: its own `entry`, else the lab's."""
        return self.folder / (variant.entry or self.entry)

    def variant_for(self, name: str | None, script: Path) -> Variant:
        """The variant a script launched by hand runs: `name`, which must be one of this script's
        variants, or without a name the lab's default when it runs this script, else the first
        variant that does."""
        script = Path(script).resolve()
        if name is not None:
            variant = self.variant(name)
            if self.entry_of(variant).resolve() != script:
                raise UserError(f"Variant {variant.name!r} of lab {self.id!r} runs {self.entry_of(variant).name}, "
                                f"not {script.name}: launch that script, or pick one of "
                                f"{', '.join(self.variants_of(script))}.")
            return variant
        default = self.variant(None)
        if self.entry_of(default).resolve() == script:
            return default
        mine = self.variants_of(script)
        if not mine:
            raise UserError(f"No variant of lab {self.id!r} runs {script.name}: launch {self.entry_of(default).name}, "
                            f"or add a variant with entry: {script.name} to {self.folder / 'lab.yaml'}.")
        return self.variant(mine[0])

    def variants_of(self, script: Path) -> list[str]:
        script = Path(script).resolve()
        return [n for n, v in self.variants.items() if n != "default" and self.entry_of(v).resolve() == script]

    def variant(self, name: str | None) -> Variant:
        name = name or self.default_variant
        for variant in self.variants.values():
            if name == variant.name or name in variant.aliases:
                return variant
        raise UserError(f"Lab {self.id!r} has no variant {name!r}.{did_you_mean(name, self.variants)} "
                        f"Variants: {', '.join(self.variants)}.")


def load_lab(folder: Path) -> Lab:
    path = folder / "lab.yaml"
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise UserError(f"Cannot read {path}: {exc}. Fix the manifest (see labs/README.md).") from None
    missing = [key for key in REQUIRED if key not in raw]
    if missing:
        raise UserError(f"{path} lacks {', '.join(missing)}. Add them (see labs/README.md).")
    variants = {"default": Variant("default")}
    for name, spec in (raw.get("variants") or {}).items():
        spec = spec or {}
        variants[name] = Variant(name, spec.get("overrides") or {}, spec.get("aliases") or [],
                                 spec.get("about", ""), spec.get("launcher"), spec.get("ranks"),
                                 spec.get("restarts"), spec.get("entry"), spec.get("data"))
    ranks = raw["ranks"]
    if (raw.get("sweep") or {}).get("layouts") not in (None, "planner"):
        raise UserError(f"{path}: sweep.layouts {raw['sweep']['layouts']!r}: the one kind is `planner` "
                        f"(see labs/README.md).")
    return Lab(
        id=raw["id"], number=int(folder.name.split("_")[0]), folder=folder, title=raw["title"],
        sections=_sections(raw["sections"], path), entry=raw["entry"], default_ranks=int(ranks["default"]),
        allowed_ranks=[int(n) for n in ranks["allowed"]], settings=raw["settings"],
        variants=variants, default_variant=raw.get("default_variant", "default"),
        aliases=raw.get("aliases") or [], cpu_minutes=float(raw.get("cpu_minutes", 1)),
        gpu_required=bool(raw.get("gpu_required", False)), predicts=raw.get("predicts") or [],
        data=raw.get("data"), sweep=(raw.get("sweep") or {}).get("variants", []),
        sweep_report=(raw.get("sweep") or {}).get("report"), sweep_layouts=(raw.get("sweep") or {}).get("layouts"),
        check=raw.get("check"),
        steps_setting=raw.get("steps", "train.steps"), launcher=raw.get("launcher"),
    )


def _sections(raw, path: Path) -> dict:
    """`sections:` maps a course section's id to a list of the topics the lab covers there."""
    if not isinstance(raw, dict) or not raw or not all(
            isinstance(k, str) and isinstance(v, list) and v and all(isinstance(t, str) for t in v)
            for k, v in raw.items()):
        raise UserError(f"{path}: `sections:` must map course section ids (slides/course.yaml) to lists "
                        f"of topics, e.g. `sections: {{pipeline: [micro-batches]}}` (see labs/README.md).")
    return raw


def all_labs() -> list[Lab]:
    root = labs_root()
    folders = sorted(p for p in root.iterdir() if (p / "lab.yaml").is_file()) if root.is_dir() else []
    return [load_lab(folder) for folder in folders]


def find(name: str) -> tuple[Lab, Variant]:
    """Resolve a name to (lab, variant). Unknown names get the nearest ids."""
    labs = all_labs()
    for lab in labs:
        if name in (lab.id, lab.folder.name, *lab.aliases) or name.lstrip("0") == str(lab.number):
            return lab, lab.variant(None)
    for lab in labs:
        for variant in lab.variants.values():
            if name in variant.aliases:
                return lab, variant
    names = [n for lab in labs for n in (lab.id, *lab.aliases,
                                         *(a for v in lab.variants.values() for a in v.aliases))]
    raise UserError(f"No lab named {name!r}.{did_you_mean(name, names)} "
                    f"List them with `plscale lab list`.")
