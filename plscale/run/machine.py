"""This machine as the planner sees it: N CPU ranks, measured (`plscale plan --here`, lab 11's sweep).

Starts N processes of `python -m plscale.rank.calibrate` (one thread each, gloo, as the labs
run without a GPU), reads what rank 0 wrote, and returns the figures; `cluster` turns them into
plscale.predict.cluster.cpu_ranks. Takes about ten seconds (N interpreters importing torch):
host commands call it only when asked to measure.

    figures = measure(8, PRESETS["tiny"], micro_batch=2, seq=64)
    figures.cluster()   # a GPU of the planner's: 8 "GPUs" on one node, this machine's cores
"""

import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from plscale.errors import UserError
from plscale.hardware import cpu_cores, free_port, memory_available
from plscale.predict.cluster import GPU, cpu_ranks
from plscale.predict.presets import ModelConfig

TIMEOUT_S = 300   # N interpreters on few cores: a minute is usual for 16, five is stuck


@dataclass(frozen=True)
class Machine:
    ranks: int
    cores: int
    flops: float               # a rank's FLOP/s on the model's forward and backward, all ranks at once
    busbw_gbs: float           # gloo all-reduce bus bandwidth over all ranks, GB/s
    latency_us: float          # a ring step of a small all-reduce
    memory: float              # bytes available a rank
    measured_on: str           # the model and micro-batch the FLOP/s are of
    collective_gbs: dict = field(default_factory=dict)   # reduce_scatter, all_gather: their own bus bandwidth
    p2p_latency_us: float = 0.0   # one hop of an isend/irecv ring; 0: a ring step's
    optimizer_ns: float = 0.0     # AdamW's step, a parameter; 0: not measured
    layer_overhead_us: float = 0.0   # a layer's forward and backward at no FLOPs (dispatch), a micro-batch

    def cluster(self) -> GPU:
        return cpu_ranks(self.ranks, self.cores, self.flops, self.busbw_gbs, self.latency_us, self.memory,
                         self.collective_gbs, self.p2p_latency_us, self.optimizer_ns, self.layer_overhead_us)

    def describe(self) -> str:
        others = "".join(f", {op.replace('_', '-')} {gbs:.2f}" for op, gbs in self.collective_gbs.items())
        return (f"{self.ranks} CPU ranks on {self.cores} cores: {self.flops / 1e9:.2f} GFLOP/s a rank and "
                f"{self.layer_overhead_us / 1e3:.2f} ms a layer at no FLOPs ({self.measured_on}, all ranks at once), "
                f"gloo bus bandwidth all-reduce {self.busbw_gbs:.2f}"
                f"{others} GB/s, {self.latency_us:.0f} us a ring step, {self.p2p_latency_us:.0f} us a point-to-point "
                f"hop, AdamW {self.optimizer_ns:.1f} ns a parameter, {self.memory / 2**30:.1f} GiB a rank")

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, raw: dict) -> "Machine":
        """Saved figures (a plan's "machine"); ValueError when one is missing or not a number it can be."""
        missing = [k for k in cls.__dataclass_fields__ if k not in raw]
        if missing:
            raise ValueError(f"{', '.join(missing)} missing, as in the figures of an older plscale: measure again")
        found = cls(**{k: raw[k] for k in cls.__dataclass_fields__})
        if not isinstance(found.collective_gbs, dict):
            raise ValueError(f"collective_gbs {found.collective_gbs!r} is not a table of collectives")
        positive = {n: getattr(found, n) for n in ("ranks", "cores", "flops", "busbw_gbs", "latency_us", "memory")}
        for name, value in {**positive, **found.collective_gbs}.items():
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
                raise ValueError(f"{name} {value!r} is not a positive number")
        for name in ("p2p_latency_us", "optimizer_ns", "layer_overhead_us"):   # 0: not measured
            value = getattr(found, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
                raise ValueError(f"{name} {value!r} is not a number of 0 or more")
        return found


def _wait(procs: list, logs: list[Path], deadline: float) -> str:
    """Wait for every process; on the first failure or past the deadline stop them all. The failed
    rank's last line of stderr, or "" when all succeeded."""
    while True:
        codes = [p.poll() for p in procs]
        bad = next((r for r, c in enumerate(codes) if c not in (None, 0)), None)
        late = time.monotonic() > deadline
        if bad is not None or late or all(c == 0 for c in codes):
            break
        time.sleep(0.1)
    if bad is not None:
        lines = logs[bad].read_text(errors="replace").strip().splitlines()
        return f"rank {bad}: {lines[-1] if lines else 'exit code ' + str(procs[bad].returncode)}"
    return f"no answer within {TIMEOUT_S} s" if late else ""


def measure(ranks: int, config: ModelConfig, micro_batch: int, seq: int, seconds: float = 1.0) -> Machine:
    """This machine's figures with `ranks` CPU processes (module doc)."""
    if ranks < 2:
        raise UserError(f"--gpus {ranks}: measuring this machine takes 2 or more ranks (gloo needs a peer).")
    available = memory_available("cpu") or 0
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    with tempfile.TemporaryDirectory() as tmp:
        out, port = Path(tmp) / "machine.json", free_port()
        logs, procs = [Path(tmp) / f"rank_{r}.err" for r in range(ranks)], []
        try:
            for r, log in enumerate(logs):
                with open(log, "w") as err:
                    procs.append(subprocess.Popen(
                        [sys.executable, "-m", "plscale.rank.calibrate", "--rank", str(r), "--world", str(ranks),
                         "--port", str(port), "--out", str(out), "--config", json.dumps(config.to_dict()),
                         "--micro-batch", str(micro_batch), "--seq", str(seq), "--seconds", str(seconds)],
                        env=env, stdout=subprocess.DEVNULL, stderr=err))
            failed = _wait(procs, logs, time.monotonic() + TIMEOUT_S)
        finally:   # Ctrl-C, or a process that would not start: none left waiting in gloo
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
                proc.wait()
        if failed or not out.exists():
            raise UserError(f"Measuring this machine with {ranks} CPU ranks failed ({failed or 'no figures written'}); "
                            f"`plscale doctor --gpus {ranks}` checks that {ranks} ranks can talk over gloo.")
        raw = json.loads(out.read_text())
    return Machine(ranks, cpu_cores(), raw["flops"], raw["busbw_gbs"], raw["latency_us"], available / ranks,
                   f"the {micro_batch} x {seq}-token forward and backward of a {config.hidden}-wide, "
                   f"{config.layers}-layer Llama", raw["collective_gbs"], raw["p2p_latency_us"], raw["optimizer_ns"],
                   raw["layer_overhead_us"])


def measure_showing(console, ranks: int, config: ModelConfig, micro_batch: int, seq: int) -> Machine:
    """measure, with a status line while it runs and the figures printed after."""
    with console.status(f"measuring this machine: {ranks} CPU ranks at once, the model's forward and backward, "
                        f"AdamW's step, then gloo's collectives (about 15 s)"):
        found = measure(ranks, config, micro_batch, seq)
    console.print(f"this machine: {found.describe()}", highlight=False)
    return found
