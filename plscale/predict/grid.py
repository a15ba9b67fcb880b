"""Which ranks form each process group, in Megatron-LM's rank order. Pure Python, no torch.

World = tp x cp x dp x pp ranks, with data parallel dp = world / (tp * cp * pp). Megatron's
order is "tp-cp-ep-dp-pp": tp varies fastest, pp slowest, so a rank's coordinates are

    rank = tp_i + tp * (cp_i + cp * (dp_i + dp * pp_i))

and a group of dimension d is the set of ranks that differ only in their d coordinate.
Tensor parallel, the chattiest, gets neighbouring ranks (the same node's NVLink); pipeline
parallel, which only passes activations between stages, gets the farthest ones.

Megatron's documented example (`initialize_model_parallel`), 16 GPUs, tp 2, pp 4 (dp 2):
    8 tensor groups:   [g0, g1], [g2, g3], [g4, g5], [g6, g7], ... [g14, g15]
    4 pipeline groups: [g0, g4, g8, g12], [g1, g5, g9, g13], [g2, g6, g10, g14], [g3, g7, g11, g15]
    8 data groups:     [g0, g2], [g1, g3], [g4, g6], [g5, g7], ... [g13, g15]
and with context parallel, 8 GPUs, tp 4, cp 2: cp groups [g0, g4], [g1, g5], [g2, g6], [g3, g7].

Expert layers (MoE) see the same ranks cut another way. The cp x dp ranks between tp and pp,
which all hold the same dense weights, are re-read as ep x edp, in the order "tp-ep-dp-pp"
(megatron-core's expert RankGenerator, expert tensor parallel = tp):

    rank = tp_i + tp * (ep_i + ep * (edp_i + edp * pp_i)),   edp = dp * cp / ep

so ep must divide dp * cp. E.g. 8 GPUs, ep 4: ep groups [g0..g3], [g4..g7] (the all-to-all
of tokens), edp groups [g0, g4], [g1, g5], ... (the all-reduce of the experts' gradients).

    layout = Layout(16, tp=2, pp=4)
    layout.dp                    # 2
    layout.groups("tp")          # [[0, 1], [2, 3], ...]
    layout.groups("dp-cp")       # several dimensions at once: the gradient all-reduce with cp
    layout.coords(5)             # {'tp': 1, 'cp': 0, 'dp': 0, 'pp': 1, 'ep': 0, 'edp': 0}
"""

from dataclasses import dataclass

from plscale.predict.errors import PredictionError

ORDER = "tp-cp-ep-dp-pp"
DENSE = ("tp", "cp", "dp", "pp")   # the grid of the dense layers, fastest first
EXPERT = ("tp", "ep", "edp", "pp")  # the same ranks as the expert layers see them
DIMS = {  # every group a lab may ask for, and what it is for
    "tp": "tensor parallel: each weight matrix split; activations all-reduced every layer",
    "cp": "context parallel: the sequence split; keys and values passed round a ring",
    "dp": "data parallel: same weights, other batches; gradients all-reduced",
    "dp-cp": "gradient all-reduce with context parallel (cp ranks hold the same weights)",
    "pp": "pipeline parallel: one rank per stage; activations forward, gradients back",
    "tp-pp": "model parallel: together hold one full copy of the model",
    "ep": "expert parallel: the experts split; tokens sent to them by all-to-all",
    "edp": "expert data parallel: same experts; their gradients all-reduced",
}


def _options(n: int, step: int) -> str:
    """The multiples of `step` nearest to n, as a fix: '4 or 8'."""
    low, high = n // step * step, -(-n // step) * step
    return " or ".join(str(m) for m in sorted({low, high}) if m >= step) or str(step)


def axes(dim: str) -> tuple[str, tuple[str, ...]]:
    """'dp-cp' -> ('dense', ('dp', 'cp')): which grid a dimension lives in, and its axes."""
    names = tuple(dim.split("-"))
    for grid, order in (("dense", DENSE), ("expert", EXPERT)):
        if names and len(set(names)) == len(names) and set(names) <= set(order):
            return grid, names
    raise ValueError(f"unknown dimension {dim!r}: join names of one grid with '-', "
                     f"from {'/'.join(DENSE)} or {'/'.join(EXPERT)}")


@dataclass(frozen=True)
class Layout:
    """World size and parallel degrees; dp follows. Raises a PredictionError on impossible degrees
    (the world's quantity is "gpus")."""

    world: int
    tp: int = 1
    pp: int = 1
    cp: int = 1
    ep: int = 1

    def __post_init__(self):
        for name in ("world", "tp", "pp", "cp", "ep"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise PredictionError("gpus" if name == "world" else name, value,
                                      f" must be a whole number of at least 1 (got {value}).", show="")
        model = self.tp * self.pp * self.cp
        if self.world % model:
            raise PredictionError("gpus", self.world, f" is not a multiple of tp {self.tp} x pp {self.pp} x "
                                                      f"cp {self.cp} = {model}: use {{gpus}} "
                                                      f"{_options(self.world, model)}.")
        shared = self.dp * self.cp
        if shared % self.ep:
            divisors = [str(d) for d in range(1, shared + 1) if shared % d == 0]
            choices = ", ".join(divisors[:-1]) + " or " * (len(divisors) > 1) + divisors[-1]
            raise PredictionError("ep", self.ep, f" does not divide dp {self.dp} x cp {self.cp} = {shared}, the "
                                                 f"ranks that share the experts: use {{ep}} {choices}, or more ranks "
                                                 f"({{gpus}}).")

    @property
    def dp(self) -> int:
        return self.world // (self.tp * self.cp * self.pp)

    @property
    def edp(self) -> int:
        """Expert data parallel: the ranks holding the same experts, dp * cp / ep."""
        return self.dp * self.cp // self.ep

    def sizes(self, grid: str = "dense") -> dict[str, int]:
        """Each axis of a grid and its degree, fastest first."""
        return {name: getattr(self, name) for name in (DENSE if grid == "dense" else EXPERT)}

    def size(self, dim: str) -> int:
        """Ranks in one group of `dim`: the product of its degrees."""
        grid, names = axes(dim)
        out = 1
        for name in names:
            out *= self.sizes(grid)[name]
        return out

    def groups(self, dim: str) -> list[list[int]]:
        """Every group of `dim` ('tp', 'dp-cp', 'edp', ...), in Megatron's order: the ranks in a
        group, and the groups, both ordered with the fastest axis first (its get_ranks)."""
        grid, names = axes(dim)
        sizes = self.sizes(grid)
        stride, strides = 1, {}
        for name, size in sizes.items():
            strides[name], stride = stride, stride * size
        inside = [name for name in sizes if name in names]
        outside = [name for name in sizes if name not in names]

        def offsets(which):  # rank offsets of every index combination, first axis fastest
            out = [0]
            for name in which:
                out = [o + i * strides[name] for i in range(sizes[name]) for o in out]
            return out

        return [[base + o for o in offsets(inside)] for base in offsets(outside)]

    def coords(self, rank: int) -> dict[str, int]:
        """A rank's index along every axis of both grids; equal to its place in that group."""
        if not 0 <= rank < self.world:
            raise ValueError(f"rank {rank} is outside a world of {self.world}")
        out = {}
        for grid in ("dense", "expert"):
            rest = rank
            for name, size in self.sizes(grid).items():
                out[name], rest = rest % size, rest // size
        return {name: out[name] for name in ("tp", "cp", "dp", "pp", "ep", "edp")}

    def group_of(self, dim: str, rank: int) -> list[int]:
        """The one group of `dim` that holds `rank`."""
        return next(g for g in self.groups(dim) if rank in g)

    def __str__(self) -> str:
        text = f"{self.world} ranks = tp {self.tp} x cp {self.cp} x dp {self.dp} x pp {self.pp}"
        return text + (f"; experts: tp {self.tp} x ep {self.ep} x edp {self.edp} x pp {self.pp}"
                       if self.ep > 1 else "")
