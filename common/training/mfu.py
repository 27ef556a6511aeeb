"""Model FLOPs utilization (MFU): the share of the hardware's peak FLOP/s that training turns
into model FLOPs (`MarketGPT.flops_per_token` x tokens/s), as in PaLM (Chowdhery et al. 2022).

The peak is one device's: `training.peak_flops` when set, else the dense 16-bit tensor-core
peak of a card we know by name (bf16, or fp16 on cards without bf16: what training.precision
auto trains in there; an fp32/TF32 run is measured against it too). A CPU's peak depends on its
cores, clock and threads, so there it is the user's to state (bench/bench_train.py measures one
with a large torch.mm); without a peak there is no MFU.
"""

from __future__ import annotations

import re
from typing import Optional

import torch

__all__ = ["KNOWN_PEAKS", "device_peak_flops", "known_peak", "mfu"]

# torch.cuda.get_device_name() pattern -> (dense tensor-core FLOP/s without sparsity, dtype).
# The first match wins, so the more specific names come first ("H100 PCIe" before "H100";
# word boundaries keep "A10" off "A100"/"A10G" and "L4" off "L40"). Datasheets quote the
# sparse figure too: these are the dense ones (half the sparse ones).
KNOWN_PEAKS: list[tuple[str, float, str]] = [
    # NVIDIA H100 datasheet (2023): BF16 1,671 TFLOPS (NVL) / 1,513 (PCIe) / 1,979 (SXM), with sparsity
    (r"\bH100 NVL\b", 835.5e12, "bf16"),
    (r"\bH100 PCIe\b", 756.5e12, "bf16"),
    (r"\bH100\b", 989.5e12, "bf16"),
    # NVIDIA H200 datasheet (2024): BF16 1,671 TFLOPS (NVL) / 1,979 (SXM), with sparsity
    (r"\bH200 NVL\b", 835.5e12, "bf16"),
    (r"\bH200\b", 989.5e12, "bf16"),
    # NVIDIA A100 datasheet: BF16 312 TFLOPS dense (624 sparse), 40 GB and 80 GB, PCIe and SXM alike
    (r"\bA100\b", 312e12, "bf16"),
    # NVIDIA L40S datasheet: BF16 362.05 TFLOPS dense (733 sparse)
    (r"\bL40S\b", 362.05e12, "bf16"),
    # NVIDIA L40 datasheet: BF16 181.05 TFLOPS dense (362.1 sparse)
    (r"\bL40\b", 181.05e12, "bf16"),
    # NVIDIA L4 datasheet: BF16 242 TFLOPS with sparsity
    (r"\bL4\b", 121e12, "bf16"),
    # NVIDIA A10 datasheet: BF16 125 TFLOPS dense (250 sparse)
    (r"\bA10\b", 125e12, "bf16"),
    # NVIDIA Ada Lovelace architecture whitepaper, RTX 4090: BF16 tensor with FP32 accumulate
    # (what autocast uses) 165.2 TFLOPS dense (330.4 sparse)
    (r"\bRTX 4090\b", 165.2e12, "bf16"),
    # NVIDIA Ampere GA102 whitepaper, RTX 3090: BF16 tensor with FP32 accumulate 71 TFLOPS dense (142 sparse)
    (r"\bRTX 3090\b", 71e12, "bf16"),
    # No bf16 tensor cores: fp16 peaks (training.precision auto picks fp16 there).
    # NVIDIA V100 datasheet: tensor performance 130 TFLOPS (V100S PCIe), 112 (PCIe), 125 (SXM2)
    (r"\bV100S\b", 130e12, "fp16"),
    (r"\bV100-PCIE\b", 112e12, "fp16"),
    (r"\bV100\b", 125e12, "fp16"),
    # NVIDIA T4 datasheet: mixed precision (FP16/FP32) 65 TFLOPS
    (r"\bT4\b", 65e12, "fp16"),
]


def known_peak(name: str) -> Optional[tuple[float, str]]:
    """(dense peak FLOP/s, its dtype) of the first card in KNOWN_PEAKS that `name` matches."""
    for pattern, peak, dtype in KNOWN_PEAKS:
        if re.search(pattern, name, flags=re.IGNORECASE):
            return peak, dtype
    return None


def device_peak_flops(device: torch.device, configured: Optional[float] = None) -> Optional[float]:
    """Peak FLOP/s of one `device`: `configured` if given, else a known card's, else None."""
    if configured is not None:
        return float(configured)
    if device.type == "cuda":
        found = known_peak(torch.cuda.get_device_name(device))
        return found[0] if found else None
    return None


def mfu(tokens_per_sec: float, flops_per_token: int, peak_flops: Optional[float], devices: int = 1) -> Optional[float]:
    """Achieved model FLOP/s over the peak of `devices` devices; None without a peak."""
    if peak_flops is None:
        return None
    return tokens_per_sec * flops_per_token / (peak_flops * devices)
