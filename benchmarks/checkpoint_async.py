"""What a checkpoint costs the training loop, four ways, on the same Llama: DeepSpeed's
synchronous save against plscale's asynchronous strategy, and PyTorch DCP's save against
its async_save.

    torchrun --nproc_per_node 2 benchmarks/checkpoint_async.py [--preset small] [--repeats 5] [--steps 3]

CPU only (DS_ACCELERATOR=cpu, gloo, no GPU used even where one is present). Two models of
the same preset and initial weights train side by side in every rank, on random tokens:
a ZeRO-2 DeepSpeed engine (plscale.dsconfig.spec, micro batch 2) and a plain torch copy in
DDP with torch.optim.AdamW (DCP does not speak the DeepSpeed engine). Paths:

  DeepSpeed sync   plscale.strategies.checkpoint.sealed.save: engine.save_checkpoint into .partial/,
                   each rank's RNG file, manifest of checksums, fsync, rename, `latest`.
  plscale async    plscale.strategies.checkpoint.asynchronous.Async(every=1): the same files
                   written to /dev/shm (the stall), then copied, checksummed, fsynced and
                   sealed by a background thread per rank while training goes on.
  DCP sync         get_state_dict(ddp, opt) + dcp.save({model, optim}).
  DCP async        get_state_dict + dcp.async_save(THREAD) on a gloo group of its own (its
                   background collectives must not interleave with DDP's on the default one).

Per save: STALL is how long the training thread was blocked (the slowest rank; for the DCP
paths get_state_dict is included), DURABLE is from the start of the save until the
checkpoint is complete and flushed (the slowest rank), MiB what it wrote (DeepSpeed
writes the fp32 weights twice, in the model file and as the optimizer's fp32 partitions;
DCP writes the tied embedding twice, once per state-dict key: 81 and 69 MiB at 'small'). DCP's
FileSystemWriter fsyncs every file it writes and .metadata, but no directory: the
benchmark fsyncs the checkpoint folder and its parent when DCP is done (counted in DURABLE,
and for DCP sync in the stall), as plscale's commit fsyncs its folder. Each turn of a path:
--steps training steps, the save, --steps steps more (the background write of the async
paths overlaps them), then wait until durable; "steps x" is the step time after the save
over the step time before it (what the background write costs training on 2 shared cores).
Each save is durable before the next path's turn, so an async stall here is the snapshot
alone (never the wait for a previous, unfinished write). The paths take turns in rotated
order, one unrecorded warm-up round first, then --repeats rounds; medians are printed.
Every file goes into temporary folders (--dir, default the system's, and /dev/shm for the
snapshots), removed at the end. Times vary by 10-30% between runs on a shared 2-core box;
compare the paths within one run.
"""

import os

os.environ["DS_ACCELERATOR"] = "cpu"  # before torch and DeepSpeed look for an accelerator
os.environ["CUDA_VISIBLE_DEVICES"] = ""

import argparse  # noqa: E402
import logging  # noqa: E402
import math  # noqa: E402
import shutil  # noqa: E402
import statistics  # noqa: E402
import tempfile  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
import warnings  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.distributed.checkpoint as dcp  # noqa: E402
from torch.distributed.checkpoint.state_dict import get_state_dict  # noqa: E402
from torch.distributed.checkpoint.state_dict_saver import AsyncCheckpointerType  # noqa: E402
from torch.nn.parallel import DistributedDataParallel  # noqa: E402

from plscale.ckpt import store  # noqa: E402
from plscale.dsconfig.spec import DSSpec, build  # noqa: E402
from plscale.predict.presets import preset  # noqa: E402
from plscale.rank import distributed  # noqa: E402
from plscale.strategies.checkpoint import sealed  # noqa: E402
from plscale.strategies.checkpoint.asynchronous import Async  # noqa: E402
from plscale.rank.models.llama import Llama  # noqa: E402

PATHS = ("DeepSpeed sync", "plscale async", "DCP sync", "DCP async")
MICRO = 2


def fsync_dir(folder: Path) -> None:
    for p in (folder, folder.parent):
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


class Turn:
    """One save in flight: its stall now, its durable time and bytes once `wait` returns."""

    def __init__(self, stall_s: float, wait):
        self.stall_s, self._wait = stall_s, wait

    def wait(self) -> tuple[float, int]:
        return self._wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--preset", default="small")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--steps", type=int, default=3, help="training steps before and after each save")
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--dir", default=None, help="where the checkpoints go (a temporary folder inside it)")
    args = parser.parse_args()
    warnings.filterwarnings("ignore", message=r".*torch\.distributed\.(all_gather_into_tensor|reduce_op)`? is deprecated")
    for name in ("DeepSpeed", "deepspeed"):
        logging.getLogger(name).setLevel(logging.WARNING)

    d = distributed.init()
    rank, world = d.rank, d.world_size
    config = preset(args.preset)
    seq = min(args.seq, config.max_seq)
    gen = torch.Generator().manual_seed(1000 + rank)

    def batch():
        block = torch.randint(0, config.vocab, (MICRO, seq + 1), generator=gen)
        return block[:, :-1], block[:, 1:]

    torch.manual_seed(0)
    model = Llama(config)
    engine, *_ = deepspeed_initialize(model, DSSpec(stage=2, micro_batch=MICRO, world_size=world,
                                                    bucket_size=500_000))
    torch.manual_seed(0)
    plain = Llama(config)
    ddp = DistributedDataParallel(plain)
    opt = torch.optim.AdamW(plain.parameters(), lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)

    def ds_step():
        x, y = batch()
        loss = engine(x, y)
        engine.backward(loss)
        engine.step()

    def ddp_step():
        x, y = batch()
        opt.zero_grad(set_to_none=True)
        ddp(x, y).backward()
        torch.nn.utils.clip_grad_norm_(plain.parameters(), 1.0)  # as the DeepSpeed config (gradient_clipping 1.0)
        opt.step()

    dirs = [tempfile.mkdtemp(prefix="ckpt-bench-", dir=args.dir), tempfile.mkdtemp(prefix="ckpt-bench-", dir="/dev/shm")] \
        if rank == 0 else [None, None]
    dist.broadcast_object_list(dirs, src=0)
    root, scratch = Path(dirs[0]), Path(dirs[1])
    meta = {"model": args.preset, "world_size": world}
    dcp_group = dist.new_group(backend="gloo")  # DCP async's collectives run beside DDP's
    strategy = Async(engine, root / "async", scratch / "async", every=1, meta=meta)

    def ds_sync(step: int) -> Turn:
        saved = sealed.save(engine, root / "ds-sync", step, meta)
        return Turn(saved.stall_s, lambda: (saved.durable_s, saved.bytes))

    def pl_async(step: int) -> Turn:
        saved = strategy.after_step(step)

        def wait():
            strategy.finish()
            return saved.durable_s, saved.bytes  # durable_s: NaN on ranks other than 0 (rank 0 seals)
        return Turn(saved.stall_s, wait)

    def dcp_sync(step: int) -> Turn:
        folder = root / "dcp-sync" / store.tag_of(step)
        t0 = time.perf_counter()
        model_sd, optim_sd = get_state_dict(ddp, opt)
        dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=folder)
        if rank == 0:
            fsync_dir(folder)
        took = time.perf_counter() - t0
        return Turn(took, lambda: (took, folder_bytes(folder)))

    def dcp_async(step: int) -> Turn:
        folder = root / "dcp-async" / store.tag_of(step)
        t0 = time.perf_counter()
        model_sd, optim_sd = get_state_dict(ddp, opt)
        response = dcp.async_save({"model": model_sd, "optim": optim_sd}, checkpoint_id=folder,
                                  process_group=dcp_group, async_checkpointer_type=AsyncCheckpointerType.THREAD)
        stall = time.perf_counter() - t0
        future = getattr(response, "upload_completion", response)  # AsyncSaveResponse in newer torch
        done, durable = threading.Event(), {}

        def on_done(f):  # in DCP's writer thread, when the last file and .metadata are written
            try:
                if f.exception() is None and rank == 0:
                    fsync_dir(folder)
            finally:
                durable["s"] = time.perf_counter() - t0
                done.set()
        future.add_done_callback(on_done)

        def wait():
            future.result()  # raises what the writer raised
            done.wait()      # result() can return before the callback has run
            return durable["s"], folder_bytes(folder)
        return Turn(stall, wait)

    saves = {"DeepSpeed sync": (ds_sync, ds_step), "plscale async": (pl_async, ds_step),
             "DCP sync": (dcp_sync, ddp_step), "DCP async": (dcp_async, ddp_step)}
    rows = {name: [] for name in PATHS}
    failed = {}
    step = 0
    try:
        for _ in range(args.steps):  # optimizer states exist before the first save
            ds_step()
            ddp_step()
        for r in range(args.repeats + 1):  # round 0: warm-up, not recorded
            order = PATHS[r % len(PATHS):] + PATHS[:r % len(PATHS)]
            for name in order:
                if name in failed:
                    continue
                save, train = saves[name]
                step += 1
                t0 = time.perf_counter()
                for _ in range(args.steps):
                    train()
                before = (time.perf_counter() - t0) / args.steps
                try:
                    turn = save(step)
                    t0 = time.perf_counter()
                    for _ in range(args.steps):
                        train()
                    during = (time.perf_counter() - t0) / args.steps
                    durable_s, nbytes = turn.wait()
                except Exception as exc:  # report exactly what fails on CPU; the other paths go on
                    failed[name] = f"{type(exc).__name__}: {exc}"
                    dist.barrier()
                    continue
                housekeeping(rank, root, name)
                figures = torch.tensor([turn.stall_s, -math.inf if math.isnan(durable_s) else durable_s,
                                        during / before], dtype=torch.float64)
                dist.all_reduce(figures, op=dist.ReduceOp.MAX)  # the slowest rank
                if r:
                    rows[name].append((*figures.tolist(), nbytes))
        if rank == 0:
            report(args, config, rows, failed, world)
    finally:
        dist.barrier()
        if rank == 0:
            shutil.rmtree(root, ignore_errors=True)
            shutil.rmtree(scratch, ignore_errors=True)
        distributed.shutdown()


def deepspeed_initialize(model, spec: DSSpec):
    import deepspeed

    return deepspeed.initialize(model=model, model_parameters=model.parameters(), config=build(spec))


def folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in Path(folder).rglob("*") if p.is_file())


def housekeeping(rank: int, root: Path, name: str) -> None:
    """Keep the disk tidy between turns (not timed): only the newest checkpoint of each path."""
    if rank == 0:
        if name in ("DeepSpeed sync", "plscale async"):
            store.prune(root / ("ds-sync" if name == "DeepSpeed sync" else "async"), 1)
        else:
            folders = sorted((root / ("dcp-sync" if name == "DCP sync" else "dcp-async")).iterdir())
            for old in folders[:-1]:
                shutil.rmtree(old, ignore_errors=True)
    dist.barrier()


def report(args, config, rows: dict, failed: dict, world: int) -> None:
    med = {name: tuple(statistics.median(col) for col in zip(*got)) for name, got in rows.items() if got}
    params = sum(p.numel() for p in Llama(config).parameters())
    print(f"\nCheckpoint cost, '{args.preset}' Llama ({params / 1e6:.2f} M parameters, fp32, AdamW), "
          f"{world} CPU ranks (gloo), medians of {args.repeats} saves per path, {args.steps} training steps "
          f"before and after each save:")
    print(f"  {'path':16}{'stall ms':>10}{'durable ms':>12}{'MiB':>8}{'stall / DS sync':>17}{'steps x':>9}")
    base = med.get("DeepSpeed sync", (math.nan,))[0]
    for name in PATHS:
        if name in failed:
            print(f"  {name:16}FAILED: {failed[name]}")
            continue
        stall, durable, slow, nbytes = med[name]
        print(f"  {name:16}{1e3 * stall:10.0f}{1e3 * durable:12.0f}{nbytes / 2**20:8.1f}{stall / base:17.3f}"
              f"{slow:9.2f}")
    print("  stall: the training thread blocked (slowest rank); durable: from the start of the save until "
          "complete and fsynced;\n  steps x: step time during the write over the step time before the save.")
    for name in PATHS:
        if rows[name]:
            print(f"  {name:16}stall ms per save: " + ", ".join(f"{1e3 * row[0]:.0f}" for row in rows[name]))

    def ratio(a: str, b: str) -> str:
        return f"{med[a][0] / med[b][0]:.3f} ({med[b][0] / med[a][0]:.1f}x shorter)" if a in med and b in med \
            else "n/a (a path failed)"
    print(f"\nplscale async stall / DeepSpeed sync stall = {ratio('plscale async', 'DeepSpeed sync')}; "
          f"DCP async stall / DCP sync stall = {ratio('DCP async', 'DCP sync')} "
          f"(the published DCP figure, on GPUs: about 20x shorter)")


if __name__ == "__main__":
    main()
