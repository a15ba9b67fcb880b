"""The pipeline lab's schedules run by PyTorch itself: torch.distributed.pipelining.

torch ships GPipe, 1F1B and interleaved 1F1B. Each rank wraps the pieces of its stage(s) in a
`PipelineStage` (which owns the sends and receives between neighbours) and hands them to a
schedule; `schedule.step` takes the WHOLE batch, cuts it into m micro-batches itself and runs
every forward and backward in the schedule's order:

    first stage   schedule.step(tokens)                          (tokens: m micro-batches, cat)
    last stage    schedule.step(target=targets, losses=losses)   (one loss per micro-batch)
    in between    schedule.step()

Interleaved 1F1B gives each rank v = 2 stages of P * v: rank r holds stages r and r + P, so a
micro-batch visits every rank twice and the bubble shrinks by v (P = 2: rank 0 holds 0 and 2,
rank 1 holds 1 and 3, the last). torch runs the m micro-batches in rounds of P.

    engine = TorchPipeline(reference, mesh, ds_config, schedule="1f1b")   # "gpipe" | "interleaved"
    loss = engine.step(micro_batches)      # m (tokens, targets) pairs; one AdamW step
    engine.set_micro_batches(8)            # another m from the next step on (the bubble sweep)
    engine.parts, engine.stages_here, engine.ops

    plscale lab run pipeline --variant torch-1f1b --gpus 2     (torch-gpipe, torch-interleaved)
    torchrun --nproc_per_node 2 labs/05_pipeline/train.py --variant torch-interleaved

The loss of a micro-batch is the mean over its tokens (llama_pieces.loss_fn); with
scale_grads=True (the default) torch divides every gradient by m after the last backward:
the gradient of the MEAN loss over the batch, as the unpipelined model's (measured: the
same losses bit for bit). torch knows nothing of tied weights or data parallelism, so
`stages.sync_grads` sums the embedding's and the head's gradients over the first
and last stage and averages every gradient over dp before AdamW steps.

Traps: the schedule infers shapes on its first step (running a forward and a backward of the
first micro-batch while setting up) and keeps them: later steps must keep the micro-batch
shape (refused here in one line); another m takes set_micro_batches(m), a new schedule.
Measured without the check (gloo, 2 ranks): a shorter sequence, or fewer micro-batches on
the old schedule, fail on the last stage with "Expected input batch_size (64) to match
target batch_size (32)"; a longer sequence aborts the process (gloo: "Received data size
doesn't match expected size"). Schedule1F1B refuses m < P. Tied gradients are summed only
when config.tie_embeddings: sync_grads would otherwise add an untied head's gradient to the
embedding's.

Timing: hooks on the stage module would count the set-up's extra forward and backward as
work, and the stage runs autograd on its outputs itself. So each stage's forward_one_chunk
and backward_one_chunk (which carry the micro-batch index) are wrapped to record an Op; the
last stage's "F" ends after its loss. Sends and receives are not timed: torch posts a send
with a receive and waits on both in one call inside the schedule; the gaps between F and B
are those waits.
"""

import dataclasses
import time

import torch
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe, ScheduleInterleaved1F1B

from plscale.errors import UserError
from plscale.predict.pipeline import Op
from plscale.rank.distributed import device_type
from plscale.rank.mesh import Mesh
from plscale.rank.models import llama_pieces
from plscale.rank.optim import optimizer
from plscale.strategies.pipeline.stages import TiedGroups, mean_loss, one_shape, split, sync_grads

SCHEDULES = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B, "interleaved": ScheduleInterleaved1F1B}


class TorchPipeline:
    def __init__(self, reference, mesh: Mesh, ds_config: dict, schedule: str = "1f1b",
                 virtual: int | None = None, device: torch.device | None = None):
        if schedule not in SCHEDULES:
            raise UserError(f"unknown schedule {schedule!r}: use one of {', '.join(SCHEDULES)}.")
        virtual = virtual or (2 if schedule == "interleaved" else 1)
        if (schedule == "interleaved") != (virtual > 1):
            raise UserError(f"schedule {schedule} with {virtual} stage(s) per rank: interleaved needs "
                            f"2 or more (pipeline.virtual), gpipe and 1f1b take 1.")
        if schedule == "interleaved" and mesh.size("pp") < 2:
            raise UserError("interleaving needs a pipeline of 2 or more ranks: --set parallel.pp=2.")
        self.mesh, self.kind, self.ds_config = mesh, schedule, ds_config
        cuda = device_type() == "cuda"
        self.device = device or (torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu"))
        p, me = mesh.size("pp"), mesh.rank_in("pp")
        self.pp_rank, self.num_stages = me, p * virtual
        self.parts = split(reference.config, self.num_stages)
        self.stages_here = [me + k * p for k in range(virtual)]   # loop placement: r, r + P, ...
        self.modules = [llama_pieces.build_pieces(reference, *self.parts[s]).to(self.device)
                        for s in self.stages_here]
        self.stages = [PipelineStage(module, s, self.num_stages, self.device, group=mesh.group("pp"))
                       for module, s in zip(self.modules, self.stages_here)]
        for stage, s in zip(self.stages, self.stages_here):
            stage.forward_one_chunk = self._timed(s, "F", stage.forward_one_chunk)
            stage.backward_one_chunk = self._timed(s, "B", stage.backward_one_chunk)
        self.first, self.last = 0 in self.stages_here, self.num_stages - 1 in self.stages_here
        # sync_grads sums whatever embedding and head weights it finds: only when they are tied
        self.tied = TiedGroups.build(mesh, reference.config)  # a collective: every rank
        self.optimizer = optimizer([q for m in self.modules for q in m.parameters()], ds_config)
        self.schedule, self.m, self.shape, self.ops = None, None, None, []

    def _timed(self, stage: int, kind: str, chunk_fn):
        """chunk_fn(micro, ...) timed as one Op of this rank."""
        def run(micro, *args, **kwargs):
            start = time.perf_counter()
            out = chunk_fn(micro, *args, **kwargs)
            self.ops.append(Op(self.pp_rank, kind, micro, start, time.perf_counter(), stage))
            return out
        return run

    def _loss(self, logits, targets):
        """The micro-batch's loss; the last stage's forward Op is stretched to its end."""
        loss = llama_pieces.loss_fn(logits, targets)
        if self.ops and self.ops[-1].kind == "F" and self.ops[-1].stage == self.num_stages - 1:
            self.ops[-1] = dataclasses.replace(self.ops[-1], end=time.perf_counter())
        return loss

    def set_micro_batches(self, m: int) -> None:
        """From the next step on, m micro-batches per step: a new schedule (the stages are kept,
        and set up again for m by its first step)."""
        p = self.mesh.size("pp")
        if self.kind == "1f1b" and m < p:
            raise UserError(f"torch's 1F1B needs at least one micro-batch per stage ({m} < {p}): "
                            f"use m >= {p} (ds.grad_accum, bubble.micro_batches).")
        if self.kind == "interleaved" and m % max(1, m // p):
            raise UserError(f"torch's interleaved 1F1B runs m in rounds of {p} (the pipeline's ranks): "
                            f"m = {m} does not fit; use a multiple of {p}.")
        self.m, self.schedule = m, None

    def _check(self, micro_batches) -> None:
        shape = one_shape(micro_batches, self.shape, "torch's PipelineStage")
        if self.m is None:
            self.set_micro_batches(len(micro_batches))
        if len(micro_batches) != self.m:
            raise UserError(f"{len(micro_batches)} micro-batches for a schedule of {self.m}: "
                            f"call set_micro_batches({len(micro_batches)}) first.")
        self.shape = shape

    def step(self, micro_batches) -> float:
        self._check(micro_batches)
        if self.schedule is None:
            stages = self.stages if self.kind == "interleaved" else self.stages[0]
            self.schedule = SCHEDULES[self.kind](stages, n_microbatches=self.m, loss_fn=self._loss)
        self.ops, losses = [], []
        tokens = torch.cat([t for t, _ in micro_batches]).to(self.device)
        targets = torch.cat([y for _, y in micro_batches]).to(self.device)
        if self.first and self.last:       # a pipeline of one rank
            self.schedule.step(tokens, target=targets, losses=losses)
        elif self.first:
            self.schedule.step(tokens)
        elif self.last:
            self.schedule.step(target=targets, losses=losses)
        else:
            self.schedule.step()
        sync_grads(self.modules, self.tied, self.mesh)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return mean_loss(losses, self.mesh, self.device)
