"""Real checkpoints for the checkpoint CLI's tests: a 2-rank DeepSpeed run of the `tiny`
model that saves through plscale.strategies.checkpoint.sealed (manifests and all).

    OMP_NUM_THREADS=1 torchrun --standalone --nproc_per_node 2 tests/helpers/save_checkpoints.py OUT 2 0

For each ZeRO stage given, OUT/stage<S>/ is a checkpoint root with step000002 and
step000004, and OUT/stage<S>-reference/step00000N.pt holds the model's state dict as the
live engine had it at that step (gathered at stage 3): what a conversion must give back.
The stage `fsdp2` is the same model sharded by FSDP2 and saved by torch.distributed.checkpoint
(plscale.strategies.checkpoint.dcp), its reference every DTensor gathered whole.

    torchrun --standalone --nproc_per_node 1 tests/helpers/save_checkpoints.py --load-universal ROOT STAGE REF

loads the universal checkpoint ROOT on this many ranks through sealed.restore and prints one
JSON line: the step restored, the largest difference from the state dict in REF, and the
loss of one more step (the optimizer state loaded too).
"""

import json
import os
import sys
from pathlib import Path

os.environ.setdefault("DS_ACCELERATOR", "cpu")

import torch

from plscale.rank import distributed

SAVE_AT = (2, 4)
MICRO_BATCH, SEQ = 2, 32


def engine_for(stage, world_size: int, load_universal: bool = False):
    import deepspeed

    from plscale.dsconfig.spec import DSSpec, build
    from plscale.predict.presets import preset
    from plscale.rank.models.llama import Llama

    torch.manual_seed(0)
    model = Llama(preset("tiny"))
    spec = DSSpec(stage=0 if stage == "fsdp2" else stage, micro_batch=MICRO_BATCH, world_size=world_size,
                  bucket_size=200_000, load_universal=load_universal)
    if stage == "fsdp2":
        from torch.distributed.device_mesh import init_device_mesh

        from plscale.strategies.checkpoint import dcp

        return dcp.Engine(model, build(spec), init_device_mesh("cpu", (world_size,)))
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=build(spec))
    return engine


def train_step(engine) -> float:
    tokens = torch.randint(0, engine.module.config.vocab, (MICRO_BATCH, SEQ + 1))
    loss = engine(tokens[:, :-1], tokens[:, 1:])
    engine.backward(loss)
    engine.step()
    return loss.item()


def full_state(engine, stage) -> dict:
    """name -> tensor of the whole model, cloned (stage 3 gathers the partitions first, FSDP2 each DTensor)."""
    import deepspeed

    if stage == "fsdp2":
        return {k: v.full_tensor().clone() for k, v in engine.module.state_dict().items()}

    params = list(engine.module.parameters()) if stage == 3 else []
    with deepspeed.zero.GatheredParameters(params, enabled=stage == 3):
        return {k: v.detach().clone() for k, v in engine.module.state_dict().items()}


def save(out: Path, stage, rank: int) -> None:
    from plscale.strategies.checkpoint import sealed

    engine = engine_for(stage, world_size=2)
    root, reference = out / f"stage{stage}", out / f"stage{stage}-reference"
    meta = {"world_size": 2, "stage": stage, "precision": "fp32", "lab": "tests", "strategy": "basic",
            "model": {"preset": "tiny"}}
    for step in range(1, max(SAVE_AT) + 1):
        train_step(engine)
        if step in SAVE_AT:
            sealed.save(engine, root, step, meta)
            state = full_state(engine, stage)
            if rank == 0:
                reference.mkdir(parents=True, exist_ok=True)
                torch.save(state, reference / f"step{step:06d}.pt")
    if stage != "fsdp2":
        engine.destroy()


def load_universal(root: Path, stage: int, reference: Path, d) -> None:
    from plscale.strategies.checkpoint import sealed

    engine = engine_for(stage, world_size=d.world_size, load_universal=True)
    restored = sealed.restore(engine, [root], root.parent / "scratch")  # scratch: only for deltas
    state, want = full_state(engine, stage), torch.load(reference)
    diff = max((state[k] - want[k]).abs().max().item() for k in want)
    loss = train_step(engine)
    if d.rank == 0:
        print(json.dumps({"step": restored.step, "tag": restored.tag, "max_diff": diff, "keys": sorted(state) ==
                          sorted(want), "next_loss": loss}), flush=True)


def main() -> None:
    d = distributed.init()
    if sys.argv[1] == "--load-universal":
        load_universal(Path(sys.argv[2]), int(sys.argv[3]), Path(sys.argv[4]), d)
    else:
        for stage in (a if a == "fsdp2" else int(a) for a in sys.argv[2:]):
            save(Path(sys.argv[1]), stage, d.rank)
    distributed.shutdown()


if __name__ == "__main__":
    main()
