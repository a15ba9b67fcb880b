"""Host-side checks of the collectives lab's settings (no torch): fail in one line before launch."""

from plscale.errors import UserError, did_you_mean
from plscale.hardware import memory_available
from plscale.predict import busbw

TOUR = ("broadcast", "reduce", "all_reduce", "all_gather", "reduce_scatter", "all_to_all", "scatter", "gather",
        "barrier")


def check(settings: dict, topology) -> None:
    for name in str(settings["tour"]["ops"]).split(","):
        if name not in TOUR:
            raise UserError(f"tour.ops: unknown primitive {name!r}.{did_you_mean(name, TOUR)} "
                            f"Use some of {', '.join(TOUR)}.")
    for name in str(settings["ring"]["dtypes"]).split(","):
        busbw.check_dtype(name.strip())
    bench = settings["bench"]
    ops, dtype = busbw.parse_ops(bench["ops"]), busbw.check_dtype(bench["dtype"])
    busbw.resolve_sizes(bench["sizes"], ops, dtype, topology.world_size, topology.device,
                        memory_available(topology.device))
