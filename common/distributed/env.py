"""Where this process sits in a job: rank, world size, node, rendezvous address, its device.

`detect_env()` reads whichever launcher started the process (srun under Slurm, torchrun,
submitit, or a plain single process); common.distributed.ddp starts torch.distributed on
what it finds. Nothing here talks to the other ranks.
"""

from __future__ import annotations

import os
import re
import subprocess
from dataclasses import dataclass
from typing import Mapping, Optional

import torch
import torch.distributed as dist

from common.distributed.scheduler import slurm_job_id
from common.errors import UserError

__all__ = [
    "DistEnv",
    "TIMEOUT_ENV",
    "check_gpus_usable",
    "check_num_gpus",
    "collective_timeout_s",
    "cuda_unusable_reason",
    "detect_env",
    "driver_version",
    "gpus_requested",
    "pick_device",
    "rank_device",
    "several_ranks",
    "visible_gpus",
]

TIMEOUT_ENV = "MARKETGPT_DIST_TIMEOUT"  # seconds any collective may wait for the other ranks
_DEFAULT_TIMEOUT_S = 600.0


@dataclass(frozen=True)
class DistEnv:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 1  # processes of this job on this node
    master_addr: str = "127.0.0.1"
    master_port: int = 29500
    launcher: str = "single"  # "slurm" | "torchrun" | "submitit" | "single"
    gpus_on_node: int = 0  # GPUs Slurm gave this node (0 when unknown or none)
    agent_store: bool = False  # torchrun's agent hosts the key-value store (else rank 0 does)
    attempt: int = 0  # torchrun restart count: keeps store keys of earlier attempts apart

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


def _first_slurm_host(nodelist: str) -> str:
    # `scontrol show hostnames` expands node[1-3,5] the way Slurm does; rank 0 runs on the
    # first host of the step. It only parses: no call to slurmctld.
    if not nodelist:
        return "127.0.0.1"
    try:
        out = subprocess.run(
            ["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True, timeout=30, check=True
        ).stdout.split()
        if out:
            return out[0]
    except (OSError, subprocess.SubprocessError):
        pass
    # Without scontrol: a plain name, or the prefix and first number of the first range.
    m = re.match(r"([^,\[]+)(?:\[(\w+))?", nodelist)
    return m.group(1) + (m.group(2) or "") if m else nodelist


def _port_for_job(job_id: str) -> int:
    # Every rank of a job derives the same port; jobs sharing a node get different ones. The
    # range stays below Linux's ephemeral ports (32768+), where random connections live,
    # and above the ports Slurm's daemons use (6817/6818; 17001+ for the local test nodes).
    digits = "".join(ch for ch in job_id if ch.isdigit()) or "0"
    return 20000 + int(digits) % 10000


def _tasks_per_node(text: str) -> list[int]:
    """Slurm's compressed count list: '2(x3),1' -> [2, 2, 2, 1]."""
    counts: list[int] = []
    for part in filter(None, text.split(",")):
        m = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part.strip())
        if m is None:
            return []
        counts += [int(m.group(1))] * int(m.group(2) or 1)
    return counts


def detect_env(environ: Optional[Mapping[str, str]] = None) -> DistEnv:
    """Where this process sits, from whichever launcher started it."""
    env = os.environ if environ is None else environ
    gpus = int(env.get("SLURM_GPUS_ON_NODE", "0") or 0)
    if "RANK" in env and "WORLD_SIZE" in env:  # torchrun (or anything speaking its protocol)
        world = int(env["WORLD_SIZE"])
        return DistEnv(
            rank=int(env["RANK"]),
            world_size=world,
            local_rank=int(env.get("LOCAL_RANK", 0)),
            local_world_size=int(env.get("LOCAL_WORLD_SIZE", world)),
            master_addr=env.get("MASTER_ADDR", "127.0.0.1"),
            master_port=int(env.get("MASTER_PORT", 29500)),
            launcher="torchrun",
            gpus_on_node=gpus,
            agent_store=env.get("TORCHELASTIC_USE_AGENT_STORE") == "True",
            attempt=int(env.get("TORCHELASTIC_RESTART_COUNT", 0)),
        )
    if env.get("SUBMITIT_EXECUTOR") == "local":
        n = int(env.get("SUBMITIT_LOCAL_NTASKS", 1))
        return DistEnv(
            rank=int(env.get("SUBMITIT_LOCAL_GLOBALID", 0)),
            world_size=n,
            local_rank=int(env.get("SUBMITIT_LOCAL_LOCALID", 0)),
            local_world_size=n,
            master_addr="127.0.0.1",
            master_port=_port_for_job(env.get("SUBMITIT_LOCAL_JOB_ID", str(os.getppid()))),
            launcher="submitit",
            gpus_on_node=gpus,
        )
    # Under Slurm, only a task started by srun is one rank of many: the batch script itself
    # also sees SLURM_PROCID=0 and SLURM_NTASKS, but has no step id.
    if "SLURM_PROCID" in env and ("SLURM_STEP_ID" in env or "SLURM_STEPID" in env):
        world = int(env.get("SLURM_STEP_NUM_TASKS") or env.get("SLURM_NTASKS") or 1)
        counts = _tasks_per_node(env.get("SLURM_STEP_TASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE", ""))
        node = int(env.get("SLURM_NODEID", 0))
        return DistEnv(
            rank=int(env["SLURM_PROCID"]),
            world_size=world,
            local_rank=int(env.get("SLURM_LOCALID", 0)),
            local_world_size=counts[node] if node < len(counts) else world,
            # an exported MASTER_ADDR / MASTER_PORT wins (two jobs pinned to one port)
            master_addr=env.get("MASTER_ADDR")
            or _first_slurm_host(env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST", "")),
            master_port=int(env.get("MASTER_PORT") or _port_for_job(slurm_job_id(env) or "0")),
            launcher="submitit" if env.get("SUBMITIT_EXECUTOR") == "slurm" else "slurm",
            gpus_on_node=gpus,
        )
    return DistEnv(gpus_on_node=gpus)


def collective_timeout_s(environ: Optional[Mapping[str, str]] = None) -> float:
    """MARKETGPT_DIST_TIMEOUT (seconds, default 600): the longest any rank waits for the others."""
    env = os.environ if environ is None else environ
    text = env.get(TIMEOUT_ENV, "").strip()
    if not text:
        return _DEFAULT_TIMEOUT_S
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise UserError(f"{TIMEOUT_ENV}={text!r} must be a positive number of seconds")
    return value


def check_num_gpus(num_gpus: Optional[int], env: DistEnv) -> None:
    """`--num-gpus N` must agree with the job's layout: N processes on this node (one per
    GPU) and, under Slurm, N GPUs per node from --gres."""
    if num_gpus is None:
        return
    if num_gpus < 1:
        raise UserError(f"--num-gpus must be at least 1, got {num_gpus}")
    per_node = env.local_world_size
    if per_node != num_gpus:
        how = {"single": "a single plain process", "torchrun": "torchrun"}.get(env.launcher, env.launcher)
        raise UserError(
            f"--num-gpus {num_gpus} but the job started {per_node} process(es) on this node ({how}): "
            f"start one task per GPU (sbatch --ntasks-per-node={num_gpus} with srun, or torchrun "
            f"--nproc-per-node={num_gpus}), or pass --num-gpus {per_node}"
        )
    if env.gpus_on_node and env.gpus_on_node != num_gpus:
        raise UserError(
            f"--num-gpus {num_gpus} but Slurm gave this node {env.gpus_on_node} GPU(s): make "
            f"#SBATCH --gres=gpu:<type>:N, --ntasks-per-node=N and --num-gpus N the same number"
        )


def gpus_requested(env: DistEnv, num_gpus: Optional[int] = None, device: str = "auto") -> Optional[str]:
    """Why this job expects to train on GPUs ('SLURM_GPUS_ON_NODE=2', '--num-gpus 2',
    'training.device=cuda'), or None when nothing asked for them."""
    if device == "cuda":
        return "training.device=cuda"
    if device == "cpu":
        return None  # the CPU on purpose (tests on the local Slurm cluster's fake GPUs)
    if env.gpus_on_node > 0:
        return f"SLURM_GPUS_ON_NODE={env.gpus_on_node}"
    if num_gpus is not None:
        return f"--num-gpus {num_gpus}"
    return None


def driver_version() -> Optional[str]:
    """The NVIDIA driver version from nvidia-smi, or None where there is no nvidia-smi."""
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout.split()
    except (OSError, subprocess.SubprocessError):
        return None
    return out[0] if out else None


def cuda_unusable_reason() -> Optional[str]:
    """Why torch cannot use a GPU in this process (a CPU build, a driver older than the wheel's
    CUDA, no visible GPU), or None when it can."""
    if torch.version.cuda is None:
        return (
            f"this torch ({torch.__version__}) is a CPU build (torch.version.cuda is None): install the "
            "CUDA build (pip install -r requirements_gpu.txt on Linux x86_64)"
        )
    if torch.cuda.is_available():
        return None
    driver = driver_version()
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    return (
        f"torch {torch.__version__} is built for CUDA {torch.version.cuda} and cannot use a GPU (NVIDIA driver: "
        f"{driver or 'unknown, no nvidia-smi'}; CUDA_VISIBLE_DEVICES={visible!r}): a driver older than "
        f"CUDA {torch.version.cuda} needs (see requirements_gpu.txt), or no GPU visible to this process"
    )


def visible_gpus() -> int:
    """GPUs this process sees (after CUDA_VISIBLE_DEVICES)."""
    return torch.cuda.device_count()


def check_gpus_usable(env: DistEnv, num_gpus: Optional[int] = None, device: str = "auto") -> None:
    """Stop at once when the job was given GPUs but torch cannot use them, rather than train
    on the CPU for days. `device` is training.device ("auto", "cuda" or "cpu")."""
    why = gpus_requested(env, num_gpus, device)
    reason = cuda_unusable_reason() if why else None
    if reason:
        raise UserError(
            f"this job was given GPUs ({why}) but {reason}; run `marketgpt doctor` on the node, or "
            "--set training.device=cpu to train on the CPU on purpose"
        )


def rank_device(env: DistEnv, device: str = "auto") -> torch.device:
    """This rank's device: the GPU of its local rank, or the CPU (`device` is training.device)."""
    if device == "cpu" or not torch.cuda.is_available():
        return torch.device("cpu")
    count = torch.cuda.device_count()
    if count >= env.local_world_size and env.local_rank < count:
        return torch.device("cuda", env.local_rank)
    # Slurm bound one GPU to each task (--gpus-per-task / --gpu-bind): each sees one, its own
    if count == 1 and env.launcher in ("slurm", "submitit") and env.gpus_on_node >= env.local_world_size:
        return torch.device("cuda", 0)
    raise UserError(
        f"this node runs {env.local_world_size} processes of the job but rank {env.rank} (local rank "
        f"{env.local_rank}) sees {count} GPU(s): several ranks on one GPU fail in NCCL; start one "
        f"process per GPU (torchrun --nproc-per-node {count}, or --ntasks-per-node={count})"
    )


def pick_device() -> torch.device:
    """This process's current GPU, or the CPU without CUDA."""
    return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")


def several_ranks() -> bool:
    """True when this process is one of several in a process group (collectives talk to others)."""
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1
