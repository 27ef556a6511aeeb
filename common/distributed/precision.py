"""training.precision: which autocast dtype a run trains in, and its GradScaler.

    auto  bf16 on GPUs with bf16 tensor cores (compute capability 8.0+: A100, A10, L4, L40S,
          RTX 3090/4090, H100, H200); fp16 with a GradScaler on older ones (V100, T4); fp32 on
          the CPU
    bf16  autocast to bfloat16 (no scaler: bf16 has fp32's exponent range)
    fp16  autocast to float16 with a GradScaler (its state travels in the checkpoint)
    fp32  no autocast; on Ampere and newer the matmuls use TF32 tensor cores

Whatever the precision, the parameters, gradients and AdamW moments stay fp32 ("master
weights"): autocast only casts the inputs of matmuls, so checkpoints hold fp32 weights. An
explicit bf16 or fp16 on the CPU is honoured (slow, but it lets the tests run the paths).

Forecasts and scorecards (`--precision`, `inference_precision`) run in fp32 or bf16 autocast:
auto is bf16 for a run that trained in bf16 (its forward saw bf16 matmuls throughout
training) on a device that multiplies bf16 in hardware, and fp32 otherwise.

training.compile (on in the case configs, CUDA only) needs Triton and a C compiler on the node:
`compile_problem` says what is missing, and the Trainer then trains eagerly rather than failing.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
from typing import Optional

import torch

from common.errors import UserError

__all__ = [
    "AUTOCAST_DTYPES",
    "COMPILE_MODES",
    "CUDA_GRAPH_MODES",
    "choose_compile_mode",
    "INFERENCE_PRECISIONS",
    "autocast",
    "bf16_supported",
    "compile_problem",
    "cpu_capabilities",
    "describe_precision",
    "fast_bf16",
    "grad_scaler",
    "inference_precision",
    "resolve_precision",
    "use_tf32",
]

AUTOCAST_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
INFERENCE_PRECISIONS = ("auto", "fp32", "bf16")


def bf16_supported(device: torch.device) -> bool:
    """bf16 tensor cores: compute capability 8.0 (Ampere) and newer. True on the CPU."""
    if device.type != "cuda":
        return True
    return torch.cuda.get_device_capability(device)[0] >= 8


def resolve_precision(setting: str, device: torch.device) -> str:
    """training.precision ("auto", "bf16", "fp16", "fp32") made concrete for `device`."""
    if setting == "auto":
        if device.type != "cuda":
            return "fp32"
        return "bf16" if bf16_supported(device) else "fp16"
    if setting == "bf16" and not bf16_supported(device):
        raise UserError(
            f"training.precision=bf16 but {_no_bf16(device)}; use training.precision=auto (fp16 with "
            "a grad scaler) or fp16"
        )
    return setting


def _no_bf16(device: torch.device) -> str:
    major, minor = torch.cuda.get_device_capability(device)
    return f"{torch.cuda.get_device_name(device)} (compute capability {major}.{minor}) has no bf16 tensor cores"


def fast_bf16(device: torch.device) -> bool:
    """bf16 matrix products in hardware: a GPU of compute capability 8.0+, or a CPU with
    AVX512-BF16 or AMX-BF16. Elsewhere torch emulates bf16, which is slower than fp32."""
    if device.type == "cuda":
        return bf16_supported(device)
    if device.type != "cpu":
        return False
    caps = cpu_capabilities()
    return bool(caps.get("avx512_bf16") or caps.get("amx_bf16"))


def cpu_capabilities() -> dict:
    """torch's view of this CPU (instruction sets, cpu_name); {} on a torch without the call."""
    capabilities = getattr(torch.cpu, "get_capabilities", None)  # torch 2.13 has it; older ones may not
    return capabilities() if capabilities is not None else {}


def inference_precision(setting: str, trained: Optional[str], device: torch.device) -> str:
    """--precision of forecast / scorecard ("auto", "fp32", "bf16") made concrete for `device`.
    trained: the run's training precision (training_log.json), None when unknown."""
    if setting not in INFERENCE_PRECISIONS:
        raise UserError(f"--precision {setting!r}: expected one of {', '.join(INFERENCE_PRECISIONS)}")
    if setting == "auto":
        return "bf16" if trained == "bf16" and fast_bf16(device) else "fp32"
    if setting == "bf16" and not bf16_supported(device):
        raise UserError(f"--precision bf16 but {_no_bf16(device)}; use --precision fp32")
    return setting


def autocast(precision: str, device: torch.device) -> contextlib.AbstractContextManager:
    dtype = AUTOCAST_DTYPES.get(precision)
    return torch.autocast(device_type=device.type, dtype=dtype) if dtype else contextlib.nullcontext()


def grad_scaler(precision: str, device: torch.device) -> torch.amp.GradScaler:
    """fp16 gradients underflow without loss scaling; in the other precisions the scaler is
    disabled, a pass-through (scale, unscale_, update do nothing; step is optimizer.step)."""
    return torch.amp.GradScaler(device.type, enabled=precision == "fp16")


def use_tf32(device: torch.device) -> bool:
    """Let fp32 matmuls (fp32 precision, and whatever runs outside autocast) use TF32 tensor
    cores on Ampere and newer; returns whether they do."""
    if device.type != "cuda" or not bf16_supported(device):
        return False
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    return True


def describe_precision(precision: str, device: torch.device) -> str:
    """One line for the start of the log."""
    if precision == "bf16":
        return "bf16 autocast (fp32 master weights)"
    if precision == "fp16":
        return "fp16 autocast with a GradScaler (fp32 master weights)"
    return "fp32 (TF32 matmuls)" if device.type == "cuda" and bf16_supported(device) else "fp32"


def _triton_installed() -> bool:
    return importlib.util.find_spec("triton") is not None


def compile_problem() -> Optional[str]:
    """Why torch.compile cannot build CUDA kernels here, or None. Inductor writes Triton kernels,
    and Triton compiles a small C launcher with the system's C compiler on first use, so a node
    without one would fail at the first training step, after the job waited in the queue."""
    if not _triton_installed():
        return "Triton is not installed (it comes with torch's CUDA wheels; reinstall torch from them)"
    if not (os.environ.get("CC") or any(shutil.which(c) for c in ("cc", "gcc", "clang"))):
        return "no C compiler on PATH (Triton builds its kernel launcher with one: `module load gcc`, or set CC)"
    return None


COMPILE_MODES = ("auto", "default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
CUDA_GRAPH_MODES = ("reduce-overhead", "max-autotune")  # torch.compile's modes that replay CUDA graphs


def choose_compile_mode(requested: str, world_size: int, gradient_checkpointing: bool) -> tuple[str, Optional[str]]:
    """The torch.compile mode to train with (training.compile_mode), and a one-line note when it
    differs from the one asked for. CUDA graphs (one launch for a whole forward or backward) pay
    most for the small shapes, whose steps are launch-bound; this suite measured and tested them
    on one GPU only, so under DDP and with gradient checkpointing they are left out.
    "auto": reduce-overhead where CUDA graphs are used, else default."""
    if requested not in COMPILE_MODES:
        raise ValueError(f"unknown compile mode {requested!r}; one of {', '.join(COMPILE_MODES)}")
    why = (
        "DDP (more than one process)"
        if world_size > 1
        else "gradient checkpointing"
        if gradient_checkpointing
        else None
    )
    if requested == "auto":
        return ("default" if why else "reduce-overhead"), None
    if requested in CUDA_GRAPH_MODES and why:
        fallback = "default" if requested == "reduce-overhead" else "max-autotune-no-cudagraphs"
        return fallback, (
            f"training.compile_mode={requested} uses CUDA graphs, which this suite leaves out "
            f"under {why}: compiling with mode {fallback}"
        )
    return requested, None
