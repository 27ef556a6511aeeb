"""`marketgpt doctor --json` and `marketgpt status --json`: one JSON object in the schema of
common.distributed.gpu_health, with NVML faked (two GPUs, their processes and warnings) and without
NVML (this CPU machine: an empty list and the reason)."""

from __future__ import annotations

import json
import os
import sys
import types

import pytest

from common.cli import main
from common.cluster import status
from common.cluster.status import status_json
from common.distributed import gpu_health

from test_status import _epoch, _run, root  # noqa: F401 (root: the fixture of a case folder)


class _Error(Exception):
    """pynvml's NVMLError_NotSupported, for a reading a card lacks."""


class _TwoGpus(types.ModuleType):
    """Card 0: 40 of 80 GB used by this test's own process, 2 uncorrected ECC errors, thermal
    slowdown, no power reading. Card 1: 78 of 80 GB used (97%), nothing else wrong."""

    def __init__(self) -> None:
        super().__init__("pynvml")

    def nvmlInit(self) -> None:
        pass

    def nvmlDeviceGetCount(self) -> int:
        return 2

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        return i

    def nvmlDeviceGetName(self, h: int) -> bytes:
        return b"NVIDIA A100-SXM4-80GB"  # older pynvml returns bytes

    def nvmlDeviceGetUUID(self, h: int) -> str:
        return f"GPU-000{h}"

    def nvmlDeviceGetMemoryInfo(self, h: int):
        return types.SimpleNamespace(used=[40, 78][h] * 10**9, total=80 * 10**9)

    def nvmlDeviceGetUtilizationRates(self, h: int):
        return types.SimpleNamespace(gpu=[97, 3][h], memory=10)

    def nvmlDeviceGetTemperature(self, h: int, sensor: int) -> int:
        return [84, 40][h]

    def nvmlDeviceGetPowerUsage(self, h: int) -> int:
        if h == 0:
            raise _Error("NVML_ERROR_NOT_SUPPORTED")
        return 61_500

    def nvmlDeviceGetEnforcedPowerLimit(self, h: int) -> int:
        return 400_000

    def nvmlDeviceGetComputeRunningProcesses(self, h: int) -> list:
        return [types.SimpleNamespace(pid=os.getpid(), usedGpuMemory=39 * 10**9)] if h == 0 else []

    def nvmlSystemGetProcessName(self, pid: int) -> bytes:
        return b"python"

    def nvmlDeviceGetTotalEccErrors(self, h: int, kind: int, counter: int) -> int:
        return 2 if (h, kind) == (0, 1) else 0

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, h: int) -> int:
        return 0x20 | 0x01 if h == 0 else 0x04  # card 0: thermal, and idle; card 1: at its power cap (no warning)


@pytest.fixture
def nvml_of(monkeypatch):
    def use(module):
        monkeypatch.setitem(sys.modules, "pynvml", module)
        monkeypatch.setattr(gpu_health, "_NVML", None)

    return use


def _json(capsys, *args: str) -> tuple[int, dict]:
    code = main(list(args))
    out = capsys.readouterr().out
    return code, json.loads(out)  # nothing but the JSON object on stdout


def test_doctor_json_gives_every_gpu_its_readings_processes_and_warnings(nvml_of, capsys):
    nvml_of(_TwoGpus())
    code, report = _json(capsys, "doctor", "--json")
    assert report["schema"] == "marketgpt.health/1" and report["host"] and report["time"].endswith("+00:00")
    first, second = report["gpus"]
    assert report["gpus_reason"] is None
    assert first["name"] == "NVIDIA A100-SXM4-80GB" and first["uuid"] == "GPU-0000"
    assert (first["memory_used_bytes"], first["memory_total_bytes"]) == (40 * 10**9, 80 * 10**9)
    assert (first["utilization_pct"], first["temperature_c"], first["power_w"]) == (97.0, 84.0, None)
    assert first["power_limit_w"] == 400.0 and second["power_w"] == 61.5
    assert first["processes"] == [{"pid": os.getpid(), "used_memory_bytes": 39 * 10**9, "name": "python"}]
    assert first["warnings"] == ["ECC errors: 2 uncorrected since the driver loaded", "clocks slowed down: thermal"]
    assert second["warnings"] == ["memory nearly full: 98% used"] and second["processes"] == []
    # the verdict is the human report's: this CPU build of torch cannot train on them, exit 1 both ways
    doctor = report["doctor"]
    assert doctor["ready"] is False and code == main(["doctor"]) == 1
    assert doctor["cause"] and doctor["cause"] in capsys.readouterr().out and doctor["torch"]


def test_without_nvml_the_list_is_empty_and_says_why(nvml_of, capsys):
    nvml_of(None)  # nvidia-ml-py not installed
    code, report = _json(capsys, "doctor", "--json")
    assert report["gpus"] == [] and report["gpus_reason"].startswith("NVML not available")
    assert code == 1 and report["doctor"]["report"][0].startswith("torch ")


def test_status_json_lists_each_run_with_its_numbers(root, nvml_of, monkeypatch, capsys):  # noqa: F811
    nvml_of(None)
    monkeypatch.setattr(status, "slurm_available", lambda: False)
    _run(root, "crypto_prototype_20250106_091500", epochs_total=50, epochs=[_epoch(1, 3.0), _epoch(2, 2.5)])
    (run,) = status_json(root=root)["runs"]
    assert run["case"] == "case_c_crypto" and run["run"] == "crypto_prototype_20250106_091500"
    assert (run["status"], run["epoch"], run["epochs"], run["val_loss"]) == ("running", 2, 50, 2.5)
    assert run["tokens_per_sec"] == 41234.0 and run["eta_s"] == 3 * 3600 + 5 * 60 and run["job"] is None
    code, report = _json(capsys, "status", "--json")  # the repo's own case folders, whatever runs they hold
    assert code == 0 and report["schema"] == "marketgpt.health/1" and isinstance(report["runs"], list)


def test_the_fake_speaks_the_real_nvml():
    """Every call the fake answers, and every NVML constant gpu_health hard-codes, is the real
    pynvml's (nvidia-ml-py, in the test extra): a renamed call would otherwise pass here and read
    null on every GPU."""
    import pynvml

    calls = [name for name in vars(_TwoGpus) if name.startswith("nvml")]
    assert len(calls) == 14 and [name for name in calls if not hasattr(pynvml, name)] == []
    assert (gpu_health._UNCORRECTED, gpu_health._CORRECTED, gpu_health._VOLATILE) == (
        pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
        pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED,
        pynvml.NVML_VOLATILE_ECC,
    )
    reasons = ("HwSlowdown", "SwThermalSlowdown", "HwThermalSlowdown", "HwPowerBrakeSlowdown")
    assert sorted(gpu_health._SLOWDOWNS) == sorted(getattr(pynvml, f"nvmlClocksThrottleReason{r}") for r in reasons)
