"""The roofline model (Williams, Waterman and Patterson, "Roofline", CACM 2009): a kernel that does
F FLOPs while moving B bytes to and from GPU memory has arithmetic intensity I = F / B, and runs at
most at

    attainable = min(peak FLOP/s, I x memory bandwidth)

Left of the ridge (I < peak / bandwidth) memory bounds it, right of it compute does. Host-side and
pure; peaks and HBM bandwidths are plscale.predict.cluster's. Ignored: caches (a kernel that reuses
data from L2 or shared memory moves fewer bytes than counted here), launch overheads, and the
tensor cores' lower efficiency on small or oddly shaped tiles.
"""

from plscale.predict.cluster import GPU


def matmul_intensity(m: int, k: int, n: int, element_bytes: int = 2) -> float:
    """FLOPs per byte of an (m x k) @ (k x n) matmul that reads both inputs and writes its output
    once: 2mkn FLOPs over (mk + kn + mn) elements.

    >>> round(matmul_intensity(4096, 4096, 4096), 1), round(matmul_intensity(16, 4096, 4096), 1)
    (1365.3, 15.9)
    """
    return 2 * m * k * n / (element_bytes * (m * k + k * n + m * n))


def ridge(gpu: GPU, precision: str = "bf16") -> float:
    """The intensity (FLOPs per byte) where the GPU turns from memory-bound to compute-bound.

    >>> from plscale.predict.cluster import GPUS
    >>> round(ridge(GPUS["H100"]))
    295
    """
    return gpu.peak(precision) / _bandwidth(gpu)


def attainable_flops(gpu: GPU, intensity: float, precision: str = "bf16") -> float:
    """FLOP/s a kernel of this arithmetic intensity can reach: min(peak, intensity x HBM bandwidth).

    >>> from plscale.predict.cluster import GPUS
    >>> round(attainable_flops(GPUS["H100"], 1 / 6) / 1e12, 3), attainable_flops(GPUS["H100"], 1e4) / 1e12
    (0.558, 989.0)
    """
    return min(gpu.peak(precision), intensity * _bandwidth(gpu))


def _bandwidth(gpu: GPU) -> float:
    """HBM bytes per second."""
    if gpu.hbm_gbs <= 0:
        raise ValueError(f"{gpu.name}: no HBM bandwidth known (plscale.predict.cluster).")
    return gpu.hbm_gbs * 1e9
