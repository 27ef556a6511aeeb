"""GPU health for the epoch log: utilization, memory, temperature, power of this rank's GPU.

torch gives the memory this process allocated (now and peak since the last reset); NVML (the
`pynvml` module of the optional `nvidia-ml-py` package) adds what the whole card shows:
utilization %, memory used by every process, temperature and power. Without NVML those are
None; on the CPU there is nothing to report (`gpu_stats` returns None).
"""

from __future__ import annotations

from typing import Any, Optional

import torch

from common.distributed.gpu_health import nvml

__all__ = ["format_gpu_line", "gpu_stats"]

_GB = 1e9


def _nvml_readings(device: torch.device) -> dict[str, Optional[float]]:
    out: dict[str, Optional[float]] = {
        "util_pct": None,
        "nvml_mem_used_gb": None,
        "temperature_c": None,
        "power_w": None,
    }
    lib = nvml()
    if lib is None:
        return out
    try:  # by UUID: CUDA_VISIBLE_DEVICES renumbers the GPUs, NVML doesn't
        handle = lib.nvmlDeviceGetHandleByUUID(f"GPU-{torch.cuda.get_device_properties(device).uuid}")
    except Exception:
        return out
    readers = {
        "util_pct": lambda: float(lib.nvmlDeviceGetUtilizationRates(handle).gpu),
        "nvml_mem_used_gb": lambda: round(lib.nvmlDeviceGetMemoryInfo(handle).used / _GB, 3),
        "temperature_c": lambda: float(lib.nvmlDeviceGetTemperature(handle, lib.NVML_TEMPERATURE_GPU)),
        "power_w": lambda: round(lib.nvmlDeviceGetPowerUsage(handle) / 1000.0, 1),  # milliwatts
    }
    for key, read in readers.items():
        try:
            out[key] = read()
        except Exception:  # a reading this card or driver doesn't offer
            pass
    return out


def gpu_stats(device: torch.device, reset_peak: bool = True) -> Optional[dict[str, Any]]:
    """This process's GPU now: name, memory (torch: allocated, peak since the last call,
    reserved; card total) and NVML's readings. None on the CPU."""
    if device.type != "cuda":
        return None
    props = torch.cuda.get_device_properties(device)
    stats = {
        "index": device.index if device.index is not None else torch.cuda.current_device(),
        "name": props.name,
        "mem_total_gb": round(props.total_memory / _GB, 3),
        "mem_allocated_gb": round(torch.cuda.memory_allocated(device) / _GB, 3),
        "mem_peak_gb": round(torch.cuda.max_memory_allocated(device) / _GB, 3),
        "mem_reserved_gb": round(torch.cuda.memory_reserved(device) / _GB, 3),
        **_nvml_readings(device),
    }
    if reset_peak:  # each epoch's peak is its own
        torch.cuda.reset_peak_memory_stats(device)
    return stats


def format_gpu_line(rank: int, s: dict[str, Any]) -> str:
    """'GPU 0 (rank 0) NVIDIA A100-SXM4-80GB: util 97% | mem 31.2 GB, peak 35.1 of 80.0 GB | 64 C | 310 W'."""
    parts = [
        f"util {s['util_pct']:.0f}%" if s.get("util_pct") is not None else "util n/a",
        f"mem {s['mem_allocated_gb']:.1f} GB, peak {s['mem_peak_gb']:.1f} of {s['mem_total_gb']:.1f} GB",
    ]
    if s.get("nvml_mem_used_gb") is not None:
        parts.append(f"card {s['nvml_mem_used_gb']:.1f} GB used")
    if s.get("temperature_c") is not None:
        parts.append(f"{s['temperature_c']:.0f} C")
    if s.get("power_w") is not None:
        parts.append(f"{s['power_w']:.0f} W")
    return f"GPU {s['index']} (rank {rank}) {s['name']}: " + " | ".join(parts)
