"""Devices, interconnects and model shapes for the simulator, each labelled with its source.

A DeviceProfile is what the cost model needs of a device: peak dense matmul FLOP/s, memory
bandwidth, memory size, and the fractions of the first two that real kernels achieve. Two
kinds, never mixed up in a figure:

- *datasheet*: vendor figures (cited beside each entry) times an achievable fraction. The
  fractions are assumptions, stated once here and overridable per profile: well-tuned GEMMs
  reach roughly 70% of dense peak and memory-bound kernels roughly 80% of HBM bandwidth. A
  step also pays a fixed host overhead (scheduling, input preparation, sampling, kernel
  launches replayed from a CUDA graph), assumed 2 ms, plus 10 us per sequence for building
  its metadata. All of these are modelled, not measured.
- *measured*: this machine's ceilings from roofline.load_or_measure_ceilings, fraction 1
  (they are already attained rates). Its overhead is unknown until `sim.calibrate` fits it.

Links carry the KV cache between disaggregated prefill and decode instances; bandwidths are
one direction, as a transfer uses one. Left out: tensor-parallel communication (an instance
of n GPUs is modelled as one device n times as large), link latency and contention with
other traffic.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace

import torch

from nanoserve.config import ModelConfig
from nanoserve.engine.kv_cache import kv_cache_torch_dtype, num_blocks_in
from nanoserve.measure.roofline import dtype_bytes, dtype_name, load_or_measure_ceilings
from nanoserve.presets import PRESETS

GB = 1e9


@dataclass(frozen=True)
class DeviceProfile:
    name: str
    peak_flops: float  # FLOP/s, dense matmul in the serving dtype
    bandwidth: float  # bytes/s, device memory
    memory: float  # bytes
    source: str  # "datasheet: ..." or "measured: ..."
    flops_fraction: float = 0.7  # achievable share of peak_flops
    bandwidth_fraction: float = 0.8  # achievable share of bandwidth
    step_overhead: float = 2e-3  # seconds per step on the host (assumed)
    seq_overhead: float = 10e-6  # seconds per scheduled sequence (assumed)

    def scaled(self, n: int) -> DeviceProfile:
        """n devices as one (tensor parallel, communication left out)."""
        if n < 1:
            raise ValueError(f"n={n} devices must be >= 1")
        if n == 1:
            return self
        return replace(self, name=f"{n}x {self.name}", peak_flops=n * self.peak_flops,
                       bandwidth=n * self.bandwidth, memory=n * self.memory)


# Dense (no sparsity) BF16 tensor-core peaks, HBM bandwidth and memory, as printed.
DEVICES: dict[str, DeviceProfile] = {
    # NVIDIA H100 Tensor Core GPU datasheet (SXM5): BF16 1,979 TFLOPS with sparsity
    # (989 dense), 3.35 TB/s HBM3, 80 GB.
    "H100-SXM": DeviceProfile("H100 SXM", 989e12, 3350 * GB, 80 * GB,
                              "datasheet: NVIDIA H100 Tensor Core GPU datasheet (SXM5)"),
    # NVIDIA H200 Tensor Core GPU datasheet (SXM): BF16 1,979 TFLOPS with sparsity
    # (989 dense), 4.8 TB/s HBM3e, 141 GB.
    "H200": DeviceProfile("H200 SXM", 989e12, 4800 * GB, 141 * GB,
                          "datasheet: NVIDIA H200 Tensor Core GPU datasheet (SXM)"),
    # NVIDIA A100 Tensor Core GPU datasheet (80GB SXM): BF16 312 TFLOPS dense (624 with
    # sparsity), 2,039 GB/s HBM2e, 80 GB.
    "A100-80GB-SXM": DeviceProfile("A100 80GB SXM", 312e12, 2039 * GB, 80 * GB,
                                   "datasheet: NVIDIA A100 Tensor Core GPU datasheet (80GB SXM)"),
    # NVIDIA L4 Tensor Core GPU datasheet: BF16 242 TFLOPS with sparsity (121 dense),
    # 300 GB/s GDDR6, 24 GB.
    "L4": DeviceProfile("L4", 121e12, 300 * GB, 24 * GB,
                        "datasheet: NVIDIA L4 Tensor Core GPU datasheet"),
}


def measured_profile(device: str = "cpu", dtype: str = "float32") -> DeviceProfile:
    """This machine as roofline measured it (cached), labelled measured."""
    c = load_or_measure_ceilings(device, quick=True)
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") if c.device == "cpu" else 0
    if c.device == "cuda":
        memory = torch.cuda.get_device_properties(0).total_memory
    return DeviceProfile(f"{c.device_name} ({c.num_threads} threads)", c.peak(dtype), c.bandwidth,
                         float(memory), f"measured: roofline ceilings, {c.date}",
                         flops_fraction=1.0, bandwidth_fraction=1.0, step_overhead=0.0,
                         seq_overhead=0.0)


@dataclass(frozen=True)
class Link:
    name: str
    bandwidth: float  # bytes/s, one direction
    source: str


LINKS: dict[str, Link] = {
    # NVIDIA H100 datasheet: NVLink 900 GB/s, counted over both directions; 450 GB/s each way.
    "nvlink": Link("NVLink 4", 450 * GB, "datasheet: NVIDIA H100 datasheet, 900 GB/s bidirectional"),
    # PCI-SIG PCIe 5.0: 32 GT/s x 16 lanes, 128b/130b encoding = 63 GB/s each way (64 nominal).
    "pcie5": Link("PCIe 5.0 x16", 64 * GB, "datasheet: PCIe 5.0 specification, x16 one direction"),
    # NVIDIA ConnectX-7 / Quantum-2 NDR InfiniBand: 400 Gb/s per port.
    "ib400": Link("InfiniBand NDR 400 Gb/s", 50 * GB, "datasheet: NVIDIA ConnectX-7, 400 Gb/s"),
    "eth100": Link("100 GbE", 12.5 * GB, "datasheet: IEEE 802.3 100 Gb/s Ethernet"),
}

# Shapes from each model's public config.json, beside the engine's presets.
SHAPES: dict[str, dict] = {
    "llama-2-7b": dict(vocab_size=32000, hidden_size=4096, intermediate_size=11008,
                       num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=32,
                       max_position_embeddings=4096),
    "llama-3-70b": dict(vocab_size=128256, hidden_size=8192, intermediate_size=28672,
                        num_hidden_layers=80, num_attention_heads=64, num_key_value_heads=8,
                        rope_theta=500000.0, max_position_embeddings=8192),
}


def model_shape(name: str) -> ModelConfig:
    """A ModelConfig from SHAPES or the engine's presets."""
    shapes = {**PRESETS, **SHAPES}
    if name not in shapes:
        raise ValueError(f"unknown model shape {name!r}; available: {sorted(shapes)}")
    return ModelConfig(**shapes[name])


def num_kv_blocks(profile: DeviceProfile, cfg: ModelConfig, dtype: str = "bfloat16",
                  block_size: int = 16, memory_utilization: float = 0.9,
                  kv_cache_dtype: str = "auto") -> int:
    """(memory * utilization - weights) / bytes per block, as vLLM sizes its cache; blocks in
    kv_cache_dtype (EngineConfig's: "fp8" holds twice bf16's)."""
    weights = cfg.num_params() * dtype_bytes(dtype)
    blocks = num_blocks_in(profile.memory * memory_utilization - weights, cfg,
                           kv_cache_torch_dtype(kv_cache_dtype, dtype_name(dtype)), block_size)
    if blocks < 1:
        raise ValueError(f"{profile.name} ({profile.memory / GB:.0f} GB at utilization "
                         f"{memory_utilization}) cannot hold {weights / GB:.1f} GB of weights and a "
                         f"KV cache; use more devices (profile.scaled(n))")
    return blocks
