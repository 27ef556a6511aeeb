"""What the Trainer reports besides its progress line and training_log.json's bookkeeping: the
start-up banner, the tracker's scalars (per log step and per epoch), MFU and every rank's GPU
health, in one object the Trainer calls at start-up, every log step and every epoch.

The tracker (training.tracker: TensorBoard in `run_dir/tensorboard`, or wandb / MLflow, see
trackers.py) is written by rank 0 alone and opened on the first scalar (its import is slow).
Every tag shares one x axis, the global optimizer step. MFU
(mfu.py) needs a peak (training.peak_flops or a known card); GPU readings (gpu_stats.py) are
gathered from every rank, so `epoch_readings` is a collective under DDP.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Optional, TextIO

import torch

from common.distributed.ddp import all_gather_objects
from common.distributed.precision import describe_precision
from common.training.gpu_stats import format_gpu_line, gpu_stats
from common.training.mfu import device_peak_flops, mfu
from common.training.trackers import check_tracker, open_tracker

if TYPE_CHECKING:  # the banner reads the Trainer's set-up; trainer.py imports this module
    from common.training.trainer import Trainer

__all__ = ["EpochReadings", "TrainingMetrics"]

_GPU_SCALARS = ("util_pct", "mem_allocated_gb", "mem_peak_gb", "nvml_mem_used_gb", "temperature_c", "power_w")


@dataclass(frozen=True)
class EpochReadings:
    tokens_per_sec: float  # the whole job's, over the epoch's timed steps
    mfu: Optional[float]  # None without a peak
    gpus: Optional[list[dict[str, Any]]]  # every rank's GPU, in rank order; None on the CPU


class TrainingMetrics:
    """The Trainer's telemetry. `is_main`: this rank prints and writes the tracker (rank 0).
    `tensorboard`: scalars go to the tracker at all (tests turn it off); `tracker`: which one
    (training.tracker), given `config` (the run's, as a dict) and the run folder."""

    def __init__(
        self,
        run_dir: Path,
        device: torch.device,
        world_size: int,
        *,
        is_main: bool,
        tensorboard: bool,
        flops_per_token: int,
        peak_flops: Optional[float] = None,
        tracker: str = "tensorboard",
        config: Optional[Mapping[str, Any]] = None,
    ) -> None:
        self.run_dir, self.device, self.world_size, self.is_main = Path(run_dir), device, world_size, is_main
        self.cuda = device.type == "cuda"
        self.tensorboard = tensorboard and is_main
        self.tracker, self.config = tracker, dict(config or {})
        if self.tensorboard:
            check_tracker(tracker)  # a missing package stops the run before its first step
        # MFU in the epoch log: model FLOPs per token against one device's peak (None: unknown)
        self.flops_per_token = flops_per_token
        self.peak_flops = device_peak_flops(device, peak_flops)
        self.resumed_at = 0  # global step of the loaded checkpoint (TensorBoard drops what came after)
        self._writer: Any = None

    # ------------------------------------------------------------------ the tracker

    def scalar(self, tag: str, value: float, step: int) -> None:
        if not self.tensorboard:
            return
        if self._writer is None:
            self._writer = open_tracker(self.tracker, self.run_dir, self.config, self.resumed_at)
        self._writer.scalar(tag, value, step)

    def log_step(self, step: int, loss: float, lr: float, tokens_per_sec: float, grad_norm: Optional[float]) -> None:
        """Every training.log_every_steps optimizer steps."""
        self.scalar("train/step_loss", loss, step)
        self.scalar("train/lr", lr, step)
        self.scalar("train/tokens_per_sec", tokens_per_sec, step)
        if grad_norm is not None:
            self.scalar("train/grad_norm", grad_norm, step)

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    # ------------------------------------------------------------------ epochs

    def epoch_readings(self, tokens_per_sec: float) -> EpochReadings:
        """MFU and every rank's GPU readings (peak memory since the last epoch). Every rank calls
        it at the same point: a collective under DDP."""
        return EpochReadings(
            tokens_per_sec,
            mfu(tokens_per_sec, self.flops_per_token, self.peak_flops, self.world_size),
            self._gpu_health(),
        )

    def _gpu_health(self) -> Optional[list[dict[str, Any]]]:
        if not self.cuda:
            return None
        stats = gpu_stats(self.device)
        assert stats is not None  # on a GPU
        return all_gather_objects(stats) if self.world_size > 1 else [stats]

    def log_epoch(self, step: int, scalars: dict[str, float], readings: EpochReadings) -> None:
        """The epoch's TensorBoard scalars: MFU, each GPU's readings, then `scalars` (tag -> value)."""
        if readings.mfu is not None:
            self.scalar("epoch/mfu", readings.mfu, step)
        for rank, g in enumerate(readings.gpus or []):
            for key in _GPU_SCALARS:
                if g.get(key) is not None:
                    self.scalar(f"gpu{rank}/{key}", g[key], step)
        for tag, value in scalars.items():
            self.scalar(tag, value, step)  # one x axis (global step) for every tag

    def print_epoch(self, summary: str, readings: EpochReadings, out: TextIO) -> None:
        """Rank 0: the seed's epoch block, then throughput and MFU (with a peak) and a line per GPU."""
        if not self.is_main:
            return
        print(summary, file=out, flush=True)
        if readings.mfu is not None and self.peak_flops is not None:  # an MFU needs the peak
            print(
                f"Throughput: {readings.tokens_per_sec / 1000:.1f}k tok/s | MFU: {100 * readings.mfu:.1f}% of "
                f"{self.peak_flops / 1e12:g} TFLOP/s per device",
                file=out,
                flush=True,
            )
        for rank, g in enumerate(readings.gpus or []):
            print(format_gpu_line(rank, g), file=out, flush=True)

    # ------------------------------------------------------------------ start-up

    def banner(self, tr: Trainer, out: TextIO) -> None:
        """Rank 0: devices, compile, DDP, precision, batch and model size, and where training starts."""
        if not self.is_main:
            return
        t = tr.t
        if tr.cuda:
            print(f"Using GPUs: {tr.world_size}", file=out)
            if tr.step.compiled:
                print(
                    f"torch.compile: on (mode {tr.step.compile_mode}{': CUDA graphs' if tr.step.cuda_graphs else ''})",
                    file=out,
                )
                if tr.step.compile_mode_note:
                    print(f"WARNING: {tr.step.compile_mode_note}", file=out)
            elif t.compile:
                print(
                    f"WARNING: torch.compile: off, training eagerly (slower; --set training.compile=false "
                    f"silences this): {tr.step.compile_problem}",
                    file=out,
                )
        else:
            print(
                "Training on the CPU (training.device=cpu)"
                if t.device == "cpu"
                else "CUDA not available: training on CPU",
                file=out,
            )
            if t.compile:
                print("training.compile is ignored on the CPU", file=out)
        if tr.world_size > 1:
            print(f"DDP: {tr.world_size} processes ({'nccl' if tr.cuda else 'gloo'})", file=out)
        print(
            f"Precision: {describe_precision(tr.step.precision, tr.device)} (training.precision={t.precision})"
            + (" | gradient checkpointing: on" if t.gradient_checkpointing else ""),
            file=out,
        )
        print(
            f"Effective batch size: {tr.effective_batch_size} "
            f"({t.batch_size} per process x {tr.world_size} processes x {t.grad_accum_steps} accumulation)",
            file=out,
        )
        print(
            f"Model parameters: {tr.model.num_parameters():,} | train windows: "
            f"{tr.windows.num_windows('train'):,} | steps per epoch: {tr.steps_per_epoch:,}",
            file=out,
        )
        if tr.epoch >= t.epochs or tr.early_stopping.exhausted():
            stopped = ", stopped early" if tr.epoch < t.epochs else ""
            print(
                f"Nothing left to train ({tr.epoch} of {t.epochs} epochs done{stopped}): writing the final outputs",
                file=out,
            )
        elif tr.global_step:
            print(
                f"Resuming at epoch {tr.epoch + 1}, step {tr.step_in_epoch} of {tr.steps_per_epoch} "
                f"(global step {tr.global_step})",
                file=out,
            )
        out.flush()
