"""The paper GPUs and the links between them: the data-sheet numbers the cost model prices with.

A GPU is two numbers that matter, a calculator and a pipe (peak FLOP/s and memory bandwidth in bytes/s),
plus its memory size; a link between GPUs is a bandwidth and a fixed cost per collective.  The figures are
NVIDIA's data sheets, in decimal units as vendors print them (miniengine/README.md, Cost model).
"""
from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class GPU:
    """Dense 16-bit peak, memory bandwidth and memory size, in decimal units (as vendors print them)."""

    name: str
    peak_flops: float  # FLOP/s, dense bf16 (fp16 where the chip has no bf16)
    bandwidth: float  # bytes/s of HBM (or GDDR) bandwidth
    memory: float  # bytes

    @property
    def ridge_point(self) -> float:
        """FLOPs a kernel must do per byte it moves before compute, not bandwidth, limits it."""
        return self.peak_flops / self.bandwidth


GPUS = {
    "H100": GPU("H100 SXM", 989e12, 3.35e12, 80e9),
    "H200": GPU("H200", 989e12, 4.8e12, 141e9),
    "A100-80GB": GPU("A100-80GB", 312e12, 2.039e12, 80e9),
    "T4": GPU("T4", 65e12, 0.32e12, 16e9),  # no bf16: fp16 numbers
}


def get_gpu(name: str) -> GPU:
    """A GPU from the table by name (case-insensitive)."""
    for key, gpu in GPUS.items():
        if name.lower() == key.lower():
            return gpu
    raise ValueError(f"--gpu {name!r} is not a known GPU; choose one of: {', '.join(GPUS)}")


# CUDA device names (torch.cuda.get_device_name) of the exact products in the table. Variants differ: a PCIe or
# NVL card, or a 40 GB A100, has other bandwidth or peak numbers, so it counts as unknown.
DEVICE_NAMES = {"H100 80GB HBM3": "H100", "H200": "H200", "A100-SXM4-80GB": "A100-80GB", "T4": "T4"}


def gpu_for_device(device_name: str) -> GPU | None:
    """The table's entry for this exact CUDA product, or None."""
    if "PCIe" in device_name or "NVL" in device_name:
        return None
    return next((GPUS[key] for pattern, key in DEVICE_NAMES.items() if pattern in device_name), None)


# ---------------------------------------------------------------- interconnects


@dataclasses.dataclass(frozen=True)
class Interconnect:
    """A GPU-to-GPU link: the bytes/s each GPU sends in one direction, and the fixed cost of one collective."""

    name: str
    bandwidth: float  # bytes/s per GPU, one direction
    latency_s: float  # per all-reduce, whatever its size


INTERCONNECTS = {
    # NVIDIA's H100 SXM data sheet: NVLink 900 GB/s per GPU, both directions together (18 NVLink 4 links);
    # a ring sends one way while it receives the other, so 450 GB/s is each GPU's pipe (the JAX scaling
    # book's GPU chapter uses the same split).  The latency is an assumption, not a data-sheet figure: a
    # small NCCL all-reduce inside one NVLink node costs on the order of 10 us of launches and handshakes.
    "NVLink-H100": Interconnect("H100 NVLink (900 GB/s bidirectional)", 450e9, 10e-6),
}
