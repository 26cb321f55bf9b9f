"""Accelerators for deriving profiles: peak dense FLOP/s per dtype, memory bandwidth and memory, links, with sources.

Peaks are *dense* tensor-core figures (datasheets often print the 2:4-sparsity figure, twice as large;
those are never used here). ``memory_gib`` is the total a CUDA/ROCm runtime reports for the device — what
vLLM's memory profiler multiplies by ``gpu_memory_utilization`` — which is a little below the nominal
capacity because the driver reserves some of it.

Links: ``link_bytes_s`` is one GPU's bandwidth to its tensor-parallel peers in one direction (NVLink, or PCIe where
the GPU has no NVLink), what a ring all-reduce's bus bandwidth is bounded by; ``host_link_bytes_s`` is one
direction of the GPU's PCIe link to host memory (CPU KV offload). Both are datasheet figures (half the
bidirectional figures datasheets print).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..errors import InputError


class UnknownGPUError(InputError):
    """A GPU name that is not in the table (the message lists the known ones)."""


@dataclass(frozen=True)
class GPU:
    name: str
    description: str
    peak_flops: dict[str, float]  # dense FLOP/s per dtype
    memory_bw_bytes_s: float
    memory_gib: float
    sources: dict[str, str] = field(default_factory=dict)
    #: one direction of the GPU's link to its tensor-parallel peers (bytes/s) and what it is
    link_bytes_s: float = 0.0
    link: str = ""
    #: one direction of the GPU's PCIe link to host memory (bytes/s)
    host_link_bytes_s: float = 0.0

    def peak(self, dtype: str) -> float:
        try:
            return self.peak_flops[dtype]
        except KeyError:
            raise UnknownGPUError(f"gpu {self.name}: no {dtype} tensor-core peak (has "
                                  f"{', '.join(self.peak_flops)})") from None


T = 1e12
GB = 1e9

GPUS: dict[str, GPU] = {g.name: g for g in (
    GPU("v100-16gb", "NVIDIA V100 SXM2 16 GB", {"fp16": 125 * T, "fp32": 15.7 * T}, 900 * GB, 15.78,
        {"peak_flops": "NVIDIA V100 datasheet (SXM2): 125 TFLOP/s fp16 tensor, 15.7 TFLOP/s fp32; no bf16",
         "memory_bw": "NVIDIA V100 datasheet: 900 GB/s HBM2",
         "memory": "16 GB HBM2; CUDA reports 15.78 GiB"}, 150 * GB, "NVLink 2 (V100 SXM2 datasheet: 300 GB/s bidirectional)", 16 * GB),
    GPU("v100-32gb", "NVIDIA V100 SXM2 32 GB", {"fp16": 125 * T, "fp32": 15.7 * T}, 900 * GB, 31.74,
        {"peak_flops": "NVIDIA V100 datasheet (SXM2): 125 TFLOP/s fp16 tensor; no bf16",
         "memory_bw": "NVIDIA V100 datasheet: 900 GB/s HBM2",
         "memory": "32 GB HBM2; CUDA reports 31.74 GiB"}, 150 * GB, "NVLink 2 (V100 SXM2 datasheet: 300 GB/s bidirectional)", 16 * GB),
    GPU("a10g", "NVIDIA A10G 24 GB (AWS G5)", {"fp16": 70 * T, "bf16": 70 * T, "fp32": 35 * T}, 600 * GB, 22.49,
        {"peak_flops": "AWS G5 / A10G published figures: 70 TFLOP/s dense fp16/bf16 tensor (the A10's 125 is not "
                       "reached by the clock-limited A10G)",
         "memory_bw": "600 GB/s GDDR6 (A10 and A10G share the memory system)",
         "memory": "24 GB GDDR6; CUDA reports 22.49 GiB"}, 32 * GB, "PCIe Gen4 x16 (64 GB/s bidirectional; no NVLink)", 32 * GB),
    GPU("l4", "NVIDIA L4 24 GB", {"fp16": 121 * T, "bf16": 121 * T, "fp8": 242 * T, "fp32": 30.3 * T}, 300 * GB,
        22.49,
        {"peak_flops": "NVIDIA L4 datasheet: 242 TFLOP/s fp16/bf16 with sparsity, i.e. 121 dense; fp8 485 sparse",
         "memory_bw": "NVIDIA L4 datasheet: 300 GB/s GDDR6",
         "memory": "24 GB GDDR6; CUDA reports 22.49 GiB"}, 32 * GB, "PCIe Gen4 x16 (L4 datasheet: 64 GB/s bidirectional; no NVLink)", 32 * GB),
    GPU("l40s", "NVIDIA L40S 48 GB", {"fp16": 362.05 * T, "bf16": 362.05 * T, "fp8": 733 * T, "fp32": 91.6 * T},
        864 * GB, 44.99,
        {"peak_flops": "NVIDIA L40S datasheet: 362.05 TFLOP/s dense bf16/fp16 tensor (733 with sparsity), 733 dense fp8 "
                       "(1,466 with sparsity)",
         "memory_bw": "NVIDIA L40S datasheet: 864 GB/s GDDR6",
         "memory": "48 GB GDDR6 with ECC; CUDA reports about 44.99 GiB (46,068 MiB, estimate)"},
        32 * GB, "PCIe Gen4 x16 (L40S datasheet: 64 GB/s bidirectional; no NVLink)", 32 * GB),
    GPU("a100-40gb", "NVIDIA A100 SXM4 40 GB", {"fp16": 312 * T, "bf16": 312 * T, "fp32": 19.5 * T}, 1555 * GB,
        39.39,
        {"peak_flops": "NVIDIA A100 datasheet: 312 TFLOP/s dense fp16/bf16 tensor (624 with sparsity)",
         "memory_bw": "NVIDIA A100 datasheet: 1,555 GB/s HBM2 (40 GB)",
         "memory": "40 GB HBM2; CUDA reports 39.39 GiB"}, 300 * GB, "NVLink 3 (A100 SXM datasheet: 600 GB/s bidirectional)", 32 * GB),
    GPU("a100-80gb", "NVIDIA A100 SXM4 80 GB", {"fp16": 312 * T, "bf16": 312 * T, "fp32": 19.5 * T}, 2039 * GB,
        79.15,
        {"peak_flops": "NVIDIA A100 datasheet: 312 TFLOP/s dense fp16/bf16 tensor (624 with sparsity)",
         "memory_bw": "NVIDIA A100 datasheet: 2,039 GB/s HBM2e (80 GB SXM)",
         "memory": "80 GB HBM2e; CUDA reports 79.15 GiB"}, 300 * GB, "NVLink 3 (A100 SXM datasheet: 600 GB/s bidirectional)", 32 * GB),
    GPU("h100", "NVIDIA H100 SXM5 80 GB",
        {"fp16": 989 * T, "bf16": 989 * T, "fp8": 1979 * T, "fp32": 67 * T}, 3350 * GB, 79.19,
        {"peak_flops": "NVIDIA H100 datasheet (SXM): 1,979 TFLOP/s bf16 with sparsity, i.e. 989 dense; fp8 1,979 "
                       "dense",
         "memory_bw": "NVIDIA H100 datasheet (SXM): 3.35 TB/s HBM3",
         "memory": "80 GB HBM3; CUDA reports 79.19 GiB"}, 450 * GB, "NVLink 4 (H100 SXM datasheet: 900 GB/s bidirectional)", 64 * GB),
    GPU("h200", "NVIDIA H200 SXM 141 GB",
        {"fp16": 989 * T, "bf16": 989 * T, "fp8": 1979 * T, "fp32": 67 * T}, 4800 * GB, 139.8,
        {"peak_flops": "NVIDIA H200 datasheet: same tensor cores as H100 SXM, 989 TFLOP/s dense bf16",
         "memory_bw": "NVIDIA H200 datasheet: 4.8 TB/s HBM3e",
         "memory": "141 GB HBM3e; CUDA reports 139.80 GiB (150,109,880,320 bytes, read with torch on an H200 SXM by "
                   "bench/gpu_kernels.py)"}, 450 * GB, "NVLink 4 (H200 SXM datasheet: 900 GB/s bidirectional)", 64 * GB),
    GPU("mi300x", "AMD Instinct MI300X 192 GB",
        {"fp16": 1307.4 * T, "bf16": 1307.4 * T, "fp8": 2614.9 * T, "fp32": 163.4 * T}, 5300 * GB, 191.5,
        {"peak_flops": "AMD Instinct MI300X datasheet: 1,307.4 TFLOP/s dense fp16/bf16 matrix, 2,614.9 fp8",
         "memory_bw": "AMD Instinct MI300X datasheet: 5.3 TB/s HBM3",
         "memory": "192 GB HBM3; about 191.5 GiB usable (estimate: nominal less the driver reserve)"}, 448 * GB, "Infinity Fabric (MI300X datasheet: 7 links x 128 GB/s bidirectional = 896 GB/s peer)", 64 * GB),
)}

ALIASES = {"v100": "v100-16gb", "a100": "a100-80gb", "h100-80gb": "h100", "h100-sxm": "h100", "h200-141gb": "h200",
           "h200-sxm": "h200", "l40s-48gb": "l40s"}


def get_gpu(name: str) -> GPU:
    key = ALIASES.get(name.lower(), name.lower())
    try:
        return GPUS[key]
    except KeyError:
        raise UnknownGPUError(f"unknown GPU {name!r} (known: {', '.join(GPUS)})") from None
