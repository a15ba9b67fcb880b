"""DeepSpeed configs: a typed spec, the JSON it becomes, checks, diffs, the standard set."""

from plscale.dsconfig.spec import DSSpec, build

__all__ = ["DSSpec", "build"]
