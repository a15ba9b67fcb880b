"""The process-group mesh: Megatron-LM's documented groups, megatron-core's own RankGenerator
for many layouts, the invariants (every dimension partitions the world, coordinates agree with
groups), `plscale mesh` through the real CLI, and the torch groups on 8 real gloo ranks."""

import itertools
import json
import socket
import struct
import subprocess
import sys
import warnings
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from conftest import run_cli
from plscale.errors import UserError
from plscale.predict.grid import DIMS, Layout

SINGLE = ("tp", "cp", "dp", "pp", "ep", "edp")
COMBOS = ("dp-cp", "tp-pp", "tp-cp", "tp-dp", "tp-dp-cp", "tp-ep", "tp-ep-pp", "ep-edp")


def layouts(max_world=32):
    """Every (world, tp, cp, ep, pp) with degrees in 1, 2, 4 (and 3 for odd shapes) that fits."""
    for world in (1, 2, 3, 4, 6, 8, 12, 16, 24, 32):
        for tp, cp, pp, ep in itertools.product((1, 2, 3, 4), (1, 2), (1, 2, 3, 4), (1, 2, 3, 4)):
            if world <= max_world and world % (tp * cp * pp) == 0 and (world // (tp * pp)) % ep == 0:
                yield Layout(world, tp=tp, pp=pp, cp=cp, ep=ep)


def test_megatron_documented_example_16_gpus_tp2_pp4():
    layout = Layout(16, tp=2, pp=4)
    assert layout.dp == 2
    assert layout.groups("tp") == [[0, 1], [2, 3], [4, 5], [6, 7], [8, 9], [10, 11], [12, 13], [14, 15]]
    assert layout.groups("pp") == [[0, 4, 8, 12], [1, 5, 9, 13], [2, 6, 10, 14], [3, 7, 11, 15]]
    assert layout.groups("dp") == [[0, 2], [1, 3], [4, 6], [5, 7], [8, 10], [9, 11], [12, 14], [13, 15]]
    assert layout.groups("tp-pp") == [[0, 1, 4, 5, 8, 9, 12, 13], [2, 3, 6, 7, 10, 11, 14, 15]]
    assert layout.coords(13) == {"tp": 1, "cp": 0, "dp": 0, "pp": 3, "ep": 0, "edp": 0}


def test_megatron_documented_context_parallel_example():
    """initialize_model_parallel's docstring: 8 GPUs, tp 4, cp 2: the two sequence chunks go to
    GPU0-3 and GPU4-7, and the cp groups are [0, 4], [1, 5], [2, 6], [3, 7]."""
    layout = Layout(8, tp=4, cp=2)
    assert layout.groups("tp") == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert layout.groups("cp") == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert layout.groups("dp") == [[r] for r in range(8)]               # dp 1: one copy of the data
    assert layout.groups("dp-cp") == layout.groups("cp")              # gradients reduce over cp


def test_expert_parallel_carves_ep_out_of_dp_times_cp():
    """Worked by hand from the expert order tp-ep-dp-pp: 16 ranks, tp 2, cp 2 (dp 4), ep 4, so
    edp = 4 * 2 / 4 = 2; rank = tp_i + 2 * (ep_i + 4 * edp_i)."""
    layout = Layout(16, tp=2, cp=2, ep=4)
    assert layout.edp == 2
    assert layout.groups("cp")[:3] == [[0, 2], [1, 3], [4, 6]]       # dense: cp before dp
    assert layout.groups("dp")[:2] == [[0, 4, 8, 12], [1, 5, 9, 13]]
    assert layout.groups("ep") == [[0, 2, 4, 6], [1, 3, 5, 7], [8, 10, 12, 14], [9, 11, 13, 15]]
    assert layout.groups("edp") == [[0, 8], [1, 9], [2, 10], [3, 11], [4, 12], [5, 13], [6, 14], [7, 15]]
    assert layout.groups("tp-ep") == [list(range(8)), list(range(8, 16))]
    # the expert layers' ep x edp ranks are the dense layers' cp x dp ranks, cut differently
    assert sorted(map(sorted, layout.groups("ep-edp"))) == sorted(map(sorted, layout.groups("dp-cp")))
    assert Layout(8, ep=4).groups("ep") == [[0, 1, 2, 3], [4, 5, 6, 7]]


def test_every_dimension_partitions_the_world_and_coords_agree():
    checked = 0
    for layout in layouts():
        for dim in SINGLE + COMBOS:
            groups = layout.groups(dim)
            assert sorted(r for g in groups for r in g) == list(range(layout.world)), (layout, dim)
            assert {len(g) for g in groups} == {layout.size(dim)}
        for rank in range(layout.world):
            c = layout.coords(rank)
            assert rank == c["tp"] + layout.tp * (c["cp"] + layout.cp * (c["dp"] + layout.dp * c["pp"]))
            assert rank == c["tp"] + layout.tp * (c["ep"] + layout.ep * (c["edp"] + layout.edp * c["pp"]))
            for dim in SINGLE:
                group = layout.group_of(dim, rank)
                assert group.index(rank) == c[dim]                    # a coordinate is a place in a group
                others = {k: v for k, v in c.items() if k != dim and k in (
                    ("tp", "ep", "edp", "pp") if dim in ("ep", "edp") else ("tp", "cp", "dp", "pp"))}
                assert all({k: layout.coords(r)[k] for k in others} == others for r in group)
            checked += 1
    assert checked > 1000


@pytest.mark.parametrize("args, message", [
    # the quantities by their own names: the CLI words them as flags (test_cli_bad_input_is_one_line below)
    ((6, 4), "gpus 6 is not a multiple of tp 4 x pp 1 x cp 1 = 4: use gpus 4 or 8."),
    ((3, 2, 2), "gpus 3 is not a multiple of tp 2 x pp 2 x cp 1 = 4: use gpus 4."),
    ((8, 1, 1, 1, 3), "ep 3 does not divide dp 8 x cp 1 = 8, the ranks that share the experts: use ep 1, 2, 4 or 8"),
    ((0,), "gpus must be a whole number of at least 1 (got 0)."),
    ((4, 0), "tp must be a whole number of at least 1 (got 0)."),
    ((4, 1, 1, -1), "cp must be a whole number of at least 1 (got -1)."),
])
def test_impossible_degrees_name_the_fix(args, message):
    with pytest.raises(UserError) as error:
        Layout(*args)
    assert str(error.value).startswith(message)
    with pytest.raises(ValueError, match="unknown dimension 'dp-ep'"):
        Layout(4).groups("dp-ep")


def test_same_groups_as_megatron_core_rank_generator():
    pytest.importorskip("megatron.core", reason="megatron-core is not installed: "
                        "pip install --no-deps megatron-core==0.16.1 to compare with Megatron's own groups")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "Transformer Engine and Apex are not installed"
        from megatron.core.parallel_state import RankGenerator
    order, compared = "tp-cp-ep-dp-pp", 0
    for layout in layouts(max_world=32):  # as initialize_model_parallel builds its two generators
        dense = RankGenerator(tp=layout.tp, ep=1, dp=layout.dp, pp=layout.pp, cp=layout.cp, order=order)
        expert = RankGenerator(tp=layout.tp, ep=layout.ep, dp=layout.edp, pp=layout.pp, cp=1, order=order)
        for dim in ("tp", "cp", "dp", "pp", "dp-cp", "tp-pp", "tp-cp", "tp-dp", "tp-dp-cp"):
            assert layout.groups(dim) == dense.get_ranks(dim), (layout, dim)
        for dim in ("ep", "edp", "tp-ep", "tp-ep-pp", "pp"):
            assert layout.groups(dim) == expert.get_ranks(dim.replace("edp", "dp")), (layout, dim)
        compared += 1
    assert compared > 150


def _png_size(path):
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR", f"{path} is not a PNG"
    return struct.unpack(">II", data[16:24])


def test_cli_prints_the_groups_and_draws_the_grid(tmp_path):
    result = run_cli("mesh", "--gpus", "16", "--tp", "2", "--pp", "4", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "16 ranks = tp 2 x cp 1 x dp 2 x pp 4" in out and "tp-cp-ep-dp-pp" in out
    assert "[0,1] [2,3] [4,5] [6,7] [8,9] [10,11] [12,13] [14,15]" in out
    assert "[0,4,8,12] [1,5,9,13] [2,6,10,14] [3,7,11,15]" in out
    assert "[0,2] [1,3] [4,6] [5,7] [8,10] [9,11] [12,14] [13,15]" in out
    assert "│   13 │  3 │  0 │  0 │  1 │" in out                      # rank 13: pp 3, dp 0, cp 0, tp 1
    width, height = _png_size(tmp_path / "mesh-16-tp2-pp4.png")
    assert width > 300 and height > 200
    experts = run_cli("mesh", "--gpus", "16", "--tp", "2", "--cp", "2", "--ep", "4", "--png", tmp_path / "e.png")
    assert experts.returncode == 0 and "[0,8] [1,9] [2,10]" in experts.stdout, experts.stderr
    assert "dp-cp" in experts.stdout and _png_size(tmp_path / "e.png")[0] > 100


def test_cli_imports_neither_torch_nor_deepspeed(tmp_path):
    result = subprocess.run([sys.executable, "-X", "importtime", "-m", "plscale.cli.main", "mesh", "--gpus", "8",
                             "--tp", "2", "--png", str(tmp_path / "m.png")], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    modules = [line.rsplit("|", 1)[-1].strip() for line in result.stderr.splitlines() if "|" in line]
    assert "plscale.predict.grid" in modules and "matplotlib" in modules
    assert not [m for m in modules if m.split(".")[0] in ("torch", "deepspeed")]


@pytest.mark.parametrize("args, message", [
    (["--gpus", "0"], "--gpus must be a whole number of at least 1 (got 0)"),
    (["--gpus", "8", "--pp", "0"], "--pp must be a whole number of at least 1"),
    (["--gpus", "6", "--tp", "4"], "use --gpus 4 or 8"),
    (["--gpus", "8", "--tp", "2", "--ep", "3"], "--ep 3 does not divide dp 4 x cp 1 = 4"),
    (["--gpus", "8", "--png", "missing/m.png"], "folder missing does not exist"),
    (["--gpus", "8", "--png", "."], "--png . is a folder"),
    (["--gpus", "8", "--png", "m.svg"], "does not end in .png"),
])
def test_cli_bad_input_is_one_line_exit_2_and_writes_nothing(quick_cli, tmp_path, args, message):
    result = quick_cli("mesh", *args, cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], result.stderr
    assert result.stdout == "" and not list(tmp_path.rglob("*.*")), "a failed command wrote something"


# -- the torch groups, on real gloo processes ---------------------------------------------------

WORLD = 8
MESHES = [(4, dict(tp=2)), (8, dict(tp=2, pp=2)), (8, dict(cp=2, ep=4)), (8, dict(tp=2, cp=2, ep=2))]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _worker(rank, ports, out_dir):
    """Each rank sums 2**rank over each of its groups: the sum names exactly who took part."""
    from plscale.rank.mesh import Mesh

    torch.set_num_threads(1)
    for (world, degrees), port in zip(MESHES, ports):
        if rank >= world:
            continue
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                world_size=world, timeout=timedelta(seconds=60))
        mesh = Mesh.build(**degrees)
        seen = {"coords": mesh.coords, "alias": mesh.group("cp-dp") is mesh.group("dp-cp")}
        for dim in DIMS:
            x = torch.tensor([2 ** rank], dtype=torch.int64)
            dist.all_reduce(x, group=mesh.group(dim))
            seen[dim] = {"sum": x.item(), "ranks": mesh.ranks(dim), "rank_in": mesh.rank_in(dim),
                         "size": mesh.size(dim), "torch_rank": dist.get_rank(mesh.group(dim)),
                         "torch_size": dist.get_world_size(mesh.group(dim))}
        (out_dir / f"{world}-{sorted(degrees.items())}-{rank}.json").write_text(json.dumps(seen))
        dist.barrier()
        dist.destroy_process_group()


def test_torch_groups_on_gloo_sum_over_exactly_the_layout_ranks(tmp_path):
    mp.start_processes(_worker, args=([_free_port() for _ in MESHES], tmp_path), nprocs=WORLD, join=True,
                       start_method="fork")  # torch is imported already: forking skips 8 imports of it
    for world, degrees in MESHES:
        layout = Layout(world, **degrees)
        for rank in range(world):
            seen = json.loads((tmp_path / f"{world}-{sorted(degrees.items())}-{rank}.json").read_text())
            assert seen["coords"] == layout.coords(rank) and seen["alias"]
            for dim in DIMS:
                group = layout.group_of(dim, rank)
                got = seen[dim]
                assert got["sum"] == sum(2 ** r for r in group), (layout, rank, dim, got)
                assert got["ranks"] == group and got["size"] == got["torch_size"] == len(group)
                assert got["rank_in"] == got["torch_rank"] == group.index(rank)
