"""One training step of the 4D Llama: 1F1B over the pipeline, then the gradient sums, then AdamW.

    1. schedule   1F1B (plscale/strategies/pipeline/schedules.py) over StageLinks on the pp group;
                  every tensor that crosses is [micro, s/cp, h]. Inside each forward and
                  backward the tp group all-reduces (f, g) and the cp group passes k/v round its
                  ring; the ranks of one stage run the same micro-batch at the same time.
    2. tied       the first and last stage of each pipeline sum the tied embedding/head
                  shard's gradient (TiedGroups, Megatron's embedding group); nothing at pp = 1
    3. dp x cp    ONE all-reduce over the dp-cp group of every gradient, flattened in one
                  buffer, then / dp:
                      cp ranks hold the same weights and each computed the gradient of its
                      share of the loss (tokens' mean / cp): the shares' gradients SUM to the
                      micro-batch's;
                      dp replicas saw other batches: their gradients AVERAGE.
                  A sum over cp then a sum over dp is the sum over the dp x cp ranks, so one
                  collective over dp-cp (what Megatron reduces over with cp) does both, and
                  one division by dp makes the average. Two collectives (cp, then dp) would
                  send the same bytes twice over smaller groups.
    4. optimizer  torch's AdamW with the run's DeepSpeed config values (plscale/rank/optim.py)

With ZeRO-1 (`zero_stage=1`, zero1.py) step 3 becomes a reduce-scatter over dp-cp (each rank
its 1/N of the flat gradient, N = dp x cp, / dp) and step 4 AdamW on that slice, then an
all-gather of the parameters: the same bytes on the wire, 12Ψ/N of optimizer state per rank.

tp ranks need no gradient sum: each holds other shards, and the replicated norms see the whole
residual stream, so their gradients are already equal over tp (under sequence parallelism
each sees its own tokens, and a hook of the stage's sums them over tp in backward).

    step = HybridStep(stage, mesh, ds_config)
    loss = step(micro_batches)       # m (tokens, targets) pairs of this rank's columns (s/cp)
    step.ops                         # the last step's timed forwards, backwards, sends, receives (a timeline)
    step.seconds                     # its time by part: schedule, gradient all-reduces, optimizer
    step.sent                        # its collectives: (op, what) -> (calls, bytes of each call's tensor)
    step.census_next = True          # the next step counts its tensors after the backward: step.census,
                                     # and its activations in flight at their peak: step.activations_peak
"""

import contextlib
import time

import torch
import torch.distributed as dist

from plscale.predict.pipeline import Op
from plscale.rank.census import activations_in_flight, census
from plscale.rank.mesh import Mesh
from plscale.rank.optim import optimizer
from plscale.strategies.hybrid.zero1 import Zero1AdamW
from plscale.strategies.pipeline.p2p import StageLinks
from plscale.strategies.pipeline.schedules import Schedule
from plscale.strategies.pipeline.stages import TiedGroups


class HybridStep:
    def __init__(self, stage, mesh: Mesh, ds_config: dict, zero_stage: int = 0):
        self.stage, self.mesh, self.zero_stage = stage, mesh, zero_stage
        self.p, self.s = mesh.size("pp"), mesh.rank_in("pp")
        self.dp = mesh.size("dp")
        if zero_stage == 1:
            self.optimizer = Zero1AdamW(stage.parameters(), mesh.group("dp-cp"), self.dp, ds_config,
                                        lambda op, nbytes: self._count(op, "dp-cp", nbytes))
        else:
            self.optimizer = optimizer(stage.parameters(), ds_config)
        self.sent, self.census_next, self.census, self.activations_peak = {}, False, None, 0
        self.tied = TiedGroups.build(mesh, stage.config)  # a collective: every rank builds every group
        self.device = next(stage.parameters()).device
        self.ops, self.seconds = [], {}

    def _record(self, kind, micro, start, end):
        self.ops.append(Op(self.s, kind, micro, start, end, self.s))

    def _count(self, op: str, what: str, nbytes: int) -> None:
        calls, total = self.sent.get((op, what), (0, 0))
        self.sent[(op, what)] = (calls + 1, total + nbytes)

    def states(self) -> dict[str, list]:
        """The model states by role (plscale/rank/census.py): the stage's weights and gradients,
        and the optimizer's fp32 master and Adam moments (torch's AdamW: moments only)."""
        params = list(self.stage.parameters())
        if self.zero_stage == 1:
            opt = self.optimizer.states()
        else:
            opt = {"master": [], "moments": [t for s in self.optimizer.state.values() for t in s.values()
                                             if torch.is_tensor(t)]}
        return {"parameters": params, "gradients": [p.grad for p in params if p.grad is not None], **opt}

    def __call__(self, micro_batches) -> float:
        micro, local = micro_batches[0][0].shape          # s/cp tokens; s/(cp t) cross under sp
        local //= self.stage.t if self.stage.sequence_parallel else 1
        links = StageLinks(self.mesh.ranks("pp"), self.mesh.rank, self.mesh.group("pp"),
                           (micro, local, self.stage.config.hidden), torch.float32, self.device, self._record)
        run = Schedule(self.stage, links, self.stage.loss, self.s == 0, self.s == self.p - 1, self._record)
        self.ops, self.sent, t0 = [], {}, time.perf_counter()
        with activations_in_flight() if self.census_next else contextlib.nullcontext() as acts:
            losses = run.one_f_one_b(micro_batches, self.p, self.s)
        self.activations_peak = acts.peak if acts else self.activations_peak
        for (direction, calls, nbytes) in links.sent():
            self.sent[("send", direction)] = (calls, nbytes)
        if self.census_next:   # the gradients whole, as while micro-batches accumulate: their peak
            self.census, self.census_next = census(self.states()), False
        t1 = time.perf_counter()
        self.sync_grads()
        t2 = time.perf_counter()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.seconds = {"schedule": t1 - t0, "gradient all-reduces": t2 - t1, "optimizer": time.perf_counter() - t2}
        return self.mean_loss(losses)

    def parts(self, step_s: float, tp_s: float = 0.0, cp_s: float = 0.0) -> dict:
        """Where the last step's `step_s` seconds went, by the planner's terms where they can be told
        apart: the forward and backward less the tp collectives (tp_s) and the ring's waits (cp_s)
        inside them, the waits for a pipeline neighbour (the bubble and pp's sends), the dp x cp
        gradients, the optimizer and the rest (loss, data)."""
        def took(*kinds):
            return sum(o.end - o.start for o in self.ops if o.kind in kinds)

        out = {"compute": took("F", "B") - tp_s - cp_s, "tp comm": tp_s, "cp waits": cp_s,
               "pp waits, bubble": took("send", "recv"), "dp x cp comm": self.seconds["gradient all-reduces"],
               "optimizer": self.seconds["optimizer"]}
        out["rest"] = step_s - sum(out.values())
        return out

    @torch.no_grad()
    def sync_grads(self) -> None:
        params = list(self.stage.parameters())
        for p in params:  # a parameter this rank's work never reached still joins the sums
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        tied = self.stage.tied_weight()
        if self.tied.group is not None and tied is not None:
            dist.all_reduce(tied.grad, group=self.tied.group)
            self._count("all_reduce", "tied", tied.grad.numel() * tied.grad.element_size())
        if self.zero_stage == 1:   # a reduce-scatter: this rank's slice only (zero1.py)
            self.optimizer.reduce_gradients()
            return
        flat = torch.cat([p.grad.reshape(-1) for p in params])
        dist.all_reduce(flat, group=self.mesh.group("dp-cp"))
        self._count("all_reduce", "dp-cp", flat.numel() * flat.element_size())
        flat /= self.dp
        for p, g in zip(params, flat.split([p.numel() for p in params])):
            p.grad.copy_(g.view_as(p))

    def mean_loss(self, losses: list) -> float:
        """The step's loss on every rank: shares summed over cp, averaged over micro-batches and
        over dp replicas, sent from the last stage to the others."""
        loss = torch.stack(losses).mean() if losses else torch.zeros((), device=self.device)
        dist.all_reduce(loss, group=self.mesh.group("dp-cp"))
        loss /= self.dp
        dist.broadcast(loss, src=self.mesh.ranks("pp")[-1], group=self.mesh.group("pp"))
        return loss.item()
