"""The training loop: AdamW, cosine LR with warmup, clipping, accumulation, early stopping,
checkpoints on epochs, on a timer and on signals, and an exact resume.

The Trainer's whole state is `state_dict()` / `load_state_dict()`, like any torch object:
model, optimizer, schedule position, epoch and step within it, the partial sums of the
epoch in progress, early-stopping state, RNG states (python, numpy, torch, cuda), the log so
far and the resolved config. Resuming from it replays the run bit for bit on the CPU: the
batch order comes from (seed, epoch) and dropout from the restored torch RNG.

Signals (handled at the next step boundary; the handler only sets a flag):
- SIGUSR1: save a step checkpoint and carry on.
- SIGTERM, SIGUSR2 (preemption, Slurm's warning before the time limit): save a step
  checkpoint and stop; `train()` returns "interrupted" and the command exits with
  EXIT_REQUEUE (75, EX_TEMPFAIL: "try again"), which the Slurm scripts read as "requeue me".
Under DDP a signal that reached any rank (and the checkpoint timer of any rank) is agreed on
in the per-step all-reduce, so every rank checkpoints and stops at the same step; the
checkpoint then also holds each rank's RNG state (`rng_per_rank`).
"""
from __future__ import annotations

import contextlib
import functools
import math
import signal
import sys
import time
from pathlib import Path
from typing import Any, Callable, Iterator, Optional, TextIO

import torch
import torch.nn.functional as F

from common.training.batches import TokenWindows
from common.training.checkpoint import (CheckpointWriter, epoch_checkpoint_name, prune_checkpoints, remove_stale_temp_files,
                               step_checkpoint_name, unwrap_state_dict)
from common.config import Config, config_to_dict
from common.distributed.ddp import all_gather_objects, all_reduce_sum, barrier, before_abort, unwrap, wait_for_main
from common.errors import UserError
from common.training.lr_schedule import lr_at
from common.training.gpu_stats import format_gpu_line, gpu_stats
from common.training.mfu import device_peak_flops, mfu
from common.distributed.precision import (autocast, compile_problem, describe_precision, grad_scaler, resolve_precision,
                              use_tf32)
from common.distributed.requeue import EXIT_REQUEUE
from common.training.rng import rng_state, seed_everything, set_rng_state
from common.special_tokens import PAD_TOKEN
from common.training.log import Progress, TrainingLog, epoch_summary

__all__ = ["EXIT_REQUEUE", "Trainer", "pick_device"]

_STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR2)
_SAVE_SIGNALS = (signal.SIGUSR1,)
_SIGNAL_ORDER = _STOP_SIGNALS + _SAVE_SIGNALS  # when ranks got different signals, the first wins


def pick_device() -> torch.device:
    return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")


class Trainer:
    """Trains `model` on `windows` and writes checkpoints and training_log.json to `run_dir`.

    rank / world_size shard the batches for DDP (wrapping the model in MultiGPUWrapper is the
    caller's job). Under DDP every rank runs this same loop: per-step sums, signals and the
    checkpoint timer go through one all-reduce, so all ranks log the same global numbers and
    checkpoint at the same step; only rank 0 writes files and prints.
    """

    def __init__(self, cfg: Config, model: torch.nn.Module, windows: TokenWindows, run_dir: Path, *,
                 device: Optional[torch.device] = None, rank: int = 0, world_size: int = 1,
                 out: Optional[TextIO] = None, metadata: Optional[dict[str, Any]] = None,
                 tensorboard: bool = True) -> None:
        t = cfg.training
        self.cfg, self.windows, self.run_dir = cfg, windows, Path(run_dir)
        self.device = device or windows.device
        self.rank, self.world_size, self.out = rank, world_size, out or sys.stdout
        self.is_main = rank == 0
        self.cuda = self.device.type == "cuda"

        if t.device == "cuda" and not self.cuda:
            raise UserError(f"training.device=cuda but this process trains on {self.device}; "
                            "run `marketgpt doctor` on the node")
        self.model = unwrap(model).to(self.device)
        self.model.gradient_checkpointing = t.gradient_checkpointing
        self.train_model = model.to(self.device)  # what forward runs through (DDP / compiled)
        self.precision = resolve_precision(t.precision, self.device)
        self.tf32 = use_tf32(self.device)
        self.scaler = grad_scaler(self.precision, self.device)  # fp16 only
        # why training.compile cannot run on this node (None: it can, or it is off / on the CPU)
        self.compile_problem = compile_problem() if self.cuda and t.compile else None
        self.compiled = self.cuda and t.compile and self.compile_problem is None
        if self.compiled:
            self.train_model = torch.compile(self.train_model)
        self.optimizer = self.model.configure_optimizer(t.weight_decay, t.learning_rate, (t.beta1, t.beta2),
                                                        self.device.type)
        # the kernel choice this device wants; a checkpoint's param_groups carry the saving device's
        self._kernel_flags = [{k: g.get(k) for k in ("fused", "foreach")} for g in self.optimizer.param_groups]
        # the per-step signal/timer flags, filled on the host and copied without a sync
        self._flags = torch.zeros(len(_SIGNAL_ORDER) + 1, dtype=torch.float64, pin_memory=self.cuda)
        # MFU in the epoch log: model FLOPs per token against one device's peak (None: unknown)
        self.flops_per_token = self.model.flops_per_token(windows.context_length)
        self.peak_flops = device_peak_flops(self.device, t.peak_flops)

        # full global batches only: DDP's gradient mean equals one big batch's only when every rank has one
        batches = windows.num_batches("train", t.batch_size, world_size, drop_last=True,
                                      shuffle=True) // t.grad_accum_steps
        self.steps_per_epoch = min(batches, t.max_steps_per_epoch or batches)
        if self.steps_per_epoch == 0:
            raise UserError(f"{windows.num_windows('train')} training windows are too few for one optimizer step "
                            f"(training.batch_size {t.batch_size} x grad_accum_steps {t.grad_accum_steps} x "
                            f"{world_size} processes); lower them or use more data")
        self.total_steps = t.epochs * self.steps_per_epoch
        self._lr_restart: Optional[tuple[int, float]] = None  # (step, lr) where a changed length took over
        self.effective_batch_size = t.batch_size * world_size * t.grad_accum_steps

        # progress: `epoch` counts finished epochs; the one in progress is epoch + 1 (1-based)
        self.epoch = 0
        self.step_in_epoch = 0
        self.global_step = 0
        self.elapsed_before = 0.0  # seconds trained by earlier sessions of this run
        self.sums = _new_sums()  # the epoch in progress: loss x tokens, correct, tokens, seconds
        self.best_val_loss = math.inf
        self.best_epoch: Optional[int] = None
        self.bad_epochs = 0
        self.log = TrainingLog(metadata)

        self._tensorboard = tensorboard and self.is_main
        self._writer = None
        self._pending_signal: Optional[int] = None
        self._session_start = time.monotonic()
        self._next_timer = math.inf
        self._resumed_at = 0  # global step of the loaded checkpoint
        self._checkpoints = CheckpointWriter()
        if self.is_main and world_size > 1:
            before_abort(self._checkpoints.wait)
        if self.is_main:
            for path in remove_stale_temp_files(self.run_dir):
                print(f"Removed {path.name}, left by a writer that was killed", file=self.out, flush=True)

    # ------------------------------------------------------------------ state

    def state_dict(self) -> dict[str, Any]:
        """Everything a resume needs; only tensors and plain containers (weights_only-safe)."""
        return {
            "model": unwrap_state_dict(self.model.state_dict()),
            "optimizer": self.optimizer.state_dict(),
            # fp16's loss scale and its growth tracker; None in bf16 / fp32, which need no scaler
            "grad_scaler": self.scaler.state_dict() if self.scaler is not None else None,
            "lr_schedule": {"total_steps": self.total_steps,
                            "restart": list(self._lr_restart) if self._lr_restart else None},
            "progress": {"epoch": self.epoch, "step_in_epoch": self.step_in_epoch,
                         "global_step": self.global_step, "steps_per_epoch": self.steps_per_epoch,
                         "world_size": self.world_size, "elapsed_s": self.elapsed_before + self._session_seconds()},
            "epoch_sums": dict(self.sums),
            "early_stopping": {"best_val_loss": self.best_val_loss, "best_epoch": self.best_epoch,
                               "bad_epochs": self.bad_epochs},
            "rng": rng_state(),
            "log": self.log.data,
            "config": config_to_dict(self.cfg),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        p = state["progress"]
        if p["steps_per_epoch"] != self.steps_per_epoch:
            raise UserError(f"the checkpoint has {p['steps_per_epoch']} steps per epoch but this run has "
                            f"{self.steps_per_epoch}: the data, batch size or world size changed; "
                            "resume with the same ones")
        self.model.load_state_dict(unwrap_state_dict(state["model"]))
        self.optimizer.load_state_dict(state["optimizer"])
        for group, flags in zip(self.optimizer.param_groups, self._kernel_flags):
            group.update(flags)  # a CPU checkpoint resumed on a GPU keeps the fused AdamW
        if self.scaler is not None and state.get("grad_scaler"):
            self.scaler.load_state_dict(state["grad_scaler"])
        self.epoch, self.step_in_epoch, self.global_step = p["epoch"], p["step_in_epoch"], p["global_step"]
        self.elapsed_before = float(p["elapsed_s"])
        self.sums = dict(state["epoch_sums"])
        es = state["early_stopping"]
        self.best_val_loss, self.best_epoch, self.bad_epochs = es["best_val_loss"], es["best_epoch"], es["bad_epochs"]
        self._continue_lr_schedule(state)
        # each rank continues its own random streams (dropout) when the checkpoint has them
        per_rank = state.get("rng_per_rank") or []
        if self.rank < len(per_rank):
            set_rng_state(per_rank[self.rank])
        else:
            set_rng_state(state["rng"])
            if self.rank > 0:  # a rank added on resume (more GPUs now): its own streams, not rank 0's
                seed_everything(self.cfg.training.seed + 7919 * self.rank + 1_000_003 * self.global_step)
        saved_world = p.get("world_size", 1)
        if saved_world != self.world_size and self.is_main:
            print(f"warning: the checkpoint was trained by {saved_world} process(es), this run has "
                  f"{self.world_size}: the effective batch size changes", file=self.out, flush=True)
        self.log = TrainingLog()
        self.log.data = dict(state["log"])
        self._resumed_at = self.global_step
        self._session_start = time.monotonic()

    def _continue_lr_schedule(self, state: dict[str, Any]) -> None:
        """Keep the learning rate continuous when the run's length changed (training.epochs set
        anew on resume): from here on it decays from the rate of the last step to the floor over
        the new remaining steps, instead of jumping onto the cosine of the new length."""
        t = self.cfg.training
        saved = state.get("lr_schedule") or {}
        restart = saved.get("restart")
        self._lr_restart = (int(restart[0]), float(restart[1])) if restart else None
        saved_total = saved.get("total_steps", (state.get("scheduler") or {}).get("total_steps", self.total_steps))
        if saved_total != self.total_steps and self.global_step > 0 and self.global_step >= t.warmup_steps:
            last = lr_at(self.global_step - 1, t.learning_rate, t.warmup_steps, saved_total, t.min_lr_ratio,
                         self._lr_restart)
            self._lr_restart = (self.global_step, last)

    def lr(self, step: int) -> float:
        """The learning rate of optimizer step `step` (0-based) in this run."""
        t = self.cfg.training
        return lr_at(step, t.learning_rate, t.warmup_steps, self.total_steps, t.min_lr_ratio, self._lr_restart)

    # ------------------------------------------------------------------ the loop

    def train(self, stop_after_steps: Optional[int] = None,
              final_outputs: Optional[Callable[[str], None]] = None) -> str:
        """Train to the end; returns "finished", "early_stopped", "failed", "interrupted"
        (checkpoint saved on SIGTERM/SIGUSR2) or "stopped" (checkpoint saved at
        `stop_after_steps` global steps, for tests and short slices of a run).

        When training ends ("finished"/"early_stopped"), rank 0 calls `final_outputs(status)`
        (test results, report) once every checkpoint is on disk, and only then writes that
        status into training_log.json: a run whose log says it is done has all of its outputs.
        A run resumed with nothing left to train goes straight there."""
        t = self.cfg.training
        self._announce()
        self.log.data["precision"] = self.precision
        self._session_start = time.monotonic()
        self._next_timer = self._session_start + 60.0 * t.checkpoint_every_minutes
        # a GPU's first step sets up cuBLAS/cuDNN and the allocator (and compiles, when on): on an
        # H100 case A's 150-step eager epoch averaged 415k tok/s with it, its later steps ~475k
        self._warming_up = self.cuda
        self.log.set_status("running")
        self.log.data.pop("interrupted", None)
        self._write_log()  # jq works on the log from the first step on
        with self._signal_flags():
            try:
                status = self._loop(stop_after_steps)
            except BaseException:
                self._finish_writing(raise_errors=False)  # the loop's own error is the one to report
                raise
            self._finish_writing(raise_errors=True)
            # no rank exits before the checkpoints are on disk: a launcher that sees one rank
            # exit (torchrun, srun --kill-on-bad-exit) kills the others, rank 0 with its writes
            barrier()
            if status in ("finished", "early_stopped"):
                if final_outputs is not None and self.is_main:
                    final_outputs(status)
                self.log.set_status(status)
                self._write_log()
                wait_for_main("final outputs")  # no rank leaves while rank 0 scores the test split
            return status

    def _finish_writing(self, raise_errors: bool) -> None:
        try:
            if self.is_main:
                try:
                    self._checkpoints.wait()  # on disk before anyone reads them, or this process exits
                except Exception as e:
                    if raise_errors:
                        raise
                    print(f"warning: a checkpoint could not be written ({type(e).__name__}: {e})",
                          file=sys.stderr, flush=True)
        finally:
            if self._writer is not None:
                self._writer.close()
                self._writer = None

    def _loop(self, stop_after_steps: Optional[int]) -> str:
        t = self.cfg.training
        while self.epoch < t.epochs and not self._patience_exhausted():
            outcome = self._train_epoch(stop_after_steps)
            if outcome is not None:
                return outcome
            val_loss, val_acc = self.evaluate("val", t.eval_max_batches)
            if not math.isfinite(val_loss):
                return self._fail(f"non-finite validation loss ({val_loss}) after epoch {self.epoch + 1}")
            self._end_epoch(val_loss, val_acc)
            _, sig, _ = self._agree(torch.zeros(3, dtype=torch.float64, device=self.device))
            if sig in _STOP_SIGNALS:  # the epoch checkpoint was just written
                return self._interrupt(sig, epoch_checkpoint_name(self.epoch))
            # SIGUSR1: the epoch checkpoint was just written
        # the status goes into the log in train(), after the final outputs
        return "early_stopped" if self._patience_exhausted() and self.epoch < t.epochs else "finished"

    def _train_epoch(self, stop_after_steps: Optional[int]) -> Optional[str]:
        """Run the rest of the epoch in progress; returns a status if training must stop."""
        t = self.cfg.training
        accum = t.grad_accum_steps
        batches = self.windows.batches("train", t.batch_size, shuffle=True, seed=t.seed, epoch=self.epoch,
                                       rank=self.rank, world_size=self.world_size, drop_last=True,
                                       start=self.step_in_epoch * accum, limit=self.steps_per_epoch * accum)
        progress = Progress(self.epoch + 1, t.epochs, self.steps_per_epoch, self.step_in_epoch,
                            t.log_every_steps, self.out, enabled=self.is_main)
        self.train_model.train()
        try:
            while self.step_in_epoch < self.steps_per_epoch:
                tic = time.monotonic()
                lr = self.lr(self.global_step)
                for group in self.optimizer.param_groups:
                    group["lr"] = lr
                sums = self._accumulate_gradients(batches, accum)
                # Clip before the agreement, so the step waits for the device once: the norm rides
                # in the same all-reduce (rank 0's alone: DDP gave every rank the same gradients).
                norm = torch.zeros(1, dtype=torch.float64, device=self.device)
                if t.gradient_clip > 0:
                    if self.scaler is not None:
                        self.scaler.unscale_(self.optimizer)  # clip the true gradients
                    clipped = torch.nn.utils.clip_grad_norm_(self.model.parameters(), t.gradient_clip)
                    if self.is_main:
                        norm = clipped.reshape(1).double()
                values, sig, timer_due = self._agree(torch.cat([sums, norm]))
                loss_sum, correct, tokens = values[0], int(values[1]), int(values[2])  # the whole job's
                if not math.isfinite(loss_sum):
                    return self._fail(f"non-finite training loss ({loss_sum / max(tokens, 1)}) at step "
                                      f"{self.global_step + 1} (epoch {self.epoch + 1}); nothing of it was "
                                      "saved; lower training.learning_rate or check the data")
                grad_norm = values[3] if t.gradient_clip > 0 else None
                if grad_norm is not None and not math.isfinite(grad_norm):
                    if self.scaler is None:
                        return self._fail(f"non-finite gradient norm at step {self.global_step + 1} "
                                          f"(epoch {self.epoch + 1}); lower training.learning_rate")
                    grad_norm = None  # fp16 overflow: the scaler skips this step and lowers its scale
                if self.scaler is not None:
                    self.scaler.step(self.optimizer)
                    self.scaler.update()
                else:
                    self.optimizer.step()
                self.optimizer.zero_grad(set_to_none=True)
                self.step_in_epoch += 1
                self.global_step += 1
                seconds = time.monotonic() - tic
                s = self.sums
                s["loss"] += loss_sum
                s["correct"] += correct
                s["tokens"] += tokens
                if self._warming_up:
                    self._warming_up = False
                else:
                    s["seconds"] += seconds
                    s["seen"] += t.batch_size * accum * self.windows.context_length
                step_tps = t.batch_size * accum * self.windows.context_length * self.world_size / max(seconds, 1e-9)
                progress.update(self.step_in_epoch, loss_sum / max(tokens, 1), lr, step_tps)
                if self.global_step % t.log_every_steps == 0:
                    self._scalar("train/step_loss", loss_sum / max(tokens, 1), self.global_step)
                    self._scalar("train/lr", lr, self.global_step)
                    self._scalar("train/tokens_per_sec", step_tps, self.global_step)
                    if grad_norm is not None:
                        self._scalar("train/grad_norm", grad_norm, self.global_step)
                outcome = self._step_boundary(stop_after_steps, sig, timer_due)
                if outcome is not None:
                    return outcome
        finally:
            progress.close()
        return None

    def _accumulate_gradients(self, batches: Iterator, accum: int) -> torch.Tensor:
        """Forward and backward over `accum` micro-batches; returns this rank's (summed token
        loss, correct predictions, target tokens) over them, a float64 tensor on the device.
        Under DDP the gradients are all-reduced on the last micro-batch only."""
        sums = torch.zeros(3, device=self.device, dtype=torch.float64)
        for i in range(accum):
            b = next(batches)
            with self._no_sync(last=i == accum - 1):
                with self._autocast():
                    logits, loss = self.train_model(b.x, b.asset_ids, b.category_ids, b.y, **b.extra_inputs())
                scaled = loss / accum
                (self.scaler.scale(scaled) if self.scaler is not None else scaled).backward()
            with torch.no_grad():
                mask = b.y != PAD_TOKEN
                n = mask.sum()
                sums[0] += loss.detach().double() * n
                sums[1] += ((logits.argmax(dim=-1) == b.y) & mask).sum()
                sums[2] += n
        return sums

    def _no_sync(self, last: bool) -> contextlib.AbstractContextManager:
        no_sync = getattr(self.train_model, "no_sync", None)  # MultiGPUWrapper / DDP
        return no_sync() if no_sync is not None and not last else contextlib.nullcontext()

    def _agree(self, sums: torch.Tensor) -> tuple[list[float], Optional[int], bool]:
        """All ranks' `sums` added up, the signal any rank got (stop beats save) and whether
        any rank's checkpoint timer is due: one all-reduce, one host sync per step."""
        pending, self._pending_signal = self._pending_signal, None
        for i, s in enumerate(_SIGNAL_ORDER):
            self._flags[i] = float(pending == s)
        self._flags[-1] = float(time.monotonic() >= self._next_timer)
        # pinned host buffer -> device without waiting; reused only after tolist() waited for it
        flags = self._flags.to(sums.device, non_blocking=True)
        values = all_reduce_sum(torch.cat([sums, flags])).tolist()  # the step's one wait for the device
        n = len(sums)
        sig = next((s for s, count in zip(_SIGNAL_ORDER, values[n:]) if count > 0), None)
        return values[:n], sig, values[-1] > 0

    def _step_boundary(self, stop_after_steps: Optional[int], sig: Optional[int] = None,
                       timer_due: bool = False) -> Optional[str]:
        """Checkpoints that happen between steps: signals, the timer, a requested stop
        (`sig` and `timer_due` as agreed by all ranks)."""
        if self.is_main:
            self._checkpoints.check()  # a checkpoint that failed to publish stops the run now
        name = step_checkpoint_name(self.epoch + 1, self.step_in_epoch)
        if sig in _STOP_SIGNALS:
            self._save(name)
            return self._interrupt(sig, name)
        if stop_after_steps is not None and self.global_step >= stop_after_steps:
            self._save(name)
            self._write_log()
            return "stopped"
        if sig in _SAVE_SIGNALS or timer_due:
            self._save(name)
            self._write_log()
        return None

    def _end_epoch(self, val_loss: float, val_acc: float) -> None:
        t = self.cfg.training
        s = self.sums
        train_loss, train_acc = s["loss"] / max(s["tokens"], 1), s["correct"] / max(s["tokens"], 1)
        tokens_per_sec = s["seen"] * self.world_size / max(s["seconds"], 1e-9)
        epoch_mfu = mfu(tokens_per_sec, self.flops_per_token, self.peak_flops, self.world_size)
        gpus = self._gpu_health()
        self.epoch += 1
        self.step_in_epoch = 0
        self.sums = _new_sums()
        if val_loss < self.best_val_loss:
            self.best_val_loss, self.best_epoch, self.bad_epochs = val_loss, self.epoch, 0
            self.log.set_best(val_loss, self.epoch)
            self._save_best(val_loss)
        else:
            self.bad_epochs += 1
        elapsed = self.elapsed_before + self._session_seconds()
        eta = elapsed / self.epoch * (t.epochs - self.epoch)
        lr = self.optimizer.param_groups[0]["lr"]
        self.log.add_epoch(epoch=self.epoch, train_loss=train_loss, train_acc=train_acc, val_loss=val_loss,
                           val_acc=val_acc, lr=lr, tokens_per_sec=tokens_per_sec, elapsed_s=round(elapsed, 3),
                           eta_s=round(eta, 3), step=self.global_step, mfu=epoch_mfu, gpus=gpus)
        if epoch_mfu is not None:
            self._scalar("epoch/mfu", epoch_mfu, self.global_step)
        for rank, g in enumerate(gpus or []):
            for key in ("util_pct", "mem_allocated_gb", "mem_peak_gb", "nvml_mem_used_gb", "temperature_c", "power_w"):
                if g.get(key) is not None:
                    self._scalar(f"gpu{rank}/{key}", g[key], self.global_step)
        for name, value in (("loss/train", train_loss), ("loss/val", val_loss), ("accuracy/train", train_acc),
                            ("accuracy/val", val_acc), ("epoch/lr", lr), ("epoch/tokens_per_sec", tokens_per_sec),
                            ("epoch/epoch", self.epoch)):
            self._scalar(name, value, self.global_step)  # one x axis (global step) for every tag
        self._save(epoch_checkpoint_name(self.epoch))
        self._write_log()
        if self.is_main:
            print(epoch_summary(self.epoch, t.epochs, train_loss, train_acc, val_loss, val_acc, elapsed, eta),
                  file=self.out, flush=True)
            if epoch_mfu is not None:
                print(f"Throughput: {tokens_per_sec / 1000:.1f}k tok/s | MFU: {100 * epoch_mfu:.1f}% of "
                      f"{self.peak_flops / 1e12:g} TFLOP/s per device", file=self.out, flush=True)
            for rank, g in enumerate(gpus or []):
                print(format_gpu_line(rank, g), file=self.out, flush=True)

    def _gpu_health(self) -> Optional[list[dict[str, Any]]]:
        """Every rank's GPU readings for this epoch (peak memory since the last epoch), in rank
        order; None on the CPU. Every rank calls it at the same point (a collective under DDP)."""
        if not self.cuda:
            return None
        stats = gpu_stats(self.device)
        return all_gather_objects(stats) if self.world_size > 1 else [stats]

    @torch.no_grad()
    def evaluate(self, split: str, max_batches: Optional[int] = None,
                 model: Optional[torch.nn.Module] = None) -> tuple[float, float]:
        """Token-weighted mean loss and accuracy over `split` (non-PAD targets), in eval mode.

        Under DDP each rank scores its slices of the batches with the plain model (no DDP
        forward, so uneven slices can't deadlock) and the sums are all-reduced."""
        model = model or (self.model if self.world_size > 1 else self.train_model)
        was_training = model.training
        model.eval()
        loss_sum = torch.zeros((), device=self.device, dtype=torch.float64)
        correct = torch.zeros((), device=self.device, dtype=torch.int64)
        tokens = torch.zeros((), device=self.device, dtype=torch.int64)
        try:
            for b in self.windows.batches(split, self.cfg.training.batch_size, shuffle=False, rank=self.rank,
                                          world_size=self.world_size, limit=max_batches):
                with self._autocast():
                    logits, _ = model(b.x, b.asset_ids, b.category_ids, **b.extra_inputs())
                logits = logits.float()
                loss_sum += F.cross_entropy(logits.view(-1, logits.size(-1)), b.y.reshape(-1),
                                            ignore_index=PAD_TOKEN, reduction="sum").double()
                mask = b.y != PAD_TOKEN
                correct += ((logits.argmax(dim=-1) == b.y) & mask).sum()
                tokens += mask.sum()
        finally:
            model.train(was_training)
        loss_sum, correct, tokens = all_reduce_sum(torch.stack([loss_sum, correct.double(), tokens.double()])).tolist()
        n = max(tokens, 1.0)
        return loss_sum / n, correct / n

    # ------------------------------------------------------------------ helpers

    def _patience_exhausted(self) -> bool:
        patience = self.cfg.training.early_stopping_patience
        return patience > 0 and self.bad_epochs >= patience

    def _fail(self, error: str) -> str:
        self.optimizer.zero_grad(set_to_none=True)
        self.log.set_status("failed", error, failed_step=self.global_step + 1)
        self._write_log()
        if self.is_main:
            print(f"Training failed: {error}", file=self.out, flush=True)
        return "failed"

    def _interrupt(self, sig: int, checkpoint: str) -> str:
        name = signal.Signals(sig).name
        self.log.data["interrupted"] = (f"{name} at epoch {self.epoch + 1} step {self.step_in_epoch}; "
                                        f"saved {checkpoint}; continue with --resume auto")
        self._write_log()
        if self.is_main:
            print(f"Received {name}: saved {checkpoint}, stopping (exit {EXIT_REQUEUE} = requeue)",
                  file=self.out, flush=True)
        return "interrupted"

    def _save(self, name: str) -> None:
        """Every rank calls this at the same step; rank 0 serializes the state, then all meet at a
        barrier, so no rank runs ahead of it (train() waits for the file to be on disk)."""
        self._next_timer = time.monotonic() + 60.0 * self.cfg.training.checkpoint_every_minutes
        rngs = all_gather_objects(rng_state()) if self.world_size > 1 else None
        if self.is_main:
            state = {"format": "marketgpt-checkpoint", "version": 1, **self.state_dict()}
            if rngs is not None:
                state["rng_per_rank"] = rngs
            # training goes on once the state is serialized; the writer prunes after publishing
            self._checkpoints.save(state, self.run_dir / name, then=functools.partial(
                prune_checkpoints, self.run_dir, keep=self.cfg.training.keep_checkpoints))
        barrier()

    def _save_best(self, val_loss: float) -> None:
        if not self.is_main:
            barrier()
            return
        self._checkpoints.save({"format": "marketgpt-best-model", "version": 1,
                         "model": unwrap_state_dict(self.model.state_dict()),
                         "model_config": config_to_dict(self.cfg)["model"],
                         "num_assets": self.model.num_assets, "num_categories": self.model.num_categories,
                         "epoch": self.epoch, "global_step": self.global_step, "val_loss": float(val_loss),
                         "config": config_to_dict(self.cfg)}, self.run_dir / "best_model.pt")
        barrier()

    def _write_log(self) -> None:
        if self.is_main:
            self.log.write(self.run_dir / "training_log.json")

    def _session_seconds(self) -> float:
        return time.monotonic() - self._session_start

    def _autocast(self) -> contextlib.AbstractContextManager:
        return autocast(self.precision, self.device)  # training.precision, resolved for this device

    def _scalar(self, tag: str, value: float, step: int) -> None:
        if not self._tensorboard:
            return
        if self._writer is None:
            from torch.utils.tensorboard import SummaryWriter  # slow import: only when used

            # After a resume, drop what an earlier session logged past the checkpoint (steps
            # beyond the resumed global step): that part of the run is being redone.
            self._writer = SummaryWriter(log_dir=str(self.run_dir / "tensorboard"),
                                         purge_step=self._resumed_at + 1 if self._resumed_at else None)
        self._writer.add_scalar(tag, value, step)

    def _announce(self) -> None:
        if not self.is_main:
            return
        t = self.cfg.training
        if self.cuda:
            print(f"Using GPUs: {self.world_size}", file=self.out)
            if self.compiled:
                print("torch.compile: on", file=self.out)
            elif t.compile:
                print(f"WARNING: torch.compile: off, training eagerly (slower; --set training.compile=false "
                      f"silences this): {self.compile_problem}", file=self.out)
        else:
            print("Training on the CPU (training.device=cpu)" if t.device == "cpu" else
                  "CUDA not available: training on CPU", file=self.out)
            if t.compile:
                print("training.compile is ignored on the CPU", file=self.out)
        if self.world_size > 1:
            print(f"DDP: {self.world_size} processes ({'nccl' if self.cuda else 'gloo'})", file=self.out)
        print(f"Precision: {describe_precision(self.precision, self.device)} (training.precision={t.precision})"
              + (" | gradient checkpointing: on" if t.gradient_checkpointing else ""), file=self.out)
        print(f"Effective batch size: {self.effective_batch_size} "
              f"({t.batch_size} per process x {self.world_size} processes x {t.grad_accum_steps} accumulation)",
              file=self.out)
        print(f"Model parameters: {self.model.num_parameters():,} | train windows: "
              f"{self.windows.num_windows('train'):,} | steps per epoch: {self.steps_per_epoch:,}", file=self.out)
        if self.epoch >= t.epochs or self._patience_exhausted():
            stopped = ", stopped early" if self.epoch < t.epochs else ""
            print(f"Nothing left to train ({self.epoch} of {t.epochs} epochs done{stopped}): writing the final "
                  "outputs", file=self.out)
        elif self.global_step:
            print(f"Resuming at epoch {self.epoch + 1}, step {self.step_in_epoch} of {self.steps_per_epoch} "
                  f"(global step {self.global_step})", file=self.out)
        self.out.flush()

    @contextlib.contextmanager
    def _signal_flags(self) -> Iterator[None]:
        """Install flag-setting handlers for the checkpoint signals; restore the old ones after."""
        def handler(signum: int, frame: Any) -> None:
            # a stop request wins over a save request that hasn't been served yet
            if self._pending_signal not in _STOP_SIGNALS:
                self._pending_signal = signum

        previous = {}
        try:
            for sig in _STOP_SIGNALS + _SAVE_SIGNALS:
                previous[sig] = signal.signal(sig, handler)
        except ValueError:  # not the main thread: signals can't be caught here
            pass
        try:
            yield
        finally:
            for sig, old in previous.items():
                signal.signal(sig, old)


def _new_sums() -> dict[str, float]:
    return {"loss": 0.0, "correct": 0, "tokens": 0, "seconds": 0.0, "seen": 0}
