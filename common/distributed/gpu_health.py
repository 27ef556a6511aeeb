"""Every GPU of this machine as data, through NVML: for `marketgpt doctor --json` and
`marketgpt status --json`, which a dashboard or a cron check polls (docs/slurm.md, "GPU health
as JSON").

NVML (the `pynvml` module of the optional `nvidia-ml-py` package) sees every card of the
machine, whatever CUDA_VISIBLE_DEVICES says, and what each process holds on it. A reading a
card or driver does not offer is null, never an error; without NVML or without an NVIDIA GPU the
list is empty and `gpus_reason` says why. No torch here: `marketgpt status` reads it on a login
node.
"""

from __future__ import annotations

import datetime
import functools
import importlib
import socket
from typing import Any, Callable, Optional, TypedDict

__all__ = ["HEALTH_SCHEMA", "GpuHealth", "gpu_health", "health_report", "nvml"]

HEALTH_SCHEMA = "marketgpt.health/1"
MEMORY_NEARLY_FULL = 0.95  # share of a card's memory in use above which it gets a warning
# NVML's clock event reasons (nvml.h: nvmlClocksEventReason*) that mean the card is slowed down
# by something wrong; the software power cap (0x04) is a card working hard, not a warning
_SLOWDOWNS = {
    0x08: "hardware slowdown",
    0x20: "thermal",
    0x40: "thermal (hardware)",
    0x80: "power brake",
}
_UNCORRECTED, _CORRECTED, _VOLATILE = 1, 0, 0  # NVML_MEMORY_ERROR_TYPE_*, NVML_VOLATILE_ECC
_NVML: Any = None  # the initialized pynvml module, False when it can't be had
_NVML_ERROR = ""  # why not, for `gpus_reason`


class GpuProcess(TypedDict):
    pid: int
    used_memory_bytes: Optional[int]
    name: Optional[str]  # NVML's: its pids are the host's, which a container's /proc does not show


class GpuHealth(TypedDict):
    index: int
    name: Optional[str]
    uuid: Optional[str]
    memory_used_bytes: Optional[int]
    memory_total_bytes: Optional[int]
    utilization_pct: Optional[float]
    temperature_c: Optional[float]
    power_w: Optional[float]
    power_limit_w: Optional[float]
    processes: list[GpuProcess]
    warnings: list[str]


def nvml() -> Any:
    """pynvml, initialized once; None when nvidia-ml-py is not installed or NVML won't start."""
    global _NVML, _NVML_ERROR
    if _NVML is None:
        try:
            module = importlib.import_module("pynvml")
            module.nvmlInit()
            _NVML = module
        except Exception as e:  # not installed, no driver library, no permission
            _NVML, _NVML_ERROR = False, f"{type(e).__name__}: {e}"
    return _NVML or None


def _read(fn: Callable[[], Any]) -> Any:
    try:
        return fn()
    except Exception:  # NVMLError_NotSupported and the like: this reading is null
        return None


def _text(value: Any) -> Optional[str]:
    return value.decode() if isinstance(value, bytes) else value


def _processes(lib: Any, handle: Any) -> list[GpuProcess]:
    out: list[GpuProcess] = []
    for p in _read(lambda: lib.nvmlDeviceGetComputeRunningProcesses(handle)) or []:
        name = _text(_read(functools.partial(lib.nvmlSystemGetProcessName, p.pid)))
        out.append({"pid": int(p.pid), "used_memory_bytes": getattr(p, "usedGpuMemory", None), "name": name})
    return out


def _warnings(lib: Any, handle: Any, g: GpuHealth) -> list[str]:
    warnings = []
    for kind, word in ((_UNCORRECTED, "uncorrected"), (_CORRECTED, "corrected")):
        n = _read(functools.partial(lib.nvmlDeviceGetTotalEccErrors, handle, kind, _VOLATILE))
        if n:
            warnings.append(f"ECC errors: {n} {word} since the driver loaded")
    reasons = _read(lambda: lib.nvmlDeviceGetCurrentClocksThrottleReasons(handle))
    slowed = [what for bit, what in _SLOWDOWNS.items() if reasons and reasons & bit]
    if slowed:
        warnings.append(f"clocks slowed down: {', '.join(dict.fromkeys(slowed))}")
    used, total = g["memory_used_bytes"], g["memory_total_bytes"]
    if used is not None and total and used / total > MEMORY_NEARLY_FULL:
        warnings.append(f"memory nearly full: {used / total:.0%} used")
    return warnings


def _one(lib: Any, index: int) -> GpuHealth:
    handle = lib.nvmlDeviceGetHandleByIndex(index)
    memory = _read(lambda: lib.nvmlDeviceGetMemoryInfo(handle))
    power = _read(lambda: lib.nvmlDeviceGetPowerUsage(handle))  # milliwatts
    limit = _read(lambda: lib.nvmlDeviceGetEnforcedPowerLimit(handle))
    util = _read(lambda: lib.nvmlDeviceGetUtilizationRates(handle))
    temperature = _read(lambda: lib.nvmlDeviceGetTemperature(handle, 0))  # NVML_TEMPERATURE_GPU
    g: GpuHealth = {
        "index": index,
        "name": _text(_read(lambda: lib.nvmlDeviceGetName(handle))),
        "uuid": _text(_read(lambda: lib.nvmlDeviceGetUUID(handle))),
        "memory_used_bytes": None if memory is None else int(memory.used),
        "memory_total_bytes": None if memory is None else int(memory.total),
        "utilization_pct": None if util is None else float(util.gpu),
        "temperature_c": None if temperature is None else float(temperature),
        "power_w": None if power is None else round(power / 1000.0, 1),
        "power_limit_w": None if limit is None else round(limit / 1000.0, 1),
        "processes": _processes(lib, handle),
        "warnings": [],
    }
    g["warnings"] = _warnings(lib, handle, g)
    return g


def gpu_health() -> tuple[list[GpuHealth], Optional[str]]:
    """(every GPU NVML sees, None) or ([], why there is none)."""
    lib = nvml()
    if lib is None:
        return [], f"NVML not available ({_NVML_ERROR or 'nvidia-ml-py not installed'})"
    count = _read(lib.nvmlDeviceGetCount)
    if not count:
        return [], "NVML sees no NVIDIA GPU on this machine"
    return [_one(lib, i) for i in range(int(count))], None


def health_report(**extra: Any) -> dict[str, Any]:
    """The JSON object of `doctor --json` and `status --json`: schema, host, time, the GPUs (or
    why there are none), and the command's own keys."""
    gpus, reason = gpu_health()
    return {
        "schema": HEALTH_SCHEMA,
        "host": socket.gethostname(),
        "time": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "gpus": gpus,
        "gpus_reason": reason,
        **extra,
    }
