"""A smaller accelerator on purpose: a limit on what a rank may allocate from now on (lab 12's oom runs).

    budget = memory_limit.impose(device, mib)   # from here on the rank may allocate `mib` MiB more
    budget.used_mib()                           # what it holds above the level the limit was taken at
    with budget.lifted(): ...                   # the limit off for a while (a profiler's own buffers)
    budget.host_zeros(t)                        # a tensor in host memory, which the limit does not count
    budget.release()                            # off for good, before the run reports

Past the limit the allocator refuses, with the message a full device gives:

    GPU  torch.cuda.set_per_process_memory_fraction: the caching allocator stops at what it has
         reserved now plus the budget ("CUDA out of memory. Tried to allocate ..."). Not yet run
         on a GPU in this kit.
    CPU  the process's data limit, RLIMIT_DATA (what `ulimit -d` sets; every private writable
         mapping counts, on Linux 4.7 and later), at the rank's data size now plus the budget:
         torch's CPU allocator fails with "DefaultCPUAllocator: can't allocate memory: you tried
         to allocate N bytes" (Python's own allocations with MemoryError). glibc only (mallopt).

Offloading needs a host beside the device. On a GPU it is the CPU's memory (pinned, for fast
copies). A CPU rank's device and host are one memory, so host_zeros puts the host's tensors in an
anonymous shared mapping (mmap MAP_SHARED): real memory, which RLIMIT_DATA does not count, as a
GPU's limit does not count the host's.

On CPU the data size counts more than tensors unless two things are settled first, which
impose() does (measured on 2 CPU ranks, torch 2.13):
  - glibc's malloc raises its mmap threshold each time a large block is freed, so later blocks of
    that size come from its heap, which keeps freed memory: up to 100 MiB more on lab 12's
    Llama. A fixed threshold (mallopt M_MMAP_THRESHOLD, 64 KiB) hands every large block back to
    the system when it is freed, as the CUDA allocator's own accounting would count it.
  - the first optimizer a process builds imports torch._dynamo: 69 MiB of Python's own data. It is
    imported before the level is read, as a real run has it before it trains.
"""

import ctypes
import mmap
import resource
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from plscale.predict.units import MiB

M_MMAP_THRESHOLD = -3     # glibc's mallopt parameter (malloc.h)
MMAP_THRESHOLD = 64 * 1024


def data_bytes() -> int:
    """The process's private writable memory now: VmData of /proc/self/status, what RLIMIT_DATA caps."""
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmData:"))


@dataclass
class Budget:
    device: torch.device
    mib: float
    level: int        # bytes held when the limit was taken
    before: int = resource.RLIM_INFINITY   # CPU: the soft data limit before, which release() restores

    def used_mib(self) -> float:
        """What the rank holds now above the level the limit was taken at."""
        now = torch.cuda.memory_reserved(self.device) if self.device.type == "cuda" else data_bytes()
        return (now - self.level) / MiB

    def host_zeros(self, like: torch.Tensor) -> torch.Tensor:
        """Zeros shaped like `like` in host memory, outside the limit (module doc)."""
        if self.device.type == "cuda":
            return torch.zeros(like.shape, dtype=like.dtype, pin_memory=True)
        shared = mmap.mmap(-1, max(1, like.numel() * like.element_size()))   # anonymous, MAP_SHARED, zeroed
        return torch.frombuffer(shared, dtype=like.dtype, count=like.numel()).view(like.shape)

    def release(self) -> None:
        """The limit off from now on: as it was before impose()."""
        if self.device.type == "cuda":
            torch.cuda.set_per_process_memory_fraction(1.0, self.device)
        else:
            resource.setrlimit(resource.RLIMIT_DATA, (self.before, resource.getrlimit(resource.RLIMIT_DATA)[1]))

    @contextmanager
    def lifted(self):
        """No limit inside the block, the same one after it."""
        self.release()
        try:
            yield
        finally:
            _cap(self.device, self.level + int(self.mib * MiB))


def impose(device: torch.device, mib: float) -> Budget:
    """Let the rank allocate at most `mib` MiB more than it holds now."""
    import torch._dynamo  # noqa: F401  (the optimizer would import it under the limit: see above)

    if device.type == "cuda":
        x = torch.ones(64, 64, device=device)
        (x @ x).sum().item()   # cuBLAS's handle and workspace, made lazily by the first matmul: before the limit
        level = torch.cuda.memory_reserved(device)   # the fraction caps what the caching allocator reserves
    else:
        if ctypes.CDLL(None).mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) != 1:
            raise RuntimeError("glibc's mallopt refused a fixed mmap threshold: the limit would count freed memory")
        level = data_bytes()
    before = resource.getrlimit(resource.RLIMIT_DATA)[0]
    _cap(device, level + int(mib * MiB))
    return Budget(device, mib, level, before)


def _cap(device: torch.device, most: int) -> None:
    """At most `most` bytes: reserved by the CUDA caching allocator, or of the process's data."""
    if device.type == "cuda":
        total = torch.cuda.get_device_properties(device).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, most / total), device)
        return
    hard = resource.getrlimit(resource.RLIMIT_DATA)[1]
    if hard != resource.RLIM_INFINITY and most > hard:
        raise RuntimeError(f"the hard data limit (ulimit -d) is {hard / MiB:.0f} MiB, below the {most / MiB:.0f} "
                           f"MiB asked: lower the budget, or raise the hard limit")
    resource.setrlimit(resource.RLIMIT_DATA, (most, hard))
