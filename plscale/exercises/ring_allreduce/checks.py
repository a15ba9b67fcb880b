"""The checks of ring-allreduce, run in every rank (2, 3 and 4 ranks): the student's ring
against torch's own dist.all_reduce, and its messages counted through `exchange`."""

import torch
import torch.distributed as dist

from plscale.exercises.harness import Checks, close, expect, watch, watch_collectives
from plscale.predict.busbw import ring_bytes_sent

CHECKS = Checks()
COLLECTIVES = ("all_reduce", "all_gather", "all_gather_into_tensor", "all_gather_single", "reduce_scatter",
               "reduce_scatter_tensor", "reduce_scatter_single", "broadcast", "reduce", "all_to_all",
               "all_to_all_single", "gather", "scatter")
SIZE = 1200  # floats: divides by 2, 3 and 4, so every chunk is the same size


def _tensors(shape, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's tensor (different on every rank) and the sum torch's all_reduce gives."""
    mine = torch.randn(shape, generator=torch.Generator().manual_seed(17 + rank))
    expected = mine.clone()
    dist.all_reduce(expected)
    return mine, expected


def _arg(call, index: int, name: str):
    _, args, kwargs = call
    return args[index] if len(args) > index else kwargs[name]


@CHECKS.add("sums in place: the tensor passed in holds torch's all_reduce result",
            hint="Check both phases: in the reduce-scatter each step adds the chunk that arrived into your copy of "
                 "that same chunk and passes that sum on; the all-gather must carry every finished chunk to every "
                 "rank. Work on views of the tensor, not on copies.")
def sums_in_place(student, rank, world):
    mine, expected = _tensors((SIZE,), rank)
    before = mine.clone()
    returned = student.ring_all_reduce(mine)
    returned_sum = isinstance(returned, torch.Tensor) and returned.shape == expected.shape \
        and torch.allclose(returned, expected, atol=1e-5)
    expect(not (torch.equal(mine, before) and returned_sum),
           "the sum was returned, but the tensor passed in is unchanged: write the result into it")
    close(mine, expected, f"{SIZE} floats: the tensor after ring_all_reduce")


@CHECKS.add("any size: 10 and 3 elements (chunks of different sizes, some empty) and a 3 x 5 matrix",
            hint="Let tensor_split(N) cut the flattened tensor: chunks may differ in size or be empty, so give "
                 "each receive buffer the size of the chunk it lands in.")
def any_size(student, rank, world):
    for shape in ((10,), (3,), (3, 5)):
        mine, expected = _tensors(shape, rank)
        student.ring_all_reduce(mine)
        close(mine, expected, f"shape {list(shape)}")


@CHECKS.add("messages: 2(N-1) calls to exchange per rank",
            hint="A ring all-reduce is two phases of N - 1 steps each, and every step is exactly one exchange().")
def message_count(student, rank, world):
    mine, _ = _tensors((SIZE,), rank)
    with watch(student, "exchange") as calls:
        student.ring_all_reduce(mine)
    expect(len(calls) == 2 * (world - 1),
           f"{len(calls)} call{'' if len(calls) == 1 else 's'} to exchange on a ring of {world} ranks")


@CHECKS.add("ring neighbours: every exchange sends to rank (r+1) % N and receives from (r-1) % N",
            hint="In both phases, always send to the right neighbour and receive from the left one.")
def neighbours(student, rank, world):
    mine, _ = _tensors((SIZE,), rank)
    with watch(student, "exchange") as calls:
        student.ring_all_reduce(mine)
    right, left = (rank + 1) % world, (rank - 1) % world
    for k, call in enumerate(calls):
        dst, src = _arg(call, 1, "dst"), _arg(call, 3, "src")
        expect((dst, src) == (right, left), f"call {k + 1} sends to {dst} and receives from {src}")


@CHECKS.add("bytes: each rank sends 2(N-1)/N of the tensor",
            hint="Each of the 2(N-1) steps sends exactly one chunk, 1/N of the tensor: never the whole tensor, "
                 "and no step left out.")
def bytes_sent(student, rank, world):
    mine, _ = _tensors((SIZE,), rank)
    with watch(student, "exchange") as calls:
        student.ring_all_reduce(mine)
    sent = sum(_arg(c, 0, "send").numel() * _arg(c, 0, "send").element_size() for c in calls)
    total = SIZE * mine.element_size()
    expect(sent == ring_bytes_sent(SIZE, mine.element_size(), world)[rank],
           f"sent {sent} bytes of a {total}-byte tensor on {world} ranks ({sent / total:.2f} of it)")


@CHECKS.add("point-to-point only: no collective of torch.distributed",
            hint="The sum must come from exchange() messages alone: torch's collectives are what you are "
                 "writing yourself.")
def no_collectives(student, rank, world):
    mine, _ = _tensors((SIZE,), rank)
    with watch_collectives(student, *COLLECTIVES) as calls:
        student.ring_all_reduce(mine)
    expect(not calls, f"called dist.{', dist.'.join(sorted({c[0] for c in calls}))}")
