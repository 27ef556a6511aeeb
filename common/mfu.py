"""Model FLOPs utilization (MFU): the share of the hardware's peak FLOP/s that training turns
into model FLOPs (`MarketGPT.flops_per_token` x tokens/s), as in PaLM (Chowdhery et al. 2022).

The peak is one device's: `training.peak_flops` when set, else the bf16 dense peak of a card we
know by name. A CPU's peak depends on its cores, clock and threads, so there it is the user's to
state (bench/bench_train.py measures one with a large torch.mm); without a peak there is no MFU.
"""
from __future__ import annotations

from typing import Optional

import torch

__all__ = ["KNOWN_PEAKS", "device_peak_flops", "mfu"]

# substring of torch.cuda.get_device_name() -> dense bf16 FLOP/s without sparsity (vendor sheets)
KNOWN_PEAKS = {"A100": 312e12}


def device_peak_flops(device: torch.device, configured: Optional[float] = None) -> Optional[float]:
    """Peak FLOP/s of one `device`: `configured` if given, else a known card's, else None."""
    if configured is not None:
        return float(configured)
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        return next((peak for key, peak in KNOWN_PEAKS.items() if key in name), None)
    return None


def mfu(tokens_per_sec: float, flops_per_token: int, peak_flops: Optional[float], devices: int = 1) -> Optional[float]:
    """Achieved model FLOP/s over the peak of `devices` devices; None without a peak."""
    if peak_flops is None:
        return None
    return tokens_per_sec * flops_per_token / (peak_flops * devices)
