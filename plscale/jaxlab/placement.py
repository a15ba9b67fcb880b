"""Where the bytes of sharded arrays live: per device, counted and as XLA plans them.

    bytes_per_device(params)        # {device id: bytes}, from each array's shards
    memory_analysis(compiled)       # XLA's per-device argument/output/temp/alias bytes

A replicated array counts in full on every device that holds it; an array sharded 4 ways
counts a quarter on each.
"""

import jax

FIELDS = {"argument": "argument_size_in_bytes", "output": "output_size_in_bytes",
          "temp": "temp_size_in_bytes", "alias": "alias_size_in_bytes",
          "generated_code": "generated_code_size_in_bytes"}


def bytes_per_device(tree) -> dict[int, int]:
    """{device id: bytes of every array of the pytree stored there}, from addressable shards.
    Every device that holds none of it is absent."""
    total = {}
    for leaf in jax.tree.leaves(tree):
        for shard in getattr(leaf, "addressable_shards", ()):
            total[shard.device.id] = total.get(shard.device.id, 0) + shard.data.nbytes
    return dict(sorted(total.items()))


def largest(per_device: dict[int, int]) -> int:
    """The most any one device holds: what has to fit."""
    return max(per_device.values(), default=0)


def memory_analysis(compiled) -> dict[str, int | None]:
    """XLA's plan for one device of a compiled program (`jax.jit(f).lower(...).compile()`):
    {"argument", "output", "temp", "alias", "generated_code"} in bytes, None where the backend
    does not say. Arguments and outputs are per-device shards; alias is the output bytes that
    reuse donated arguments."""
    try:
        stats = compiled.memory_analysis()
    except Exception:  # some backends do not implement it
        stats = None
    return {key: None if stats is None else getattr(stats, attr, None) for key, attr in FIELDS.items()}
