"""GPUs and clusters as the planner sees them: memory, dense peak FLOP/s, and two links.

Host-side and pure. Each GPU of a node talks to the others over NVLink (`intra_gbs`) and to
other nodes over its own network card (`inter_gbs`); both are per GPU, one direction, in GB/s
(10^9 bytes per second), the bandwidth a ring collective's bus bandwidth tends to (see
plscale.predict.busbw). Peak FLOP/s are dense (no 2:4 sparsity) bf16/fp16 tensor-core figures;
fp32 runs at the TF32 tensor-core peak. Memory is what `nvidia-smi` reports as the total.

Sources (datasheets as published by NVIDIA):
  H100 SXM5 80GB   989 TFLOP/s bf16 dense (1,979 with sparsity), 494 TF32; NVLink 4 900 GB/s
                   both directions (450 each way); DGX/HGX H100: 8 x ConnectX-7 400 Gb/s, one per
                   GPU (50 GB/s). nvidia-smi: 81,559 MiB. (Llama 3's cluster: also 400 Gb/s a GPU.)
  H200 SXM 141GB   the H100's compute and NVLink; 143,771 MiB; the same 400 Gb/s a GPU in HGX H200.
  H800 SXM5 80GB   the H100's compute and memory, its NVLink cut to 400 GB/s both ways (200 each);
                   400 Gb/s a GPU across nodes, as DeepSeek-V3's cluster (whose report measured 160
                   GB/s over NVLink and 50 GB/s over InfiniBand).
  B200 (HGX, 1,000 W)  2,250 TFLOP/s bf16 dense (4,500 with sparsity), 1,100 TF32; 180 GB HBM3e (the
                   datasheet's GB: no nvidia-smi figure read here), 8,000 GB/s at most; NVLink 5 1.8 TB/s
                   both ways (900 each); HGX B200: 8 x ConnectX-7 400 Gb/s.
  A100 SXM4 80GB   312 TFLOP/s bf16 dense, 156 TF32; NVLink 3 600 GB/s both ways (300 each);
                   DGX A100: 8 x ConnectX-6 200 Gb/s HDR (25 GB/s a GPU). 81,920 MiB.
  A100 SXM4 40GB   the same, 40,960 MiB.
  PCIe cards, the GPUs most rented pods have (no NVLink: the GPUs of a node talk over PCIe Gen4
  x16, 32 GB/s each way at most). Across nodes such pods rarely train; the planner assumes
  100 Gb/s Ethernet a node shared by its 8 GPUs (1.5 GB/s a GPU), an assumption, not a datasheet:
  give --inter-gbs for yours.
  L40S 48GB        362 TFLOP/s bf16 dense (733 with sparsity), 183 TF32; 864 GB/s GDDR6.
  A10 24GB         125 TFLOP/s bf16 dense (250 with sparsity), 62.5 TF32; 600 GB/s GDDR6.
  L4 24GB          121 TFLOP/s bf16 dense (242 with sparsity), 60 TF32; 300 GB/s GDDR6.
  RTX 4090 24GB    165 TFLOP/s bf16 dense with fp32 accumulation (the Ada whitepaper), 82.6 TF32;
                   1,008 GB/s GDDR6X.
  Their memory is the datasheet's GB in GiB less about 6 % for ECC and the driver, as nvidia-smi
  shows it (46,068 MiB on an L40S; 23,028, 23,034 and 24,564 MiB on the A10, L4 and 4090).
HBM bandwidth (`hbm_gbs`, GB/s, the datasheets' figures): H100 SXM5 3,350 (HBM3), H200 SXM 4,800
(HBM3e), A100 SXM4 80GB 2,039 (HBM2e), A100 SXM4 40GB 1,555 (HBM2). The roofline
(plscale.predict.roofline) uses it, and the planner's optimizer term (an elementwise AdamW reads
and writes each parameter's states once: step_time.ADAM_BYTES over this bandwidth).
Latency: a collective of N ranks pays a fixed latency a step besides its bytes (Hockney's alpha-beta
model). Steps: a ring's N-1 a phase, a tree's log2 N (an all-reduce has two phases); the planner
takes the fewer (plscale.predict.step_time.latency_steps): NCCL switches to tree, NVLS or PAT
algorithms at scale, whose latency grows as log N. Assumed, not measured: 1 us a step over NVLink
and 5 us across nodes, the order of nccl-tests' small-message times (e.g. an 8-GPU NVLink
all-reduce of a few KB in about 15 us). Bandwidth of a group that spans nodes: step_time.link
(k members on a node spread the rings over k network cards).
Matmuls (`sms`, `mamf`, read by plscale.predict.matmul): no GPU runs a GEMM at its datasheet peak.
`mamf` is the fraction the best large bf16 GEMM reaches, ml-engineering's Maximum Achievable Matmul
FLOPS table (stas00/ml-engineering, compute/accelerator/README.md, the mean of 100 iterations at the
best shape): A100 SXM 271.2 of 312 (0.869), H100 SXM 794.5 of 989 (0.803; "H200 is the same"),
B200 SXM 1,745 of 2,250 (0.776), A100 PCIe 252.9 (0.811). The H800 has the H100's SMs and clocks.
The PCIe cards without a row there (L40S, A10, L4, RTX 4090) take 0.75, an assumption, said so in
their source. SMs, from the datasheets: H100/H200/H800 SXM 132, A100 108, B200 148, L40S 142,
A10 72, L4 58, RTX 4090 128. fp8 (e4m3, dense, the datasheets): H100, H200 and H800 1,979 TFLOP/s,
B200 4,500, L40S 733, L4 242; the best fp8 GEMM in the same table: H100 1,402.6 (0.709), H200 1,453.4
(0.734), B200 3,432.5 (0.763); the H800 as the H100, L40S and L4 0.75 assumed. A100s, A10s and the
RTX 4090 (whose fp8 peak with fp32 accumulation the planner does not carry) have none here.
Flash attention (`flash`) runs below the GEMMs: FlashAttention-2 reaches 50-73 % of an A100's peak
(Dao 2023): 0.6; on an H100 it reaches 35 %, FlashAttention-3 up to 75 % forward and less backward
(Shah et al. 2024): 0.5, also taken for the other GPUs, an assumption.
Peak links are what the hardware offers; measured bus bandwidth (nccl-tests, `plscale bench
collectives`) is lower, often 70-85 % of it: give --intra-gbs and --inter-gbs to use yours.

This machine (`cpu_ranks`, `plscale plan --here`): N CPU processes over gloo, as the labs run
without a GPU, are N "GPUs" of one node whose figures are measured, not looked up
(plscale.run.machine): the FLOP/s a rank reaches on the model's own forward and backward while
all N run at once, and the fixed cost of a layer at no FLOPs (the dispatch of its operators,
which a tp or cp rank pays whole on its smaller matrices: on 8 ranks of 2 cores, at the tiny
preset, more of a layer's time than its FLOPs), gloo's all-reduce bus bandwidth and its latency
a ring step, and the memory available over N; gloo's reduce-scatter and all-gather at their own
bus bandwidth (gloo does not run them at the all-reduce's rate: on 8 ranks of 2 cores its
reduce-scatter was 6x slower), a point-to-point hop's latency (isend/irecv, as ring attention
and the pipeline send), and AdamW's step a parameter. When the ranks outnumber the cores
(`cores`), they take turns on them: a rank that waits hands its core to one that works
(step_time: the pipeline bubble).
"""

from dataclasses import asdict, dataclass, field, replace

from plscale.errors import did_you_mean
from plscale.predict.errors import PredictionError
from plscale.predict.units import GiB, MiB


@dataclass(frozen=True)
class GPU:
    name: str
    memory: float             # bytes per GPU
    peak_flops: dict          # precision -> dense FLOP/s
    intra_gbs: float          # NVLink, per GPU, one direction, GB/s
    inter_gbs: float          # network, per GPU, one direction, GB/s
    gpus_per_node: int = 8
    source: str = ""
    intra_latency_us: float = 1.0   # one step of a ring inside a node (an assumption, module doc)
    inter_latency_us: float = 5.0   # one step of a ring across nodes
    hbm_gbs: float = 0.0            # GPU memory bandwidth, GB/s (module doc); 0: not known
    cores: int = 0                  # CPU ranks: the cores they share (module doc); 0: a device each
    collective_gbs: dict = field(default_factory=dict)   # op -> its own bus GB/s inside a node; else intra_gbs
    p2p_latency_us: float = 0.0     # a point-to-point hop between neighbours; 0: a ring step's latency
    optimizer_ns: float = 0.0       # measured AdamW step a parameter; 0: from hbm_gbs (step_time.ADAM_BYTES)
    layer_overhead_us: float = 0.0  # measured fixed cost of a layer's forward and backward a micro-batch; 0: none
    sms: int = 0                    # streaming multiprocessors, over which a matmul's tiles are spread (matmul.py)
    mamf: float = 0.0               # the best large bf16 GEMM's FLOP/s over the dense peak (module doc); 0: not known
    flash: float = 0.5              # flash attention's forward and backward FLOP/s (causal half) over the peak
    mamf_fp8: float = 0.0           # the best large fp8 GEMM's FLOP/s over the dense fp8 peak (module doc)

    def peak(self, precision: str) -> float:
        """Dense FLOP/s: fp32 at TF32, fp16 and bf16 sharing the tensor cores' peak, fp8 where it has one."""
        key = precision if precision in ("fp32", "fp8") else "bf16"
        if key not in self.peak_flops:
            raise PredictionError("fp8", self.name, f": the {self.name} has no fp8 tensor cores (Hopper, Ada and "
                                                    f"Blackwell GPUs do): train in bf16.", show=self.name)
        return self.peak_flops[key]

    def best_fraction(self, precision: str) -> float:
        """The best large GEMM's fraction of that peak (mamf, or mamf_fp8 in fp8)."""
        return self.mamf_fp8 if precision == "fp8" else self.mamf

    def to_dict(self) -> dict:
        return asdict(self)


def _tf(bf16: float, tf32: float, fp8: float = 0.0) -> dict:
    return {"bf16": bf16 * 1e12, "fp32": tf32 * 1e12, **({"fp8": fp8 * 1e12} if fp8 else {})}


GPUS = {
    "H100": GPU("H100 SXM5 80GB", 81_559 * MiB, _tf(989, 494, 1979), 450, 50, 8,
                "NVIDIA H100 datasheet; DGX H100: 8 x 400 Gb/s ConnectX-7", hbm_gbs=3350, sms=132, mamf=0.803,
                mamf_fp8=0.709),
    "H200": GPU("H200 SXM 141GB", 143_771 * MiB, _tf(989, 494, 1979), 450, 50, 8,
                "NVIDIA H200 datasheet; HGX H200: 8 x 400 Gb/s", hbm_gbs=4800, sms=132, mamf=0.803,
                mamf_fp8=0.734),
    "H800": GPU("H800 SXM5 80GB", 81_559 * MiB, _tf(989, 494, 1979), 200, 50, 8,
                "NVIDIA H800 datasheet (NVLink 400 GB/s); 400 Gb/s a GPU as in DeepSeek-V3's report", hbm_gbs=3350,
                sms=132, mamf=0.803, mamf_fp8=0.709),
    "B200": GPU("B200 180GB (HGX)", 180e9, _tf(2250, 1100, 4500), 900, 50, 8,
                "NVIDIA HGX B200 datasheet (1,000 W); 8 x ConnectX-7 400 Gb/s", hbm_gbs=8000, sms=148,
                mamf=0.776, mamf_fp8=0.763),
    "A100": GPU("A100 SXM4 80GB", 81_920 * MiB, _tf(312, 156), 300, 25, 8,
                "NVIDIA A100 datasheet; DGX A100: 8 x 200 Gb/s HDR", hbm_gbs=2039, sms=108, mamf=0.869,
                flash=0.6),
    "A100-40GB": GPU("A100 SXM4 40GB", 40_960 * MiB, _tf(312, 156), 300, 25, 8,
                     "NVIDIA A100 datasheet; DGX A100: 8 x 200 Gb/s HDR", hbm_gbs=1555, sms=108,
                     mamf=0.869, flash=0.6),
    "L40S": GPU("L40S 48GB (PCIe)", 46_068 * MiB, _tf(362, 183, 733), 32, 1.5, 8,
                "NVIDIA L40S datasheet; PCIe Gen4 x16; network and matmul efficiency assumed (module doc)",
                hbm_gbs=864, sms=142, mamf=0.75, mamf_fp8=0.75),
    "A10": GPU("A10 24GB (PCIe)", 23_028 * MiB, _tf(125, 62.5), 32, 1.5, 8,
               "NVIDIA A10 datasheet; PCIe Gen4 x16; network and matmul efficiency assumed (module doc)",
               hbm_gbs=600, sms=72, mamf=0.75),
    "L4": GPU("L4 24GB (PCIe)", 23_034 * MiB, _tf(121, 60, 242), 32, 1.5, 8,
              "NVIDIA L4 datasheet; PCIe Gen4 x16; network and matmul efficiency assumed (module doc)",
              hbm_gbs=300, sms=58, mamf=0.75, mamf_fp8=0.75),
    "RTX 4090": GPU("GeForce RTX 4090 24GB", 24_564 * MiB, _tf(165, 82.6), 32, 1.5, 8,
                    "NVIDIA Ada Lovelace whitepaper; PCIe Gen4 x16; network and matmul efficiency assumed "
                    "(module doc)", hbm_gbs=1008, sms=128, mamf=0.75),
}
ALIASES = {"H100-80GB": "H100", "A100-80GB": "A100", "H200-141GB": "H200", "4090": "RTX 4090", "RTX4090": "RTX 4090"}


def gpu_of_device(device_name: str) -> GPU | None:
    """The GPU whose name a device's own name holds (torch.cuda.get_device_name: "NVIDIA L40S",
    "NVIDIA A100-SXM4-80GB"), the longest match first (an L40S is not an L4); None if unknown."""
    known = sorted((k for k in [*GPUS, *ALIASES] if k.upper() in device_name.upper()), key=len, reverse=True)
    return GPUS[ALIASES.get(known[0], known[0])] if known else None


def cpu_ranks(ranks: int, cores: int, flops: float, busbw_gbs: float, latency_us: float, memory: float,
              collective_gbs: dict | None = None, p2p_latency_us: float = 0.0, optimizer_ns: float = 0.0,
              layer_overhead_us: float = 0.0) -> GPU:
    """This machine's `ranks` CPU processes as one node of `ranks` "GPUs" (module doc): measured
    FLOP/s a rank (every precision alike), one link for all (gloo over loopback) with the bus
    bandwidth of each collective gloo runs its own way, a point-to-point hop's latency, AdamW's
    seconds a parameter, a layer's fixed cost a micro-batch, bytes a rank.

    >>> cpu_ranks(8, 2, 2e9, 1.5, 90, 2 * GiB).name
    '8 CPU ranks on 2 cores'
    """
    for quantity, value in (("ranks", ranks), ("cores", cores), ("flops", flops), ("busbw_gbs", busbw_gbs),
                            ("memory", memory), *(collective_gbs or {}).items()):
        if value <= 0:
            raise PredictionError(quantity, value, ": must be more than 0.")
    return GPU(f"{ranks} CPU ranks on {cores} core{'s' if cores > 1 else ''}", memory, {"bf16": flops, "fp32": flops},
               busbw_gbs, busbw_gbs, ranks, "measured on this machine (plscale.run.machine)",
               latency_us, latency_us, cores=cores, collective_gbs=dict(collective_gbs or {}),
               p2p_latency_us=p2p_latency_us, optimizer_ns=optimizer_ns, layer_overhead_us=layer_overhead_us)


def find_gpu(name: str | None = "H100", memory_gib: float | None = None, peak_tflops: float | None = None,
             intra_gbs: float | None = None, inter_gbs: float | None = None,
             gpus_per_node: int | None = None) -> GPU:
    """A named GPU (case-insensitive; H100 when None), each field given replacing the GPU's."""
    given = {"memory": memory_gib, "peak_tflops": peak_tflops, "intra_gbs": intra_gbs, "inter_gbs": inter_gbs,
             "gpus_per_node": gpus_per_node}  # the quantities, as an error names them
    name = "H100" if name is None else name
    key = {k.upper(): k for k in [*GPUS, *ALIASES]}.get(name.upper())
    if key is None:
        raise PredictionError("gpu", name, f"No GPU {name!r}.{did_you_mean(name.upper(), GPUS)} Known: "
                                           f"{', '.join(GPUS)}; or change one's figures with {{memory}}, "
                                           f"{{peak_tflops}}, {{intra_gbs}}, {{inter_gbs}}.", lead=False)
    base = GPUS[ALIASES.get(key, key)]
    for quantity, value in given.items():
        if value is not None and value <= 0:
            raise PredictionError(quantity, value, ": must be more than 0.")
    changes = {}
    if memory_gib is not None:
        changes["memory"] = memory_gib * GiB
    if peak_tflops is not None:
        changes["peak_flops"] = {"bf16": peak_tflops * 1e12, "fp32": peak_tflops * 1e12}
    for field, value in (("intra_gbs", intra_gbs), ("inter_gbs", inter_gbs), ("gpus_per_node", gpus_per_node)):
        if value is not None:
            changes[field] = value
    if changes:
        changes["name"] = base.name + " (changed: " + ", ".join(
            f"{k.replace('_', '-')} {v:g}" for k, v in given.items() if v is not None) + ")"
    return replace(base, **changes)
