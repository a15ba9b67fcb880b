"""The units and element sizes every prediction, lab and chart uses: one table, defined once.

    MiB, GiB   2^20 and 2^30 bytes: memory is reported in binary units, as torch's allocator
               and nvidia-smi report it
    BYTES      bytes of one element in each training precision (fp32 4, bf16 2, fp16 2)
"""

KiB = 2**10
MiB = 2**20
GiB = 2**30

BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}


def mib(nbytes: float) -> float:
    return nbytes / MiB


def gib(nbytes: float) -> float:
    return nbytes / GiB
