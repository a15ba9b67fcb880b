"""Throughput, MFU and HFU of a language-model lab, the way a user computes them.

    util = Utilization(ctx, config, seq, tokens_per_step, "fp32")   # measures the peak (cached)
    ctx.metrics.step(step=..., step_time_s=t, **util.of_step(t))   # tokens_per_s, mfu, hfu each step
    figures += util.figures(timed)                                  # throughput, MFU, HFU in the summary

Throughput is tokens a step over the *median* step time of the timed steps (the steps with no
synchronising measurement on them), as a training loop's own log would report it.

MFU (model FLOPs utilisation, PaLM's definition) counts the FLOPs the model needs, forward and
backward, from plscale.predict.recompute.step_flops: 6 per matmul weight a token plus attention's
scores and weighted sum, causal-free. HFU (hardware FLOPs utilisation) adds the forward work
recomputation does again, so HFU = MFU without recomputation (a mixture of experts' HFU counts
every capacity slot its experts compute, plscale.predict.experts.step_flops). Both are FLOP/s a rank (the
step's FLOPs over all ranks, over the step time, over the ranks) against a peak:
- the measured matmul peak of the rank's device (plscale.rank.peak), on every device; on a
  CPU the only one there is;
- on a GPU plscale knows, also its datasheet dense peak for the precision
  (plscale.predict.cluster, the peak `plscale plan` uses).
"""

import statistics

import torch

from plscale.predict.cluster import gpu_of_device
from plscale.predict.presets import ModelConfig
from plscale.predict.recompute import step_flops
from plscale.rank.metrics import figure
from plscale.rank.peak import matmul_peak

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
_SAID = set()


class Utilization:
    def __init__(self, ctx, config: ModelConfig, seq: int, tokens_per_step: int, precision: str = "fp32",
                 recompute: str = "none", recompute_layers: int = 0, flops: tuple | None = None):
        """`flops`: (model, hardware, what the hardware count adds) FLOPs a token, for a model the dense
        count does not fit (a mixture of experts: plscale.predict.experts.step_flops)."""
        if flops is None:
            dense = step_flops(config, seq, recompute, recompute_layers)
            flops = (dense.step, dense.total, "MFU with recomputation's FLOPs counted")
        self.tokens_per_step, self.ranks = tokens_per_step, ctx.world_size
        self.model_flops = flops[0] * tokens_per_step       # a step, all ranks together
        self.hardware_flops, self.hardware_note = flops[1] * tokens_per_step, flops[2]
        self.measured = matmul_peak(ctx.device, DTYPES[precision])
        gpu = gpu_of_device(torch.cuda.get_device_name(ctx.device)) if ctx.device.type == "cuda" else None
        # fp32's datasheet peak is TF32's (tensor cores), which torch uses for fp32 matmuls only when
        # told to (torch.backends.cuda.matmul.allow_tf32): an fp32 run's datasheet MFU is against it
        kind = "tf32" if precision == "fp32" else precision
        self.datasheet = (gpu.peak(precision), f"{gpu.name} datasheet, {kind} dense") if gpu else None
        said = (f"peak a rank: {self.measured.describe()}"
                + (f"; {self.datasheet[0] / 1e12:g} TFLOP/s ({self.datasheet[1]})" if self.datasheet else ""))
        if said not in _SAID:  # once a process, however many models a lab compares
            _SAID.add(said)
            ctx.log(said)

    def per_rank(self, step_s: float, flops: float) -> float:
        return flops / step_s / self.ranks

    def of_step(self, step_s: float) -> dict:
        """Per-step fields for metrics.jsonl: tokens/s, MFU and HFU against the measured peak
        (and against the datasheet's, on a known GPU)."""
        out = {"tokens_per_s": self.tokens_per_step / step_s,
               "mfu": self.per_rank(step_s, self.model_flops) / self.measured.flops,
               "hfu": self.per_rank(step_s, self.hardware_flops) / self.measured.flops}
        if self.datasheet:
            out["mfu_datasheet"] = self.per_rank(step_s, self.model_flops) / self.datasheet[0]
            out["hfu_datasheet"] = self.per_rank(step_s, self.hardware_flops) / self.datasheet[0]
        return {k: round(v, 6) for k, v in out.items()}

    def figures(self, timed: list[float], of: str = "all ranks", prefix: str = "") -> list[dict]:
        """Throughput (median step), achieved FLOP/s a rank, MFU and HFU against each peak;
        each name after `prefix` (a lab that compares several runs: "full: MFU")."""
        step_s = statistics.median(timed)
        achieved = self.per_rank(step_s, self.model_flops)
        how = f"median of {len(timed)} timed steps"
        out = [figure("throughput", round(self.tokens_per_step / step_s, 1), "tokens/s", None, f"{of}; {how}"),
               figure("model FLOP/s per rank", round(achieved / 1e9, 2), "GFLOP/s", None,
                      f"{self.model_flops / 1e9:,.2f} GFLOP a step (forward and backward) over {self.ranks} ranks")]
        peaks = [("", self.measured.flops, self.measured.describe())]
        if self.datasheet:
            peaks.append((" (datasheet)", *self.datasheet))
        for suffix, peak, what in peaks:
            out += [figure(f"MFU{suffix}", round(100 * achieved / peak, 2), "%", None, f"vs {what}"),
                    figure(f"HFU{suffix}", round(100 * self.per_rank(step_s, self.hardware_flops) / peak, 2), "%",
                           None, self.hardware_note if self.hardware_flops != self.model_flops
                           else "no recomputation: equals MFU")]
        return [{**f, "name": prefix + f["name"]} for f in out]
