"""The first test on a new cluster: every rank joins the process group, all-reduces and
all-gathers a small tensor, times one 16 MiB all-reduce, and says who and where it is.

    plscale doctor --distributed --gpus 8                  (launches this and reports)
    torchrun --nproc_per_node 8 -m plscale.rank.sanity --out /tmp/sanity

Each rank rewrites <out>/rank_<r>.json after every stage, so that when a collective never
returns the host can still name the rank that stopped first. PLSCALE_SANITY_HANG_RANK=r
makes rank r hang after joining, to see what such a report looks like.
"""

import argparse
import json
import os
import platform
import socket
import sys
import time
from datetime import timedelta
from pathlib import Path

STAGES = ("started", "joined", "all_reduce", "all_gather", "done")  # each: the last one completed
BENCH_BYTES = 16 * 2**20


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True, help="folder for rank_<r>.json")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds before a collective gives up")
    args = parser.parse_args()
    rank, local_rank = int(os.environ.get("RANK", 0)), int(os.environ.get("LOCAL_RANK", 0))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    status = {"rank": rank, "local_rank": local_rank, "host": socket.gethostname(), "pid": os.getpid()}

    def write(**fields) -> None:
        status.update(seconds=round(time.time() - t0, 3), **fields)
        tmp = out / f".rank_{rank}.json"
        tmp.write_text(json.dumps(status))
        tmp.replace(out / f"rank_{rank}.json")

    def reached(stage: str, **fields) -> None:
        write(stage=stage, waiting_in=None, **fields)

    def entering(collective: str) -> None:  # a rank stuck here is waiting for another one
        write(waiting_in=collective)

    t0 = time.time()
    reached("started")
    import torch  # after the first word: a rank whose torch import hangs is seen too
    import torch.distributed as dist

    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
        name = torch.cuda.get_device_name(local_rank)
    else:
        device, name = torch.device("cpu"), platform.processor() or platform.machine()
    backend = "nccl" if cuda else "gloo"
    try:
        entering("init_process_group")
        dist.init_process_group(backend, timeout=timedelta(seconds=args.timeout))
        n = dist.get_world_size()
        reached("joined", backend=backend, device=str(device), device_name=name, world_size=n)
        if os.environ.get("PLSCALE_SANITY_HANG_RANK") == str(rank):
            time.sleep(10**6)

        x = torch.tensor([rank + 1.0], device=device)
        entering("all_reduce")
        dist.all_reduce(x)
        reached("all_reduce", all_reduce=x.item() == n * (n + 1) / 2)

        ids = torch.empty(n, device=device)
        from plscale.rank.distributed import all_gather_single as all_gather
        entering("all_gather")
        all_gather(ids, torch.tensor([float(rank)], device=device))
        reached("all_gather", all_gather=ids.tolist() == list(map(float, range(n))))

        big = torch.ones(BENCH_BYTES // 4, device=device)
        entering("all_reduce 16 MiB")
        dist.all_reduce(big)  # warm-up
        if cuda:
            torch.cuda.synchronize()
        dist.barrier()
        start = time.perf_counter()
        for _ in range(5):
            dist.all_reduce(big)
        if cuda:
            torch.cuda.synchronize()
        seconds = (time.perf_counter() - start) / 5
        busbw = BENCH_BYTES / seconds / 1e9 * 2 * (n - 1) / n
        reached("done", busbw_gbps=round(busbw, 3), bench_bytes=BENCH_BYTES)
        dist.destroy_process_group()
        sys.stdout.flush()
        os._exit(0)  # skip interpreter teardown, which has aborted comm libraries at exit (see runtime.finish)
    except Exception as exc:  # a timeout in a collective, a refused connection: say so, then fail
        write(error=f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}")
        raise


if __name__ == "__main__":
    main()
