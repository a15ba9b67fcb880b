"""The JAX lab's layouts on paper (plscale.predict.sharding), checked by hand on the tiny preset:
vocab 2048, hidden 128, 2 layers, ffn 384, tied head.

    one layer   4 x 128^2 (q, k, v, o) + 3 x 128 x 384 (gate, up, down) + 2 x 128 (norms) = 213,248
    the model   2048 x 128 + 2 x 213,248 + 128 (final norm)                            = 688,768
"""

import pytest

from plscale.errors import UserError
from plscale.predict import sharding
from plscale.predict.presets import param_count, preset

TINY = preset("tiny")


def test_hand_count_of_tiny():
    assert param_count(TINY) == 688_768


@pytest.mark.parametrize("layout, axes, params, moments", [
    ("dp", {"data": 4}, 4 * 688_768, 8 * 688_768),                    # ZeRO-0: everything replicated
    ("fsdp", {"data": 4}, 688_768, 2 * 688_768),                      # ZeRO-3: 4Ψ/4, 8Ψ/4
    # TP 2: (embedding + matmuls) / 2 + the 5 norm weights of 128 replicated = 344,704; then / dp 2
    ("fsdp_tp", {"data": 2, "model": 2}, 2 * 344_704, 4 * 344_704),
    # a stage: one layer + the embedding + the final norm, replicated over the data axis
    ("pipeline", {"stage": 2, "data": 2}, 4 * 475_520, 8 * 475_520),
])
def test_states_per_device(layout, axes, params, moments):
    mesh = sharding.mesh(layout, 4)
    assert mesh.shape == axes
    assert sharding.states_per_device(TINY, mesh) == {"parameters": params, "moments": moments}


@pytest.mark.parametrize("layout, measured", [("dp", 20.2587890625), ("fsdp", 5.064697265625),
                                               ("fsdp_tp", 5.06689453125), ("pipeline", 14.1298828125)])
def test_parameters_per_device_are_what_jax_placed(layout, measured):
    """labs/10_jax_gspmd/reference.json (run 20261124-055608-jax-gspmd-layouts: preset small, 4 CPU
    devices, mesh.tp 2, mesh.stages 2): the bytes of the parameter shards JAX placed on each device, MiB."""
    got = sharding.states_per_device(preset("small"), sharding.mesh(layout, 4))["parameters"]
    assert got / 2**20 == measured


def test_by_hand_collectives():
    dp = sharding.by_hand(TINY, sharding.mesh("dp", 4), seq=32, batch=8)
    assert [(r.op, r.total) for r in dp] == [("all_reduce", 4 * 688_768)]
    fsdp = {(r.op, r.phase): r.total for r in sharding.by_hand(TINY, sharding.mesh("fsdp", 4), seq=32, batch=8)}
    assert fsdp == {("all_gather", "forward"): 4 * 688_768, ("all_gather", "backward"): 4 * 688_768,
                    ("reduce_scatter", "backward"): 4 * 688_768}
    pipe = sharding.by_hand(TINY, sharding.mesh("pipeline", 4), seq=32, batch=8, micro_batches=2)
    # 8 sequences / data 2 = 4 per shard, 2 per micro-batch: 2 x 32 x 128 fp32 per send
    assert [(r.op, r.calls, r.bytes) for r in pipe[1:]] == [("send_recv", 2, 2 * 32 * 128 * 4)] * 2


@pytest.mark.parametrize("layout, devices, kwargs, words", [
    ("fsdp_tp", 4, {"tp": 3}, "mesh.tp 3 on 4 devices"),
    ("pipeline", 2, {"stages": 1}, "mesh.stages 1"),
    ("zero3", 4, {}, "Unknown layout 'zero3'"),
])
def test_bad_meshes(layout, devices, kwargs, words):
    with pytest.raises(UserError, match=words):
        sharding.mesh(layout, devices, **kwargs)


def test_what_must_divide():
    with pytest.raises(UserError, match="do not split into 4 stages"):
        sharding.check(TINY, sharding.mesh("pipeline", 4, stages=4), batch=8)
    with pytest.raises(UserError, match="does not split over the data axis of 4"):
        sharding.check(TINY, sharding.mesh("dp", 4), batch=6)
    with pytest.raises(UserError, match="pipeline.micro_batches 3"):
        sharding.check(TINY, sharding.mesh("pipeline", 4), batch=8, micro_batches=3)


def test_estimate_layouts_prints_the_same_figures(tmp_path):
    """`plscale estimate layouts` (host-side) says what the lab checks: bytes per device by layout."""
    import json

    from conftest import run_cli
    out = run_cli("estimate", "layouts", "--model", "tiny", "--seq", "32", "--json")
    assert out.returncode == 0, out.stderr
    rows = {r["layout"]: r for r in json.loads(out.stdout)["layouts"]}
    for layout in sharding.LAYOUTS:
        want = sharding.states_per_device(TINY, sharding.mesh(layout, 4))
        assert {k: rows[layout][k] for k in want} == want
    assert [c["op"] for c in rows["fsdp"]["collectives"]] == ["all_gather", "all_gather", "reduce_scatter"]
    bad = run_cli("estimate", "layouts", "--tp", "3")
    assert bad.returncode == 2 and bad.stderr.strip().splitlines() == [
        "error: --tp 3 on 4 devices: layout fsdp_tp needs a model axis of 2 or more that divides the devices; "
        "pick one of [2, 4]."]
