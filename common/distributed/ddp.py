"""One process per GPU: where this process sits in the job, and the DDP plumbing around it.

`detect_env()` (common.distributed.env) reads the launcher's environment (srun under Slurm,
torchrun, submitit, or a plain single process), `init_distributed()` starts torch.distributed
on it (NCCL on CUDA, gloo on CPU) and binds this rank's GPU, and `MultiGPUWrapper` is the seed
guide's name for the DistributedDataParallel-wrapped model. The collectives below turn per-rank
numbers into global ones, so every logged figure is the whole job's.

Every collective waits at most MARKETGPT_DIST_TIMEOUT seconds (default 600). The job's
key-value store, with the error reports and heartbeats that name a failed rank, is
common.distributed.job_store's.
"""

from __future__ import annotations

import atexit
import contextlib
import datetime
import inspect
import os
from typing import Any, Optional

import torch
import torch.distributed as dist
from torch import nn

from common.distributed import job_store
from common.distributed.env import (
    DistEnv,
    check_num_gpus,
    collective_timeout_s,
    detect_env,
    rank_device,
    several_ranks,
)
from common.distributed.job_store import RankFailed
from common.errors import UserError

__all__ = [
    "MultiGPUWrapper",
    "all_gather_objects",
    "all_reduce_sum",
    "any_rank",
    "barrier",
    "init_distributed",
    "no_sync",
    "several_ranks",
    "shutdown",
    "unwrap",
    "was_distributed",
    "wrap_ddp",
]

_DEVICE = torch.device("cpu")  # where collective helper tensors live (CUDA under NCCL)
_WAS_DISTRIBUTED = False  # this process joined a process group (see common.cli.entry)


def was_distributed() -> bool:
    return _WAS_DISTRIBUTED


def init_distributed(
    env: Optional[DistEnv] = None, timeout_s: Optional[float] = None, device_setting: str = "auto"
) -> tuple[DistEnv, torch.device]:
    """Start torch.distributed for this rank and pick its device.

    Each rank binds the GPU of its local rank. `timeout_s` (default MARKETGPT_DIST_TIMEOUT)
    bounds the rendezvous and every collective. `device_setting` is training.device.
    """
    global _DEVICE, _WAS_DISTRIBUTED
    env = env or detect_env()
    device = rank_device(env, device_setting)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if env.distributed and not dist.is_initialized():
        timeout = datetime.timedelta(seconds=timeout_s or collective_timeout_s())
        # Surface NCCL failures as errors on every rank rather than silent hangs.
        os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")
        # torchrun's agent already serves the store at MASTER_PORT; otherwise rank 0 serves it.
        host = env.rank == 0 and not env.agent_store
        try:
            store = dist.TCPStore(
                env.master_addr,
                env.master_port,
                env.world_size,
                is_master=host,
                timeout=timeout,
                wait_for_workers=False,
            )
        except (RuntimeError, OSError) as e:
            raise UserError(
                f"rank {env.rank}: cannot reach the rendezvous at {env.master_addr}:{env.master_port} "
                f"({str(e).splitlines()[0]}); is the port free and the first node reachable? "
                "(set MASTER_PORT to pick another port)"
            ) from None
        try:
            dist.init_process_group(
                "nccl" if device.type == "cuda" else "gloo",
                store=store,
                rank=env.rank,
                world_size=env.world_size,
                timeout=timeout,
                device_id=device if device.type == "cuda" else None,
            )
        except (RuntimeError, OSError) as e:  # some rank never arrived, or died on the way
            raise RankFailed(
                f"rank {env.rank}: not all {env.world_size} ranks joined at {env.master_addr}:"
                f"{env.master_port} within {timeout.total_seconds():g} s "
                f"({str(e).splitlines()[0][:200]}); see the other ranks' logs"
            ) from None
        _DEVICE = device
        _WAS_DISTRIBUTED = True
        job_store.start(store, env, timeout)
        # A process that ends without calling shutdown() (a script, an exception) still stops the
        # heartbeat and destroys the process group before the interpreter tears down: left to the
        # C++ destructors, gloo's and the store's threads abort it ("terminate called ...", 134).
        atexit.register(shutdown)
    return env, device


def shutdown() -> None:
    job_store.close()
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def all_reduce_sum(values: torch.Tensor) -> torch.Tensor:
    """Sum a tensor over all ranks in place (a no-op in a single process); returns it."""
    if several_ranks():
        dist.all_reduce(values, op=dist.ReduceOp.SUM)
    return values


def any_rank(flag: bool) -> bool:
    """True on every rank if it is true on any rank (e.g. a checkpoint signal that reached one)."""
    if not several_ranks():
        return flag
    t = torch.tensor([1.0 if flag else 0.0], device=_DEVICE)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t.item() > 0)


def all_gather_objects(obj: Any) -> list[Any]:
    """Every rank's `obj`, in rank order (a one-element list in a single process)."""
    if not several_ranks():
        return [obj]
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def barrier() -> None:
    if several_ranks():
        dist.barrier()


# --------------------------------------------------------------------------- the model wrapper


def no_sync(model: nn.Module, skip: bool) -> contextlib.AbstractContextManager:
    """With skip, no gradient all-reduce in this backward (accumulation's micro-batches but the
    last): the model's no_sync (MultiGPUWrapper, DDP); a no-op for a model without one."""
    model_no_sync = getattr(model, "no_sync", None)
    return model_no_sync() if model_no_sync is not None and skip else contextlib.nullcontext()


def unwrap(model: nn.Module) -> nn.Module:
    """The plain model under MultiGPUWrapper, DDP, DataParallel and torch.compile wrappers."""
    while True:
        if isinstance(model, (MultiGPUWrapper, nn.parallel.DistributedDataParallel, nn.DataParallel)):
            model = model.module
        elif isinstance(orig := getattr(model, "_orig_mod", None), nn.Module):
            model = orig
        else:
            return model


def wrap_ddp(model: nn.Module, device: torch.device) -> nn.parallel.DistributedDataParallel:
    """`model` (on `device`) in DistributedDataParallel as this suite trains it, in the process
    group already started. Its buffers are constants (rotary tables): no broadcast before every forward."""
    ddp = nn.parallel.DistributedDataParallel
    new_name = "forward_sync_buffers" in inspect.signature(ddp).parameters  # torch 2.13 renamed it
    no_buffer_sync: dict[str, Any] = {"forward_sync_buffers" if new_name else "broadcast_buffers": False}
    return ddp(model, device_ids=[device.index] if device.type == "cuda" else None, **no_buffer_sync)


class MultiGPUWrapper(nn.Module):
    """The seed guide's wrapper, built on DistributedDataParallel (one process per GPU).

    `MultiGPUWrapper(model, num_gpus=2)` moves the model to this rank's device and wraps it
    in DDP when the job has more than one rank (starting torch.distributed if nobody has);
    in a single process it is a transparent pass-through. `num_gpus`, when given, must match
    the job's layout (see `check_num_gpus`), so a script asking for 2 GPUs never silently
    trains on 1. Checkpoints store `unwrap(model)`, the plain model.
    """

    def __init__(
        self,
        model: nn.Module,
        num_gpus: Optional[int] = None,
        env: Optional[DistEnv] = None,
        device: Optional[torch.device] = None,
    ) -> None:
        super().__init__()
        env = env or job_store.joined_env() or detect_env()
        check_num_gpus(num_gpus, env)
        if env.distributed and not dist.is_initialized():
            env, device = init_distributed(env)
        device = device or rank_device(env)
        model = model.to(device)
        self.module: nn.Module = wrap_ddp(model, device) if several_ranks() else model

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.module(*args, **kwargs)

    def no_sync(self) -> contextlib.AbstractContextManager:
        """Skip the gradient all-reduce (every micro-step of accumulation but the last)."""
        if isinstance(self.module, nn.parallel.DistributedDataParallel):
            return self.module.no_sync()
        return contextlib.nullcontext()

    @property
    def model(self) -> nn.Module:
        return unwrap(self.module)
