"""The comms-logger reader (plscale/rank/comms.py): calls, bytes and seconds per collective,
against hand-written comms_dicts in both of DeepSpeed's latency modes, then against the
real logger on one gloo rank."""

import os
import socket
import subprocess
import sys
import textwrap
from types import SimpleNamespace

import pytest

from plscale.rank import comms
from plscale.rank.comms import Traffic

# comms_dict[op][message bytes] = [calls, [latency ms, ...], [algbw, ...], [busbw, ...]]
BEFORE = {"all_reduce": {4096: [1, [3.0], [0], [0]]}}
# Two steps later. all_reduce: two more 4096-byte calls and two 8-byte ones; its timer, never
# reset, read 3.0, 7.0, 12.0, 12.5, 13.0 ms after each call (cumulative mode).
AFTER = {"all_reduce": {4096: [3, [3.0, 7.0, 12.0], [0] * 3, [0] * 3], 8: [2, [12.5, 13.0], [0] * 2, [0] * 2]},
         "all_gather_into_tensor": {2048: [2, [1.0, 2.5], [0] * 2, [0] * 2]},
         "broadcast": {4: [10, [0.1] * 10, [0] * 10, [0] * 10]}}


@pytest.fixture
def logger(monkeypatch):
    """A fake DeepSpeed comms logger; set .comms_dict, and the latency mode with mode()."""
    fake = SimpleNamespace(enabled=True, comms_dict={})
    monkeypatch.setattr(comms, "_logger", lambda: fake)
    fake.mode = lambda cumulative: monkeypatch.setattr(comms, "cumulative_latencies", lambda: cumulative)
    return fake


def test_snapshot_cumulative_latencies(logger):
    logger.mode(cumulative=True)
    logger.comms_dict = AFTER
    snap = comms.snapshot()
    # the running total is the largest latency logged for the op, over all its sizes
    assert snap["all_reduce"] == Traffic(calls=5, bytes=3 * 4096 + 2 * 8, seconds=pytest.approx(0.013))
    assert snap["all_gather_into_tensor"] == Traffic(calls=2, bytes=4096, seconds=pytest.approx(0.0025))
    assert snap["broadcast"] == Traffic(calls=10, bytes=40, seconds=pytest.approx(0.0001))


def test_snapshot_per_call_latencies(logger):
    logger.mode(cumulative=False)
    logger.comms_dict = AFTER
    snap = comms.snapshot()
    assert snap["all_reduce"] == Traffic(calls=5, bytes=12304, seconds=pytest.approx((3 + 7 + 12 + 12.5 + 13) / 1000))
    assert snap["all_gather_into_tensor"].seconds == pytest.approx(0.0035)
    assert snap["broadcast"].seconds == pytest.approx(0.001)


def test_per_step_cumulative(logger):
    logger.mode(cumulative=True)
    logger.comms_dict = BEFORE
    before = comms.snapshot()
    logger.comms_dict = AFTER
    steps = comms.per_step(before, comms.snapshot(), steps=2)
    # broadcast moved 20 bytes per step: under the 1 KiB floor, left out
    assert set(steps) == {"all_reduce", "all_gather_into_tensor"}
    assert steps["all_reduce"] == Traffic(calls=2, bytes=(2 * 4096 + 16) / 2, seconds=pytest.approx(0.005))
    assert steps["all_gather_into_tensor"] == Traffic(calls=1, bytes=2048, seconds=pytest.approx(0.00125))


def test_per_step_per_call(logger):
    logger.mode(cumulative=False)
    logger.comms_dict = BEFORE
    before = comms.snapshot()
    logger.comms_dict = AFTER
    steps = comms.per_step(before, comms.snapshot(), steps=2, min_bytes=0)
    assert steps["all_reduce"] == Traffic(calls=2, bytes=4104, seconds=pytest.approx((7 + 12 + 12.5 + 13) / 2000))
    assert steps["all_gather_into_tensor"].seconds == pytest.approx(0.00175)
    assert steps["broadcast"] == Traffic(calls=5, bytes=20, seconds=pytest.approx(0.0005))


def test_calls_by_size_and_enabled(logger):
    logger.comms_dict = AFTER
    assert comms.calls_by_size()["all_reduce"] == {4096: 3, 8: 2}
    assert comms.enabled()
    logger.enabled = False
    assert not comms.enabled()


def test_reads_the_real_logger():
    """One gloo rank, 40 all-reduces of 64 KiB: calls and bytes exact, and the seconds no
    more than the loop's wall time (summing DeepSpeed 0.19's running totals would give ~20x)."""
    script = textwrap.dedent("""
        import json, time
        import torch
        from plscale.rank import comms, distributed
        distributed.init()
        import deepspeed.comm as ds_dist
        ds_dist.configure(enabled=True, prof_all=True)
        x = torch.ones(16 * 1024)
        ds_dist.all_reduce(x)
        before, t0 = comms.snapshot(), time.perf_counter()
        for _ in range(40):
            ds_dist.all_reduce(x)
        wall = time.perf_counter() - t0
        step = comms.per_step(before, comms.snapshot(), 40)["all_reduce"]
        print(json.dumps({"calls": step.calls, "bytes": step.bytes, "seconds": step.seconds, "wall": wall,
                          "cumulative": comms.cumulative_latencies()}))
        distributed.shutdown()
    """)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(port), "DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    import json

    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert (got["calls"], got["bytes"]) == (1, 64 * 1024)
    assert 0 < got["seconds"] * 40 <= got["wall"]
