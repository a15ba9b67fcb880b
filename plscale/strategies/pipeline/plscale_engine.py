"""plscale's own pipeline engine: the schedules of `schedules.py` with an optimizer.

    engine = PlscalePipeline(reference, mesh, ds_config, schedule="1f1b")   # or "gpipe"
    loss = engine.step(micro_batches)   # m (tokens, targets) pairs of this replica: one optimizer step
    engine.ops                          # this rank's timed work in that step (plscale.predict.pipeline.Op)

One stage per rank, stages cut uniformly over the decoder layers (`stages.split`),
weights copied from the full `reference` model so that every engine starts alike. After the
schedule: the tied embedding and head sum their gradients, replicas average theirs (PP x DP),
and torch's AdamW steps with the DeepSpeed config's hyperparameters. The same interface as
`deepspeed_engine.DeepSpeedPipeline` and `torch_engine.TorchPipeline`.
"""

import torch

from plscale.errors import UserError
from plscale.predict.pipeline import Op
from plscale.rank.mesh import Mesh
from plscale.rank.models.llama_pieces import build_pieces, loss_fn
from plscale.strategies.pipeline.p2p import StageLinks
from plscale.strategies.pipeline.schedules import Schedule
from plscale.rank.optim import optimizer
from plscale.strategies.pipeline.stages import TiedGroups, mean_loss, one_shape, split, sync_grads


class PlscalePipeline:
    def __init__(self, reference, mesh: Mesh, ds_config: dict, schedule: str = "1f1b"):
        if schedule not in ("gpipe", "1f1b"):
            raise UserError(f"plscale's engine runs gpipe or 1f1b, not {schedule!r}.")
        self.mesh, self.schedule, self.config = mesh, schedule, reference.config
        self.p, self.s = mesh.size("pp"), mesh.rank_in("pp")
        self.parts = split(self.config, self.p)
        self.stages_here = [self.s]
        self.device = next(reference.parameters()).device
        self.stage = build_pieces(reference, *self.parts[self.s])
        self.optimizer = optimizer(self.stage.parameters(), ds_config)
        self.tied = TiedGroups.build(mesh, self.config)
        self.ops, self.shape = [], None

    def _record(self, kind, micro, start, end):
        self.ops.append(Op(self.s, kind, micro, start, end, self.s))

    def set_micro_batches(self, m: int) -> None:
        """Nothing to do: the schedules take as many micro-batches as step() is given."""

    def step(self, micro_batches) -> float:
        self.shape = one_shape(micro_batches, self.shape, "plscale's engine")
        batch = [(t.to(self.device), y.to(self.device)) for t, y in micro_batches]
        micro, seq = self.shape
        links = StageLinks(self.mesh.ranks("pp"), self.mesh.rank, self.mesh.group("pp"),
                           (micro, seq, self.config.hidden), torch.float32, self.device, self._record)
        run = Schedule(self.stage, links, loss_fn, self.s == 0, self.s == self.p - 1, self._record)
        self.ops = []
        losses = run.gpipe(batch) if self.schedule == "gpipe" else run.one_f_one_b(batch, self.p, self.s)
        sync_grads([self.stage], self.tied, self.mesh)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return mean_loss(losses, self.mesh, self.device)

