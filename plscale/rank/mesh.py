"""Every torch.distributed process group of a Layout, built once; each rank keeps its own.

The rule: `dist.new_group(ranks)` is a collective call over the whole world. Every rank
must call it for every group, its own or not, with the same ranks and in the same order;
a rank that skips one, or builds them in another order, pairs its groups with the wrong
ones of its peers and hangs (NCCL) or mixes up tensors. So each rank walks the same list:

    for dim in dims:                          # the same dims, same order, on every rank
        for ranks in layout.groups(dim):      # Megatron's order (plscale/predict/grid.py)
            group = dist.new_group(ranks)     # everyone calls it ...
            if me in ranks: mine[dim] = group # ... and keeps only its own

Works on gloo (CPU) and NCCL, under any launcher, once dist.init_process_group has run:

    mesh = Mesh.build(tp=2, pp=1)
    mesh.group("tp")       # this rank's tensor-parallel group, for dist.all_reduce(x, group=...)
    mesh.rank_in("tp")     # its place in that group (0 .. tp-1)
    mesh.size("dp-cp")     # ranks in the gradient all-reduce with context parallel
    mesh.ranks("pp")       # global ranks of its pipeline, first stage first
    mesh.coords            # {'tp': 1, 'cp': 0, 'dp': 0, 'pp': 0, 'ep': 0, 'edp': 0}
"""

from dataclasses import dataclass, field

import torch.distributed as dist

from plscale.predict.grid import DIMS, Layout, axes


def _key(dim: str) -> tuple[str, frozenset]:
    """'cp-dp' and 'dp-cp' name the same group."""
    grid, names = axes(dim)
    return grid, frozenset(names)


@dataclass
class Mesh:
    layout: Layout
    rank: int
    coords: dict
    _mine: dict = field(default_factory=dict, repr=False)  # key -> (ranks, group)

    @classmethod
    def build(cls, tp: int = 1, pp: int = 1, cp: int = 1, ep: int = 1, dims=tuple(DIMS)) -> "Mesh":
        """Build the groups of `dims` (default: every one in plscale.predict.grid.DIMS) on every rank."""
        layout = Layout(dist.get_world_size(), tp=tp, pp=pp, cp=cp, ep=ep)
        rank = dist.get_rank()
        mesh = cls(layout, rank, layout.coords(rank))
        for dim in dims:
            if _key(dim) in mesh._mine:
                continue  # the same dim under another name: skipped on every rank alike
            for ranks in layout.groups(dim):
                group = dist.new_group(ranks)
                if rank in ranks:
                    mesh._mine[_key(dim)] = (ranks, group)
        return mesh

    def _get(self, dim: str):
        try:
            return self._mine[_key(dim)]
        except KeyError:
            built = sorted("-".join(sorted(names)) for _, names in self._mine)
            raise KeyError(f"no {dim!r} group: Mesh.build(dims=...) built {built}") from None

    def group(self, dim: str):
        """This rank's process group of `dim`."""
        return self._get(dim)[1]

    def ranks(self, dim: str) -> list[int]:
        """The global ranks of this rank's `dim` group, in Megatron's order."""
        return list(self._get(dim)[0])

    def rank_in(self, dim: str) -> int:
        """This rank's place in its `dim` group: dist.get_rank(group=mesh.group(dim))."""
        return self._get(dim)[0].index(self.rank)

    def size(self, dim: str) -> int:
        return len(self._get(dim)[0])

    def __str__(self) -> str:
        where = " ".join(f"{k}{v}" for k, v in self.coords.items())
        return f"rank {self.rank} of {self.layout}: {where}"


class MegatronMPU:
    """A Mesh in the shape of Megatron's `mpu` (its parallel_state), the object through which
    DeepSpeed learns the groups of a model it did not split itself:

        engine, *_ = deepspeed.initialize(model=model, config=ds, mpu=MegatronMPU(mesh), ...)

    DeepSpeed then all-reduces gradients over the data-parallel group only, shards ZeRO's
    states over it, and computes the gradient norm once per model-parallel group (weights
    marked `tensor_model_parallel` counted on every rank, replicated ones on its rank 0).
    For tensor x context x data parallelism (pp 1), where the model-parallel group is the
    tensor-parallel one, as in Megatron-DeepSpeed; the mesh needs the groups "tp", "dp" and
    "pp", and with cp > 1 also "cp" and "dp-cp".

    Context parallelism is what DeepSpeed calls sequence parallelism (Ulysses): its ranks
    hold the same weights, so gradients are reduced over dp x cp ("sequence data parallel"),
    SUMMED over cp and averaged over dp. Each cp rank's loss is therefore its tokens' share
    of the replica's loss (their sum over the sequence / all the sequence's tokens), and the
    DeepSpeed batch counts dp replicas, not dp x cp ranks."""

    def __init__(self, mesh: Mesh):
        if mesh.layout.pp != 1:
            raise ValueError(f"MegatronMPU covers tensor x context x data parallelism; this mesh has pp "
                             f"{mesh.layout.pp} (DeepSpeed's pipeline engine builds its own grid)")
        self.mesh = mesh

    def get_model_parallel_group(self):
        return self.mesh.group("tp")

    def get_model_parallel_rank(self):
        return self.mesh.rank_in("tp")

    def get_model_parallel_world_size(self):
        return self.mesh.size("tp")

    def get_tensor_model_parallel_group(self):
        return self.mesh.group("tp")

    def get_tensor_model_parallel_rank(self):
        return self.mesh.rank_in("tp")

    def get_tensor_model_parallel_world_size(self):
        return self.mesh.size("tp")

    def get_tensor_model_parallel_src_rank(self):
        return self.mesh.ranks("tp")[0]

    def get_pipeline_model_parallel_group(self):
        return self.mesh.group("pp")

    def get_pipeline_model_parallel_world_size(self):
        return self.mesh.size("pp")

    def get_pipeline_model_parallel_rank(self):
        return self.mesh.rank_in("pp")

    def get_data_parallel_group(self):
        return self.mesh.group("dp")

    def get_data_parallel_rank(self):
        return self.mesh.rank_in("dp")

    def get_data_parallel_world_size(self):
        return self.mesh.size("dp")

    def get_data_parallel_group_ranks(self):
        return self.mesh.ranks("dp")

    # Context parallelism, in DeepSpeed's words sequence parallelism (cp 1: no split, and the
    # sequence-data-parallel group is the data-parallel one)
    def _cp(self, dim: str) -> str:
        return dim if self.mesh.layout.cp > 1 else "dp"

    def get_sequence_parallel_group(self):  # asked for only when cp > 1
        return self.mesh.group("cp")

    def get_sequence_parallel_world_size(self):
        return self.mesh.layout.cp

    def get_sequence_parallel_rank(self):
        return self.mesh.rank_in("cp") if self.mesh.layout.cp > 1 else 0

    def get_sequence_data_parallel_group(self):
        return self.mesh.group(self._cp("dp-cp"))

    def get_sequence_data_parallel_world_size(self):
        return self.mesh.size(self._cp("dp-cp"))

    def get_sequence_data_parallel_rank(self):
        return self.mesh.rank_in(self._cp("dp-cp"))
