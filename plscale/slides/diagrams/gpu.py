"""Diagrams of deck 02, IT and GPU fundamentals (slides/02_gpu_fundamentals).

NVLink, network and HBM bandwidths, peak FLOP/s and memory come from plscale.predict.cluster; collective
times from plscale.predict.step_time, the roofline from plscale.predict.roofline. What the cluster model
lacks (PCIe, caches, SM counts, host memory) is literature, its source in a comment here and on the slide.
"""

from pathlib import Path

from plscale.predict.cluster import GPUS
from plscale.predict.memory import BYTES
from plscale.predict.presets import param_count, preset
from plscale.predict.roofline import attainable_flops, matmul_intensity, ridge
from plscale.predict.step_time import collective_seconds, link
from plscale.slides.diagrams.style import (BLUE, GREEN, GREY, NAVY, RED, SAND, SKY, arrow, box, canvas, figure, rect,
                                           save)

H100, A100 = GPUS["H100"], GPUS["A100"]
HBM = [("H200 HBM3e", GPUS["H200"]), ("H100 HBM3", H100), ("A100 HBM2e", A100)]   # bandwidths: cluster.py
# Literature, the NVIDIA H100 architecture whitepaper (2022): H100 SXM5's 132 SMs, 50 MB of L2, 256 KB of
# registers and 256 KB of L1/shared memory per SM.
PCIE5_GBS = 64  # PCIe Gen5 x16, each way (32 GT/s x 16 lanes, PCI-SIG)
H100_SMS = 132
TENSOR_CORES_PER_SM = 4  # fourth-generation tensor cores per H100 SM (NVIDIA H100 architecture whitepaper)
DGX_HOST_MEMORY = "2 TB"  # DGX H100's system memory (NVIDIA DGX H100 user guide)


def cpu_vs_gpu(out: Path) -> Path:
    """A CPU: a few big cores and a big cache; a GPU: many small SMs around a shared L2 and HBM."""
    fig, ax = canvas(11, 4.3, ylim=(0.25, 4.55))
    ax.text(2.4, 4.35, "CPU: a few big cores", ha="center", fontsize=15, weight="bold", color=NAVY)
    box(ax, 0.3, 0.9, 4.2, 3.1, color="#f4f1ea")
    for i in range(8):
        box(ax, 0.5 + (i % 4) * 1.0, 2.75 - (i // 4) * 0.95, 0.85, 0.8, "core", color=SAND, size=12)
    box(ax, 0.5, 1.05, 3.85, 0.65, "big caches (L3)", color=SKY, size=12)
    ax.text(2.4, 0.45, "fast on branchy, serial code; DDR5 memory", ha="center", fontsize=12)
    ax.text(8.1, 4.35, "GPU: many small cores (SMs)", ha="center", fontsize=15, weight="bold", color=NAVY)
    box(ax, 5.6, 0.9, 5.0, 3.1, color="#f4f1ea")
    cols, rows = 12, 11
    for k in range(H100_SMS):
        r, c = divmod(k, cols)
        y = 3.62 - r * 0.21 - (0.45 if r > rows // 2 else 0)
        rect(ax, 6.35 + c * 0.29, y, 0.25, 0.15, GREEN, edge=NAVY, lw=0.5)
    box(ax, 6.35, 2.18, 3.45, 0.32, "L2 cache", color=SKY, size=11)
    for side in (5.7, 9.95):
        for j in range(3):
            box(ax, side, 1.05 + j * 0.95, 0.55, 0.8, "HBM", color=BLUE, text_color="white", size=10)
    ax.text(8.1, 0.45, f"{H100_SMS} SMs in an H100, each with {TENSOR_CORES_PER_SM} tensor cores; HBM memory",
            ha="center", fontsize=12)
    return save(fig, out, "cpu_vs_gpu.png")


def memory_hierarchy(out: Path) -> Path:
    """From registers to host memory: each level larger and slower (H100 SXM5, DGX H100)."""
    fig, ax = canvas(11, 4.8, ylim=(0, 4.8))
    levels = [("registers", "256 KB per SM", "on the SM", NAVY),
              ("L1 / shared memory", "256 KB per SM", "on the SM", BLUE),
              ("L2 cache", "50 MB per GPU", "on the chip", GREEN),
              ("HBM3 (GPU memory)", f"{H100.memory / 2**30:.0f} GiB per GPU", f"{H100.hbm_gbs:,.0f} GB/s", SAND),
              ("host DRAM (CPU memory)", f"{DGX_HOST_MEMORY} per node", f"{PCIE5_GBS} GB/s each way\nover PCIe", RED)]
    ax.text(1.2, 4.55, "where / bandwidth", ha="center", fontsize=13, weight="bold", color=NAVY)
    ax.text(9.7, 4.55, "capacity", ha="center", fontsize=13, weight="bold", color=NAVY)
    for i, (name, size, speed, color) in enumerate(levels):
        w = 2.2 + i * 1.0
        y = 3.7 - i * 0.82
        box(ax, 5.5 - w / 2, y, w, 0.66, name, color=color, text_color="white" if color in (NAVY, BLUE, RED)
            else "black", size=13, weight="bold")
        ax.text(1.2, y + 0.33, speed, ha="center", va="center", fontsize=12)
        ax.text(9.7, y + 0.33, size, ha="center", va="center", fontsize=12)
    arrow(ax, (10.85, 4.3), (10.85, 0.3), color=GREY)
    ax.text(10.8, 0.12, "larger, slower", ha="right", fontsize=11, color=GREY)
    return save(fig, out, "memory_hierarchy.png")


def node(out: Path) -> Path:
    """An 8-GPU node (DGX/HGX H100): NVSwitch joins every GPU; PCIe switches join GPUs, NICs, CPUs."""
    fig, ax = canvas(11, 5)
    box(ax, 0.3, 4.3, 8.0, 0.5, "NVSwitch: every GPU to every GPU", color=GREEN, text_color="white", size=13,
        weight="bold")
    ax.plot([0.5, 8.7], [2.27, 2.27], color=SAND, lw=2, zorder=0)
    for i in range(8):
        x = 0.3 + i * 1.0
        box(ax, x + 0.05, 3.1, 0.9, 0.7, f"GPU {i}", color=BLUE, text_color="white", size=12)
        ax.plot([x + 0.5] * 2, [3.8, 4.3], color=GREEN, lw=4)
        ax.plot([x + 0.5] * 2, [2.5, 3.1], color=SAND, lw=2)
        box(ax, x + 0.1, 1.05, 0.8, 0.45, "NIC", color=RED, text_color="white", size=11)
        ax.plot([x + 0.5] * 2, [1.5, 2.05], color=SAND, lw=2)
        ax.plot([x + 0.5] * 2, [0.45, 1.05], color=RED, lw=2, ls=":")
    for j in range(4):
        box(ax, 0.4 + j * 2.0, 2.05, 1.8, 0.45, "PCIe switch", color=SAND, size=12)
    box(ax, 0.3, 0.05, 8.0, 0.4, "cluster network (InfiniBand or Ethernet)", color="#f4f1ea", size=12)
    ax.plot([8.7, 8.7], [1.45, 3.1], color=SAND, lw=2, zorder=0)
    for k, y in enumerate((2.85, 1.2)):
        box(ax, 8.8, y, 2.0, 0.5, f"CPU {k} + DRAM", color="#f4f1ea", size=12)
    notes = [(4.45, f"NVLink: {H100.intra_gbs:.0f} GB/s\neach way a GPU", GREEN),
             (2.27, f"PCIe Gen5 x16:\n{PCIE5_GBS} GB/s each way", "#8a5a14"),
             (0.6, f"a NIC a GPU: {H100.inter_gbs * 8:.0f} Gb/s\n= {H100.inter_gbs:.0f} GB/s each way", RED)]
    for y, text, color in notes:
        ax.text(9.8, y, text, ha="center", va="center", fontsize=12, color=color, weight="bold")
    return save(fig, out, "node.png")


def cluster(out: Path) -> Path:
    """Nodes joined by a rail-optimised fat tree: NIC i of every node on leaf switch i."""
    fig, ax = canvas(11, 4.6, ylim=(0.1, 4.85))
    rails = [BLUE, SAND, GREEN, RED, NAVY, SKY, "#9b5de5", GREY]
    spines = [2.3 + k * 2.2 for k in range(4)]
    leaves = [0.7 + i * 1.3 for i in range(8)]
    for sx in spines:
        box(ax, sx - 0.55, 3.9, 1.1, 0.45, "spine", color="#d8e2ea", size=11)
        for lx in leaves:
            ax.plot([sx, lx], [3.9, 2.95], color=GREY, lw=0.6, alpha=0.6)
    for i, lx in enumerate(leaves):
        box(ax, lx - 0.5, 2.5, 1.0, 0.45, f"leaf {i}", color=rails[i], text_color="black" if rails[i] in (SAND, SKY) else "white", size=11)
    for n in range(4):
        nx = 0.35 + n * 2.65
        box(ax, nx, 0.25, 2.35, 1.1, "", color="#f4f1ea")
        ax.text(nx + 1.17, 0.45, f"node {n}: 8 GPUs on NVLink", ha="center", fontsize=11)
        for i in range(8):
            cx = nx + 0.12 + i * 0.28
            box(ax, cx, 0.85, 0.22, 0.3, "", color=rails[i], edge=rails[i])
            ax.plot([cx + 0.11, leaves[i]], [1.15, 2.5], color=rails[i], lw=0.9, alpha=0.8)
    ax.text(5.5, 4.55, "rail-optimised: NIC i of every node goes to leaf switch i", ha="center", fontsize=13,
            color=NAVY, weight="bold")
    return save(fig, out, "cluster.png")


def bandwidth_ladder(out: Path) -> Path:
    """Bandwidths from GPU memory down to the network, one direction, log scale."""
    rows = [(name, gpu.hbm_gbs, BLUE, "memory") for name, gpu in HBM]
    rows += [("H100 NVLink 4", H100.intra_gbs, GREEN, "NVLink"), ("A100 NVLink 3", A100.intra_gbs, GREEN, "NVLink"),
             ("PCIe Gen5 x16", PCIE5_GBS, SAND, "PCIe"),
             ("InfiniBand NDR (400 Gb/s)", H100.inter_gbs, RED, "network"),
             ("InfiniBand HDR (200 Gb/s)", A100.inter_gbs, RED, "network")]
    fig, ax = figure(h=4.8)
    names = [r[0] for r in rows][::-1]
    values = [r[1] for r in rows][::-1]
    ax.barh(names, values, color=[r[2] for r in rows][::-1])
    for y, v in enumerate(values):
        ax.text(v * 1.08, y, f"{v:,.0f} GB/s", va="center", fontsize=13)
    ax.set_xscale("log")
    ax.set_xlim(10, 30000)
    ax.set_xlabel("GB/s per GPU, one direction (log scale)")
    ax.tick_params(axis="y", labelsize=13)
    for kind, color in (("GPU memory", BLUE), ("NVLink, GPU to GPU in a node", GREEN), ("PCIe, to CPU and NIC", SAND),
                        ("network, node to node", RED)):
        ax.barh([names[0]], [0], color=color, label=kind)
    ax.legend(loc="lower right", fontsize=12)
    return save(fig, out, "bandwidth_ladder.png")


def allreduce_time(out: Path) -> Path:
    """Seconds to all-reduce a 7B model's bf16 gradients, by where the GPUs sit."""
    nbytes = BYTES["bf16"] * param_count(preset("7b"))
    cases = [("8 GPUs, one node\n(NVLink)", 8, 1), ("64 GPUs, 8 nodes\n(8 NICs a node)", 64, 1),
             ("8 GPUs, 8 nodes\n(1 NIC a node)", 8, 8)]
    fig, ax = figure(h=4.6)
    width = 0.38
    for j, (gpu, color) in enumerate(((H100, BLUE), (A100, SAND))):
        secs = [collective_seconds("all_reduce", nbytes, n, link(gpu, n, stride)) for _, n, stride in cases]
        xs = [i + (j - 0.5) * width for i in range(len(cases))]
        ax.bar(xs, secs, width, color=color, label=gpu.name)
        for x, s in zip(xs, secs):
            ax.text(x, s + 0.02, f"{s:.2f} s", ha="center", va="bottom", fontsize=13)
    ax.set_xticks(range(len(cases)), [c[0] for c in cases], fontsize=13)
    ax.set_ylabel("seconds per all-reduce")
    ax.legend(fontsize=12, loc="upper left")
    ax.text(0.02, 0.74, f"{nbytes / 1e9:.1f} GB: a 7B model's bf16 gradients\nat the links' peak bandwidth",
            transform=ax.transAxes, fontsize=12, color=NAVY, va="top")
    return save(fig, out, "allreduce_time.png")


def roofline(out: Path) -> Path:
    """Attainable FLOP/s against arithmetic intensity: memory-bound left of the ridge, compute-bound right."""
    fig, ax = figure()
    xs = [10 ** (i / 20) for i in range(-30, 81)]
    for gpu, color in ((H100, BLUE), (A100, SAND)):
        ax.plot(xs, [attainable_flops(gpu, x) / 1e12 for x in xs], color=color, lw=3, label=f"{gpu.name}, bf16")
        edge = ridge(gpu)
        ax.axvline(edge, color=color, ls=":", lw=1.2)
        right = gpu is H100
        ax.text(edge * (1.12 if right else 0.9), 0.4, f"ridge:\n{edge:.0f} FLOP/byte", color=color, fontsize=12,
                ha="left" if right else "right")
    # (label, intensity, where the label goes): sizes are tokens x hidden @ hidden x hidden, bf16
    e = BYTES["bf16"]
    points = [(f"c = a + b (1 FLOP, {3 * e} bytes)", 1 / (3 * e), (0.22, 0.14)),
              ("matmul, 16 tokens x 4096", matmul_intensity(16, 4096, 4096, e), (22, 4)),
              ("matmul, 4096 tokens x 4096", matmul_intensity(4096, 4096, 4096, e), (420, 40))]
    for text, x, where in points:
        y = attainable_flops(H100, x) / 1e12
        ax.scatter([x], [y], s=90, color=RED, zorder=3)
        ax.annotate(f"{text}:\n{y:,.1f} TFLOP/s" if y < 10 else f"{text}:\n{y:,.0f} TFLOP/s", (x, y), xytext=where,
                    fontsize=12, arrowprops=dict(arrowstyle="-", color=RED, lw=1))
    ax.text(0.3, 300, "memory-bound", fontsize=14, color=GREY, weight="bold")
    ax.text(1100, 1400, "compute-bound", fontsize=14, color=GREY, weight="bold")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(0.05, 1e4)
    ax.set_ylim(0.1, 3000)
    ax.set_xlabel("arithmetic intensity (FLOPs per byte of memory traffic)")
    ax.set_ylabel("attainable TFLOP/s")
    ax.grid(alpha=0.3, which="major")
    ax.legend(loc="upper left", fontsize=12)
    return save(fig, out, "roofline.png")


def draw(out: Path) -> list[Path]:
    return [cpu_vs_gpu(out), memory_hierarchy(out), node(out), cluster(out), bandwidth_ladder(out),
            allreduce_time(out), roofline(out)]
