"""The production tensor-parallel paths against the dense Llama, on 2 real processes over gloo:
PyTorch DTensor (with and without sequence parallelism), DeepSpeed AutoTP and megatron-core's
layers. One spawn runs every case (process start-up is the slow part); the tests read its JSON."""

import json
import os
import socket

import pytest
import torch
import torch.multiprocessing as mp

from plscale.dsconfig.spec import DSSpec, build
from plscale.errors import UserError

WORLD, STEPS, CLIP = 2, 3, 1.0
TOL = 1e-5  # relative to the largest entry of the dense tensor
LR = 1e-3
# After a few Adam steps each weight has moved by up to lr per step whatever its gradient's size,
# so rounding in a gradient near zero moves its weight visibly: the paths' weights agree to a
# small fraction of the distance the dense weights moved, not to TOL.
MOVED = 0.02 * LR * STEPS


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _rel(a, b) -> float:
    return ((a - b).abs().max() / b.abs().max()).item()


def _setup():
    from plscale.predict.presets import preset
    from plscale.rank.models.llama import Llama

    torch.manual_seed(0)  # the same dense weights on every rank
    c = preset("tiny")
    tokens = torch.randint(0, c.vocab, (2, 17), generator=torch.Generator().manual_seed(1))
    return Llama(c), tokens[:, :-1], tokens[:, 1:]


def _dense_steps(dense, x, y, ds_config, on_step=None) -> list[float]:
    from plscale.rank.optim import optimizer

    opt, losses = optimizer(dense.parameters(), ds_config), []
    for _ in range(STEPS):
        loss = dense(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(dense.parameters(), CLIP)
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses


def _dtensor(mesh, sequence_parallel: bool) -> dict:
    import copy

    import warnings

    from torch.distributed.tensor import DTensor, Replicate
    from torch.distributed.tensor.debug import CommDebugMode

    from plscale.rank.optim import optimizer
    from plscale.strategies.tensor_parallel import dtensor_path

    dense, x, y = _setup()
    model = dtensor_path.parallelize(copy.deepcopy(dense), mesh.group("tp"), sequence_parallel)
    dense_loss = dense(x, y)
    dense_loss.backward()
    with CommDebugMode() as forward:
        loss = model(x, y)
    with CommDebugMode() as backward, warnings.catch_warnings():
        warnings.simplefilter("ignore")  # its module tracker's backward hooks
        loss.backward()
    grads, mine = dict(dense.named_parameters()), dtensor_path.full_grads(model)
    out = {"loss_gap": abs(loss.item() - dense_loss.item()), "names_equal": sorted(grads) == sorted(mine),
           "grad_gaps": {n: _rel(mine[n], p.grad) for n, p in grads.items() if n in mine},
           "comms": [{str(op).split(".")[-1]: n for op, n in mode.get_comm_counts().items()}
                     for mode in (forward, backward)]}
    norm = model.layers[0].input_layernorm.weight
    out["norm_is_replicated_dtensor"] = isinstance(norm, DTensor) and norm.grad.placements == (Replicate(),)
    out["sharded"] = sum(isinstance(p, DTensor) and p.placements != (Replicate(),) for p in model.parameters())
    # Training: the same AdamW steps, clipped, from here.
    ds_config = build(DSSpec(grad_clip=CLIP, lr=LR))
    opt, losses = optimizer(model.parameters(), ds_config), []
    for step in range(STEPS):
        if step:
            loss = model(x, y)
            loss.backward()
        norm = dtensor_path.clip_grad_norm_(model, CLIP)
        out.setdefault("grad_norm", norm)  # the first step's
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    dense.zero_grad()
    out["losses"], out["dense_losses"] = losses, _dense_steps(dense, x, y, ds_config)
    weights, dense_weights = dtensor_path.full_weights(model), dict(dense.named_parameters())
    out["weight_gap"] = max((weights[n] - w).abs().max().item() for n, w in dense_weights.items())
    return out


def _autotp(mesh) -> dict:
    import copy

    from plscale.strategies.tensor_parallel import autotp_path

    dense, x, y = _setup()
    ds_config = build(DSSpec(micro_batch=2, world_size=WORLD // 2, grad_clip=CLIP, lr=LR, autotp_size=2))
    engine = autotp_path.initialize(copy.deepcopy(dense), ds_config, 2, mesh)
    kinds, t, i = autotp_path.sharded(engine), mesh.size("tp"), mesh.rank_in("tp")

    def shard(name, full):  # the dense tensor cut as AutoTP cut this rank's weight
        kind = kinds.get(name.rsplit(".", 1)[0])
        return full if kind is None else full.chunk(t, dim=0 if kind == "LinearLayer" else 1)[i]

    losses, grad_gap = [], None
    dense_copy = copy.deepcopy(dense)
    for step in range(STEPS):
        loss = engine(x, y)
        engine.backward(loss)
        if step == 0:
            dense_copy(x, y).backward()
            full = dict(dense_copy.named_parameters())
            grad_gap = max(_rel(p.grad, shard(n, full[n].grad)) for n, p in engine.module.named_parameters())
        engine.step()
        losses.append(loss.item())
    dense_losses = _dense_steps(dense, x, y, ds_config)
    full = dict(dense.named_parameters())
    weight_gap = max((p - shard(n, full[n])).abs().max().item() for n, p in engine.module.named_parameters())
    return {"losses": losses, "dense_losses": dense_losses, "grad_gap": grad_gap, "weight_gap": weight_gap,
            "kinds": kinds, "tp_ranks": autotp_path.tp_ranks(engine), "mesh_tp": mesh.ranks("tp"),
            "dp_ranks": autotp_path.dp_ranks(engine), "mesh_dp": mesh.ranks("dp")}


def _megatron(mesh) -> dict:
    from plscale.strategies.tensor_parallel import megatron_path

    reason = megatron_path.unavailable()
    if reason:
        return {"skip": reason}
    group, t, i = mesh.group("tp"), mesh.size("tp"), mesh.rank_in("tp")
    Column, Row = megatron_path.linear_classes(group)
    torch.manual_seed(0)
    a, b = torch.nn.Linear(32, 48, bias=False), torch.nn.Linear(48, 32, bias=False)
    column, row = Column(32, 48, group), Row(48, 32, group)
    column.load_shard(a.weight)
    row.load_shard(b.weight)
    x, weights = torch.randn(2, 8, 32), torch.randn(2, 8, 32)
    x_dense, x_tp = x.clone().requires_grad_(), x.clone().requires_grad_()
    y_dense, y_tp = b(torch.relu(a(x_dense))), row(torch.relu(column(x_tp)))
    (y_dense * weights).sum().backward()
    (y_tp * weights).sum().backward()
    stacked = Column(32, [32, 16, 16], group)
    qkv = [torch.randn(n, 32) for n in (32, 16, 16)]
    stacked.load_shard(*qkv)
    parts = stacked(x)
    try:
        Column(32, 48, group, sequence_parallel=True)
        sp_error = None
    except ValueError as exc:
        sp_error = str(exc)
    return {"forward": _rel(y_tp, y_dense), "input_grad": _rel(x_tp.grad, x_dense.grad),
            "column_grad": _rel(column.weight.grad, a.weight.grad.chunk(t, 0)[i]),
            "row_grad": _rel(row.weight.grad, b.weight.grad.chunk(t, 1)[i]),
            "shapes": [list(column.weight.shape), list(row.weight.shape)],
            "names": [n for n, _ in column.named_parameters()],
            "stacked": max(_rel(p, x @ w.chunk(t, 0)[i].T) for p, w in zip(parts, qkv)), "sp_error": sp_error}


def _worker(rank, port, out_dir):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank),
                      WORLD_SIZE=str(WORLD), DS_ACCELERATOR="cpu", OMP_NUM_THREADS="1")
    from plscale.rank import distributed
    from plscale.rank.mesh import Mesh

    distributed.init()
    mesh = Mesh.build(tp=2, dims=("tp", "dp"))
    results = {"dtensor": _dtensor(mesh, False), "dtensor_sp": _dtensor(mesh, True), "autotp": _autotp(mesh),
               "megatron": _megatron(mesh)}
    (out_dir / f"rank{rank}.json").write_text(json.dumps(results))
    distributed.shutdown()


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    out_dir = tmp_path_factory.mktemp("tp")
    mp.spawn(_worker, args=(_free_port(), out_dir), nprocs=WORLD, join=True)
    return [json.loads((out_dir / f"rank{r}.json").read_text()) for r in range(WORLD)]


@pytest.mark.parametrize("case", ["dtensor", "dtensor_sp"])
def test_dtensor_matches_dense_loss_gradients_and_training(runs, case):
    for results in runs:
        r = results[case]
        assert r["names_equal"] and r["sharded"] == 14  # q k v o gate up down, 2 layers
        assert r["loss_gap"] < 1e-5
        worst = max(r["grad_gaps"], key=r["grad_gaps"].get)
        assert r["grad_gaps"][worst] < TOL, (worst, r["grad_gaps"][worst])
        assert r["grad_norm"] > CLIP  # the clipping was real
        assert all(abs(a - b) < 1e-5 for a, b in zip(r["losses"], r["dense_losses"])), r
        assert r["weight_gap"] < MOVED
    # Megatron's count per layer (2 layers): 2 all-reduces each way; or 2 all-gathers and 2
    # reduce-scatters, one more all-gather before the final norm, and the norm weights' sums.
    comms = {"dtensor": [{"all_reduce": 4}, {"all_reduce": 4}],
             "dtensor_sp": [{"all_gather_into_tensor": 5, "reduce_scatter_tensor": 4},
                            {"all_gather_into_tensor": 5, "reduce_scatter_tensor": 4, "all_reduce": 4}]}
    assert all(results[case]["comms"] == comms[case] for results in runs), runs[0][case]["comms"]
    # Under sequence parallelism the norm weights are replicated DTensors whose gradients,
    # made from each rank's slice of the sequence, were summed (their gaps are checked above).
    assert all(results[case]["norm_is_replicated_dtensor"] == (case == "dtensor_sp") for results in runs)


def test_autotp_trains_like_dense_on_the_mesh_groups(runs):
    for rank, results in enumerate(runs):
        r = results["autotp"]
        assert r["tp_ranks"] == r["mesh_tp"] == [0, 1]
        assert r["dp_ranks"] == r["mesh_dp"] == [rank]
        assert sorted(set(r["kinds"].values())) == ["LinearAllreduce", "LinearLayer"]
        assert r["kinds"]["layers.1.self_attn.o_proj"] == "LinearAllreduce"
        assert r["kinds"]["layers.0.mlp.up_proj"] == "LinearLayer" and len(r["kinds"]) == 14
        assert r["grad_gap"] < TOL
        assert all(abs(a - b) < 1e-5 for a, b in zip(r["losses"], r["dense_losses"])), r
        assert r["losses"][-1] < r["losses"][0] - 0.5  # it trained
        assert r["weight_gap"] < MOVED


def test_megatron_layers_match_dense_linears(runs):
    if "skip" in runs[0]["megatron"]:
        pytest.skip(runs[0]["megatron"]["skip"])
    for r in (results["megatron"] for results in runs):
        assert max(r["forward"], r["input_grad"], r["column_grad"], r["row_grad"], r["stacked"]) < TOL, r
        assert r["shapes"] == [[24, 32], [32, 24]] and r["names"] == ["weight"]
        assert r["sp_error"] == "megatron-core's sequence parallel needs CUDA"


def test_autotp_config_and_spec():
    from plscale.strategies.tensor_parallel.autotp_path import autotp_config

    config = build(DSSpec(micro_batch=2, world_size=1, autotp_size=2))
    assert config["tensor_parallel"] == {"autotp_size": 2} and "train_batch_size" not in config
    assert "tensor_parallel" not in build(DSSpec(world_size=1)) and "train_batch_size" in build(DSSpec(world_size=1))
    with pytest.raises(UserError, match="autotp_size"):
        build(DSSpec(autotp_size=-1))
    config["train_batch_size"] = 2  # data-parallel ranks only, as the frame counts them
    ours = autotp_config(config, 2)
    assert "train_batch_size" not in ours and config["train_batch_size"] == 2  # a copy
    assert ours["tensor_parallel"]["autotp_size"] == 2
    assert ours["tensor_parallel"]["partition_config"]["use_default_specs"] is False
