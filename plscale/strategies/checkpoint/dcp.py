"""PyTorch's way to checkpoint a sharded model: torch.distributed.checkpoint (DCP) of FSDP2.

DeepSpeed's checkpoint is cut to the world that wrote it (each rank's file, its 1/N of a flat
buffer) and needs a conversion to load elsewhere (`plscale ckpt convert --to universal`). DCP
saves every tensor as what it is, a DTensor with a global shape, each rank its own shard:

    save    get_state_dict(model, optimizer): {name: DTensor} for the weights and Adam's
            moments; dcp.save writes each rank's shards (__<rank>_0.distcp) and rank 0 one
            .metadata: for every tensor, its global shape and which file holds which rows
    load    at any world size: every rank asks for the rows of its own shards, and DCP reads
            them from whichever files hold them (resharding, 2 -> 1 or 1 -> 2 ranks, for free)

`Engine` gives an FSDP2 model the calls lab 06 makes of DeepSpeed's engine: forward, backward,
step at the gradient-accumulation boundary (clip, AdamW, DeepSpeed's own WarmupLR), and the
save/load pair. So lab 06's strategies, its sealed checkpoints (checksums, `latest` last), its
kill-and-restart run and `plscale ckpt` work on it unchanged; the random streams are each
rank's own file (rank_state.py), as beside DeepSpeed's.

    engine = Engine(model, ds_config, mesh)     # fully_shard per layer; torch's AdamW
    loss = engine(tokens, targets); engine.backward(loss); engine.step()
    engine.save_checkpoint(folder, tag)         # folder/tag/: .metadata, __0_0.distcp, ...
"""

from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp
from deepspeed.runtime.lr_schedules import WarmupLR
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from plscale.errors import UserError
from plscale.rank.optim import optimizer
from plscale.strategies.fsdp.fully_shard import shard


class Engine:
    def __init__(self, model: torch.nn.Module, ds_config: dict, mesh):
        self.module = shard(model, mesh, reshard=True)
        self.optimizer = optimizer(self.module.parameters(), ds_config)
        scheduler = ds_config.get("scheduler")
        if scheduler and scheduler["type"] != "WarmupLR":
            raise UserError(f"scheduler {scheduler['type']}: the FSDP2 engine here runs WarmupLR or none.")
        self.scheduler = WarmupLR(self.optimizer, **scheduler["params"]) if scheduler else None
        self.accum, self.clip = ds_config["gradient_accumulation_steps"], ds_config.get("gradient_clipping", 0)
        self.micro_steps = 0

    def __call__(self, tokens, targets):
        return self.module(tokens, targets)

    def backward(self, loss) -> None:
        (loss / self.accum).backward()   # the step's gradient: the mean over its micro-batches

    def step(self) -> None:
        """After every micro-batch, as DeepSpeed's; the optimizer steps at the boundary."""
        self.micro_steps += 1
        if self.micro_steps % self.accum:
            return
        if self.clip:   # the global norm over every rank's shards
            torch.nn.utils.clip_grad_norm_(self.module.parameters(), self.clip)
        self.optimizer.step()
        if self.scheduler:
            self.scheduler.step()
        self.optimizer.zero_grad()

    def _state(self) -> dict:
        model, optim = get_state_dict(self.module, self.optimizer)
        return {"model": model, "optim": optim, "scheduler": self.scheduler.state_dict() if self.scheduler else {},
                "steps": self.micro_steps // self.accum}

    def save_checkpoint(self, save_dir: str, tag: str, save_latest: bool = False) -> None:
        dcp.save(self._state(), checkpoint_id=Path(save_dir) / tag)

    def load_checkpoint(self, load_dir: str, tag: str) -> None:
        state = self._state()   # the shapes and placements this run wants; DCP fills them in place
        dcp.load(state, checkpoint_id=Path(load_dir) / tag)
        set_state_dict(self.module, self.optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
        if self.scheduler:
            self.scheduler.load_state_dict(state["scheduler"])
        self.micro_steps = state["steps"] * self.accum   # at another world size, another accumulation

    def load_universal_checkpoint(self) -> bool:
        return False   # DCP checkpoints load at any world size as they are
