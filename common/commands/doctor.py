"""`marketgpt doctor`: what to run first on a new node (or inside a job: srun marketgpt doctor).

It prints the torch, CUDA and NCCL versions, the NVIDIA driver, every visible GPU (name,
memory, bf16 support, dense 16-bit peak), whether the CPU has bf16 in hardware (what forecasts
and scorecards use it for), the Slurm variables the process sees and whether
each case config's training fits in the smallest GPU's memory. It exits 1 when training here
would fall back to the CPU (no usable GPU: a CPU build of torch, a driver older than the
wheel's CUDA, no GPU visible), or when the job has more processes on this node than GPUs.
"""

from __future__ import annotations

import io
import json
import os
from pathlib import Path
from typing import Optional, TextIO

import torch

from common.config import load_config
from common.distributed.env import cuda_unusable_reason, detect_env, driver_version, rank_device
from common.distributed.gpu_health import health_report
from common.distributed.precision import bf16_supported, compile_problem, cpu_capabilities, fast_bf16, resolve_precision
from common.errors import UserError
from common.model.memory import estimate_training_memory
from common.model.sizing import meta_model
from common.paths import REPO_ROOT
from common.training.mfu import known_peak

__all__ = ["SLURM_VARIABLES", "run_doctor", "run_doctor_json"]

SLURM_VARIABLES = (
    "SLURM_JOB_ID",
    "SLURM_JOB_NODELIST",
    "SLURM_NNODES",
    "SLURM_NTASKS",
    "SLURM_NTASKS_PER_NODE",
    "SLURM_TASKS_PER_NODE",
    "SLURM_PROCID",
    "SLURM_LOCALID",
    "SLURM_GPUS_ON_NODE",
    "SLURM_JOB_GPUS",
    "SLURM_STEP_GPUS",
    "CUDA_VISIBLE_DEVICES",
    "MASTER_ADDR",
    "MASTER_PORT",
)
_SLACK_BYTES = 1.5e9  # CUDA context and allocator slack on top of the estimate


def _nccl_version() -> str:
    try:
        return ".".join(map(str, torch.cuda.nccl.version()))
    except Exception:  # a CPU build has no NCCL
        return "none"


def _gpu_lines() -> tuple[list[str], list[int], list[str]]:
    """One line per visible GPU, their memory in bytes, and the precision `auto` picks on each."""
    lines, memory, precisions = [], [], []
    for i in range(torch.cuda.device_count()):
        device = torch.device("cuda", i)
        props = torch.cuda.get_device_properties(device)
        major, minor = torch.cuda.get_device_capability(device)
        peak = known_peak(props.name)
        peak_text = f"{peak[0] / 1e12:g} TFLOP/s dense {peak[1]}" if peak else "unknown (set training.peak_flops)"
        precisions.append(resolve_precision("auto", device))
        memory.append(props.total_memory)
        lines.append(
            f"  GPU {i}: {props.name}, {props.total_memory / 1e9:.1f} GB, compute capability "
            f"{major}.{minor}, bf16 {'yes' if bf16_supported(device) else 'no'}, peak {peak_text}, "
            f"training.precision=auto -> {precisions[-1]}"
        )
    return lines, memory, precisions


def _cpu_line() -> str:
    has = fast_bf16(torch.device("cpu"))
    return (
        f"CPU: {cpu_capabilities().get('cpu_name', 'unknown')}, {os.cpu_count()} logical cores, bf16 in hardware: "
        + (
            "yes (forecast/scorecard --precision auto runs bf16-trained runs in bf16 here)"
            if has
            else "no (forecasts and scorecards run in fp32 here)"
        )
    )


def _case_fits(root: Path, gpu_bytes: Optional[int], precision: str) -> list[str]:
    lines = []
    for path in sorted(root.glob("case_*/configs/*.json")):
        try:
            cfg = load_config(path)
        except UserError as e:
            lines.append(f"  {path.relative_to(root)}: cannot read ({e})")
            continue
        t = cfg.training
        model = meta_model(cfg.model, cfg.data)
        p = precision if t.precision == "auto" else t.precision
        est = estimate_training_memory(
            cfg.model,
            model.num_parameters(),
            t.batch_size,
            p,
            t.gradient_checkpointing,
            cfg.slurm.nodes * cfg.slurm.gpus_per_node,
        )
        need = est.total + _SLACK_BYTES
        verdict = (
            (
                "fits"
                if need <= gpu_bytes
                else "does NOT fit: lower training.batch_size (raise "
                "grad_accum_steps) or set training.gradient_checkpointing=true"
            )
            if gpu_bytes
            else "no GPU to check"
        )
        lines.append(
            f"  {path.relative_to(root)}: about {need / 1e9:.1f} GB per GPU at batch {t.batch_size} ({p}"
            f"{', gradient checkpointing' if t.gradient_checkpointing else ''}): {verdict}"
        )
    return lines


def run_doctor_json(out: TextIO, root: Optional[Path] = None) -> int:
    """`marketgpt doctor --json`: one JSON object (common.distributed.gpu_health's, with the doctor's
    verdict under "doctor"); the exit code is the report's."""
    report = io.StringIO()
    code = run_doctor(report, root)
    lines = report.getvalue().splitlines()
    cause = next((line.split(": ", 1)[1] for line in lines if line.startswith("PROBLEM: ")), None)
    verdict = {
        "ready": code == 0,
        "cause": cause,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "nccl": _nccl_version(),
        "driver": driver_version(),
        "report": lines,
    }
    print(json.dumps(health_report(doctor=verdict), indent=2), file=out)
    return code


def run_doctor(out: TextIO, root: Optional[Path] = None) -> int:
    """Print the report; 0 when training here would use the GPU(s), 1 when it would not."""
    root = root or REPO_ROOT
    print(
        f"torch {torch.__version__} | built for CUDA {torch.version.cuda or 'none (CPU build)'} | "
        f"NCCL {_nccl_version()}",
        file=out,
    )
    print(f"NVIDIA driver: {driver_version() or 'not found (no nvidia-smi)'}", file=out)
    reason = cuda_unusable_reason()
    lines, memory, precisions = ([], [], []) if reason else _gpu_lines()
    print(f"GPUs visible to torch: {len(lines)}", file=out)
    for line in lines:
        print(line, file=out)
    print(_cpu_line(), file=out)
    if not reason:
        problem = compile_problem()
        state = (
            f"UNAVAILABLE, training falls back to eager: {problem}"
            if problem
            else "ready (Triton and a C compiler); training.compile_mode auto: CUDA graphs on one GPU, "
            "plain compile under DDP"
        )
        print(f"torch.compile (training.compile, on in the case configs): {state}", file=out)
    seen = [f"{k}={os.environ[k]}" for k in SLURM_VARIABLES if k in os.environ]
    print("Slurm and launcher variables: " + (" ".join(seen) if seen else "none (not inside a Slurm job)"), file=out)
    print(f"Case configs (estimate + {_SLACK_BYTES / 1e9:g} GB slack vs the smallest GPU):", file=out)
    for line in _case_fits(root, min(memory) if memory else None, precisions[0] if precisions else "bf16"):
        print(line, file=out)

    env = detect_env()
    if reason:
        print(f"PROBLEM: training here would run on the CPU: {reason}", file=out)
        return 1
    try:
        rank_device(env)  # one GPU per process of the job on this node
    except UserError as e:
        print(f"PROBLEM: {e}", file=out)
        return 1
    print(f"OK: training here uses {len(lines)} GPU(s)", file=out)
    return 0
