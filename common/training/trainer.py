"""The training loop: AdamW, cosine LR with warmup, clipping, accumulation, early stopping,
checkpoints on epochs, on a timer and on signals, and an exact resume.

The Trainer's whole state is `state_dict()` / `load_state_dict()`, like any torch object:
model, optimizer, schedule position, epoch and step within it, the partial sums of the
epoch in progress, early-stopping state, RNG states (python, numpy, torch, cuda), the log so
far and the resolved config. Resuming from it replays the run bit for bit on the CPU: the
batch order comes from (seed, epoch) and the epoch order the run began with ("epoch_order":
a checkpoint without it is from before the generated order and keeps torch.randperm's), and
dropout from the restored torch RNG.

Signals (signals.py) are served at the next step boundary: SIGUSR1 saves a step checkpoint;
SIGTERM and SIGUSR2 save one and stop: `train()` returns "interrupted" and the command exits
with EXIT_REQUEUE (75), which the Slurm scripts read as "requeue me". Under DDP every rank
checkpoints and stops at the same step, and the checkpoint holds each rank's RNG state.
The step itself (the model as training runs it, AdamW, the grad scaler) is `self.step`
(optimizer_step.py); the banner, TensorBoard, MFU and GPU health are the `metrics` object's
(telemetry.py).
"""

from __future__ import annotations

import functools
import itertools
import math
import signal
import sys
import time
from typing import Any, Callable, Mapping, Optional, TextIO

import torch

from common.config import TrainingConfig, config_to_dict
from common.distributed.ddp import barrier
from common.distributed.job_store import wait_for_main
from common.distributed.requeue import EXIT_REQUEUE
from common.errors import UserError
from common.run.checkpoint import (
    best_model_state,
    epoch_checkpoint_name,
    step_checkpoint_name,
    unwrap_state_dict,
)
from common.run.files import TRAINING_LOG_JSON
from common.run.folder import Run
from common.run.log import RunLog
from common.training.batches import TokenWindows
from common.training.epoch_order import EPOCH_ORDER, checkpoint_epoch_order
from common.training.log import EpochEnd, EpochSums, Progress
from common.training.lr_schedule import LRSchedule
from common.training.optimizer_step import Flight, NonFiniteStep, OptimizerStep, StepSums, steps_per_epoch
from common.training.rng import restore_rank_rng, rng_state
from common.training.run_checkpoints import RunCheckpoints, check_resumable
from common.training.signals import SAVE_SIGNALS, STOP_SIGNALS, CheckpointRequests
from common.training.telemetry import TrainingMetrics
from common.training.validation import EarlyStopping, split_loss

__all__ = ["EXIT_REQUEUE", "Trainer"]


class Trainer:
    """Trains `model` on `windows` with the settings `t` (the config's training section) and
    writes checkpoints and training_log.json into the folder of `run`, whose config they record.

    rank / world_size shard the batches for DDP (the caller wraps the model in MultiGPUWrapper).
    Every rank runs this same loop and logs the same global numbers; rank 0 writes and prints.
    """

    def __init__(
        self,
        t: TrainingConfig,
        model: torch.nn.Module,
        windows: TokenWindows,
        run: Run,
        *,
        device: Optional[torch.device] = None,
        rank: int = 0,
        world_size: int = 1,
        out: Optional[TextIO] = None,
        job: Optional[Mapping[str, str]] = None,
        tensorboard: bool = True,
    ) -> None:
        self.t, self.run, self.windows, self.run_dir = t, run, windows, run.path
        self.device = device or windows.device
        self.rank, self.world_size, self.out = rank, world_size, out or sys.stdout
        self.is_main = rank == 0
        self.cuda = self.device.type == "cuda"
        if t.device == "cuda" and not self.cuda:
            raise UserError(
                f"training.device=cuda but this process trains on {self.device}; run `marketgpt doctor` on the node"
            )
        self.requests = CheckpointRequests(t.checkpoint_every_minutes)
        self.step = OptimizerStep(t, model, self.device, world_size, self.is_main, self.requests)
        self.model = self.step.model
        self.metrics = TrainingMetrics(
            self.run_dir,
            self.device,
            world_size,
            is_main=self.is_main,
            tensorboard=tensorboard,
            peak_flops=t.peak_flops,
            tracker=t.tracker,
            config=config_to_dict(run.cfg),
            flops_per_token=self.model.flops_per_token(windows.context_length),
        )
        self.steps_per_epoch = steps_per_epoch(windows, t, world_size)
        self.lr_schedule = LRSchedule(t.learning_rate, t.warmup_steps, t.epochs * self.steps_per_epoch, t.min_lr_ratio)
        self.effective_batch_size = t.batch_size * world_size * t.grad_accum_steps

        # progress: `epoch` counts finished epochs; the one in progress is epoch + 1 (1-based)
        self.epoch = self.step_in_epoch = self.global_step = 0
        self.epoch_order = EPOCH_ORDER  # a resumed run keeps its checkpoint's (load_state_dict)
        self.elapsed_before = 0.0  # seconds trained by earlier sessions of this run
        self.sums = EpochSums()  # the epoch in progress
        self.early_stopping = EarlyStopping(t.early_stopping_patience)
        self.log = RunLog()
        self.job = dict(job or {})  # the Slurm job training the run now (scheduler.job_metadata)
        # On a GPU a step's sums are read while the next step runs (1), so the device never waits
        # for the host; 0 reads each step before the next is queued (the CPU's way: nothing to
        # overlap; training.overlap_host=false on a GPU)
        self.read_lag = 1 if self.cuda and t.overlap_host else 0
        self._buckets_settled = False  # DDP's gradient buckets, before the first step (OptimizerStep.settle_buckets)
        self._in_flight: Optional[Flight] = None
        self._clock = 0.0  # when the last step was read: a step's seconds run from there to its own

        self._session_start = time.monotonic()
        self.checkpoints = RunCheckpoints(
            self.run_dir, t.keep_checkpoints, is_main=self.is_main, world_size=world_size, out=self.out
        )

    # ------------------------------------------------------------------ state

    def state_dict(self) -> dict[str, Any]:
        """Everything a resume needs; only tensors and plain containers (weights_only-safe)."""
        return {
            "model": unwrap_state_dict(self.model.state_dict()),
            "optimizer": self.step.optimizer.state_dict(),
            # fp16's loss scale and its growth tracker; None in bf16 / fp32, which need no scaler
            "grad_scaler": self.step.scaler.state_dict() if self.step.scaler.is_enabled() else None,
            "lr_schedule": self.lr_schedule.state_dict(),
            "progress": {
                "epoch": self.epoch,
                "step_in_epoch": self.step_in_epoch,
                "global_step": self.global_step,
                "steps_per_epoch": self.steps_per_epoch,
                "world_size": self.world_size,
                "elapsed_s": self.elapsed_before + self._session_seconds(),
            },
            "epoch_order": self.epoch_order,
            "epoch_sums": self.sums.state_dict(),
            "early_stopping": self.early_stopping.state_dict(),
            "rng": rng_state(),
            "log": self.log.to_dict(),
            "config": config_to_dict(self.run.cfg),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        p = state["progress"]
        warning = check_resumable(p, self.steps_per_epoch, self.world_size)
        order = checkpoint_epoch_order(state)
        self.model.load_state_dict(unwrap_state_dict(state["model"]))
        self.step.optimizer.load_state_dict(state["optimizer"])
        for group, flags in zip(self.step.optimizer.param_groups, self.step.kernel_flags):
            group.update(flags)  # a CPU checkpoint resumed on a GPU keeps the fused AdamW
        if state.get("grad_scaler"):
            self.step.scaler.load_state_dict(state["grad_scaler"])  # a no-op unless this run trains in fp16
        self.epoch, self.step_in_epoch, self.global_step = p["epoch"], p["step_in_epoch"], p["global_step"]
        self.epoch_order = order
        self.elapsed_before = float(p["elapsed_s"])
        self.sums.load_state_dict(state["epoch_sums"])
        self.early_stopping.load_state_dict(state["early_stopping"])
        # (a checkpoint from before "lr_schedule" has "scheduler", with the total steps)
        self.lr_schedule.load_state_dict(state.get("lr_schedule") or state.get("scheduler") or {}, self.global_step)
        restore_rank_rng(state, self.rank, self.t.seed + 7919 * self.rank + 1_000_003 * self.global_step)
        if warning and self.is_main:
            print(warning, file=self.out, flush=True)
        self.log = RunLog(state["log"])
        self.log.record_resume(time.strftime("%Y-%m-%dT%H:%M:%S%z"))
        self.metrics.resumed_at = self.global_step
        self._session_start = time.monotonic()

    def start_run(self, launcher: str, lineage: Optional[dict] = None, size: Optional[dict] = None) -> None:
        """A new run's log header: what trains it and on what (`launcher`: DistEnv.launcher), a
        fine-tuned run's lineage, what model.size = "auto" chose and why (`size`)."""
        self.log.start(
            run=self.run_dir.name,
            experiment=self.run.cfg.experiment,
            started_at=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            device=self.windows.device.type,
            world_size=self.world_size,
            launcher=launcher,
            num_parameters=self.model.num_parameters(),
            num_assets=self.run.info.num_assets,
            windows={s: self.windows.num_windows(s) for s in ("train", "val", "test")},
            steps_per_epoch=self.steps_per_epoch,
            effective_batch_size=self.effective_batch_size,
        )
        if lineage is not None:
            self.log.set_lineage(lineage)
        if size:
            self.log.set_model_size(size)

    def lr(self, step: int) -> float:
        """The learning rate of optimizer step `step` (0-based) in this run."""
        return self.lr_schedule(step)

    # ------------------------------------------------------------------ the loop

    def train(
        self, stop_after_steps: Optional[int] = None, final_outputs: Optional[Callable[[str], None]] = None
    ) -> str:
        """Train to the end; returns "finished", "early_stopped", "failed", "interrupted"
        (checkpoint saved on SIGTERM/SIGUSR2) or "stopped" (checkpoint saved at
        `stop_after_steps` global steps, for tests and short slices of a run).

        When training ends ("finished"/"early_stopped"), rank 0 calls `final_outputs(status)`
        (test results, report) once every checkpoint is on disk, and only then writes that
        status into training_log.json: a run whose log says it is done has all of its outputs.
        A run resumed with nothing left to train goes straight there."""
        self.metrics.banner(self, self.out)
        self.log.set_job(self.job)
        self.log.set_precision(self.step.precision)
        self._session_start = time.monotonic()
        self.requests.restart_timer(self._session_start)
        # a GPU's first step sets up cuBLAS/cuDNN and the allocator (and compiles, when on): on an
        # H100 case A's 150-step eager epoch averaged 415k tok/s with it, its later steps ~475k.
        # CUDA graphs are recorded on the second and third: those stay out of tokens/s too.
        self._warmup_steps = (3 if self.step.cuda_graphs else 1) if self.cuda else 0
        self.log.set_status("running")
        self.log.set_interrupted(None)
        self._write_log()  # jq works on the log from the first step on
        with self.requests.handlers():
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

    def _loop(self, stop_after_steps: Optional[int]) -> str:
        t = self.t
        while self.epoch < t.epochs and not self.early_stopping.exhausted():
            outcome = self._train_epoch(stop_after_steps)
            if outcome is not None:
                return outcome
            val_loss, val_acc = self.evaluate("val", t.eval_max_batches)
            if not math.isfinite(val_loss):
                return self._fail(f"non-finite validation loss ({val_loss}) after epoch {self.epoch + 1}")
            self._end_epoch(val_loss, val_acc)
            _, sig, _ = self.requests.agree(torch.zeros(3, dtype=torch.float64, device=self.device))
            if sig in STOP_SIGNALS:  # the epoch checkpoint was just written
                return self._interrupt(sig, epoch_checkpoint_name(self.epoch))
            # SIGUSR1: the epoch checkpoint was just written
        # the status goes into the log in train(), after the final outputs
        return "early_stopped" if self.early_stopping.exhausted() and self.epoch < t.epochs else "finished"

    def _train_epoch(self, stop_after_steps: Optional[int]) -> Optional[str]:
        """Run the rest of the epoch in progress; returns a status if training must stop."""
        t = self.t
        accum = t.grad_accum_steps
        batches = self.windows.batches(
            "train",
            t.batch_size,
            shuffle=True,
            seed=t.seed,
            epoch=self.epoch,
            rank=self.rank,
            world_size=self.world_size,
            drop_last=True,
            start=self.step_in_epoch * accum,
            limit=self.steps_per_epoch * accum,
            order=self.epoch_order,
        )
        self.step.train_model.train()
        if not self._buckets_settled and self.step_in_epoch < self.steps_per_epoch:
            first = next(batches)
            self.step.settle_buckets(first)  # before the clock starts: not a step of the run
            batches, self._buckets_settled = itertools.chain([first], batches), True
        steps = (self.steps_per_epoch, self.step_in_epoch, t.log_every_steps)
        self._progress = progress = Progress(self.epoch + 1, t.epochs, *steps, self.out, enabled=self.is_main)
        self._clock = time.monotonic()
        try:
            while self.step_in_epoch < self.steps_per_epoch:
                lr = self.lr(self.global_step)
                flight = self.step.queue(batches, lr, self.step_in_epoch + 1, self.global_step + 1)
                self.step_in_epoch += 1
                self.global_step += 1
                # read the step before this one while this one runs (read_lag 1)
                done, self._in_flight = (flight, None) if self.read_lag == 0 else (self._in_flight, flight)
                if done is not None:
                    outcome = self._settle_and_serve(done, stop_after_steps)
                    if outcome is not None:
                        return outcome
            if self._in_flight is not None:  # the epoch's last step, before validation
                done, self._in_flight = self._in_flight, None
                return self._settle_and_serve(done, stop_after_steps)
        finally:
            progress.close()
        return None

    def _settle_and_serve(self, flight: Flight, stop_after_steps: Optional[int]) -> Optional[str]:
        """Read a step, record it, and serve what it asks for at this step boundary."""
        try:
            step = self._settle(flight)
        except NonFiniteStep as e:
            return self._fail(str(e), flight.global_step)
        return self._step_boundary(stop_after_steps, step.signal, step.timer_due)

    def _settle(self, flight: Flight) -> StepSums:
        """Read a queued step (OptimizerStep.settle) and record it. Reading a step late, the next
        one is already applied in memory, but no checkpoint holds it: every checkpoint is written
        after the steps before it were read (`_step_boundary`)."""
        step = self.step.settle(flight, f"step {flight.global_step} (epoch {self.epoch + 1})")
        now = time.monotonic()
        self._record_step(step, now - self._clock, flight)
        self._clock = now
        return step

    def _record_step(self, step: StepSums, seconds: float, flight: Flight) -> None:
        """Add the step to the epoch's sums; its progress line and (every log_every_steps) scalars."""
        t = self.t
        tokens_per_rank = t.batch_size * t.grad_accum_steps * self.windows.context_length
        timed = None if self._warmup_steps > 0 else (seconds, tokens_per_rank)  # warm-up steps are not timed
        self._warmup_steps = max(self._warmup_steps - 1, 0)
        self.sums.add(step.loss_sum, step.correct, step.tokens, timed)
        step_tps = tokens_per_rank * self.world_size / max(seconds, 1e-9)
        loss = step.loss_sum / max(step.tokens, 1)
        self._progress.update(flight.step_in_epoch, loss, flight.lr, step_tps)
        if flight.global_step % t.log_every_steps == 0:
            self.metrics.log_step(flight.global_step, loss, flight.lr, step_tps, step.grad_norm)

    def _step_boundary(
        self, stop_after_steps: Optional[int], sig: Optional[int] = None, timer_due: bool = False
    ) -> Optional[str]:
        """Checkpoints that happen between steps: signals, the timer, a requested stop
        (`sig` and `timer_due` as agreed by all ranks)."""
        self.checkpoints.check()  # a checkpoint that failed to publish stops the run now
        stop = stop_after_steps is not None and self.global_step >= stop_after_steps
        if not (stop or timer_due or sig in STOP_SIGNALS + SAVE_SIGNALS):
            return None
        if self._in_flight is not None:  # a checkpoint holds every step taken: read the last one
            later, self._in_flight = self._in_flight, None
            try:
                step = self._settle(later)
            except NonFiniteStep as e:
                return self._fail(str(e), later.global_step)
            timer_due = timer_due or step.timer_due
            if step.signal in STOP_SIGNALS or sig is None:  # stop beats save
                sig = step.signal or sig
        name = step_checkpoint_name(self.epoch + 1, self.step_in_epoch)
        if sig in STOP_SIGNALS:
            self._save(name)
            return self._interrupt(sig, name)
        if stop_after_steps is not None and self.global_step >= stop_after_steps:
            self._save(name)
            self._write_log()
            return "stopped"
        if sig in SAVE_SIGNALS or timer_due:
            self._save(name)
            self._write_log()
        return None

    def _end_epoch(self, val_loss: float, val_acc: float) -> None:
        t = self.t
        train_loss, train_acc = self.sums.train_loss, self.sums.train_acc
        readings = self.metrics.epoch_readings(self.sums.tokens_per_sec(self.world_size))
        self.epoch += 1
        self.step_in_epoch = 0
        self.sums = EpochSums()
        if self.early_stopping.update(val_loss, self.epoch):
            self.log.set_best(val_loss, self.epoch)
            self._save_best(val_loss)
        elapsed = self.elapsed_before + self._session_seconds()
        eta = elapsed / self.epoch * (t.epochs - self.epoch)
        lr = self.step.optimizer.param_groups[0]["lr"]
        losses = (train_loss, train_acc, val_loss, val_acc)
        end = EpochEnd(self.epoch, t.epochs, *losses, lr, elapsed, eta, self.global_step)
        self.log.add_epoch(**end.log_entry(readings.tokens_per_sec, readings.mfu, readings.gpus))
        self.metrics.log_epoch(self.global_step, end.scalars(readings.tokens_per_sec), readings)
        self._save(epoch_checkpoint_name(self.epoch))
        self._write_log()
        self.metrics.print_epoch(end.summary(), readings, self.out)

    def evaluate(
        self, split: str, max_batches: Optional[int] = None, model: Optional[torch.nn.Module] = None
    ) -> tuple[float, float]:
        """Token-weighted mean loss and accuracy over `split`. Under DDP with the plain model (no
        DDP forward, so ranks' uneven slices of the split can't deadlock)."""
        model = model or (self.model if self.world_size > 1 else self.step.train_model)
        t = self.t
        score = functools.partial(split_loss, rank=self.rank, world_size=self.world_size, max_batches=max_batches)
        return score(model, self.windows, split, t.batch_size, self.step.precision, self.device)

    # ------------------------------------------------------------------ helpers

    def _fail(self, error: str, step: Optional[int] = None) -> str:
        """Training stops with `error` at optimizer step `step` (default: the next one)."""
        self.step.optimizer.zero_grad(set_to_none=True)
        self.log.set_status("failed", error, failed_step=step or self.global_step + 1)
        self._write_log()
        if self.is_main:
            print(f"Training failed: {error}", file=self.out, flush=True)
        return "failed"

    def _interrupt(self, sig: int, checkpoint: str) -> str:
        name = signal.Signals(sig).name
        self.log.set_interrupted(
            f"{name} at epoch {self.epoch + 1} step {self.step_in_epoch}; "
            f"saved {checkpoint}; continue with --resume auto"
        )
        self._write_log()
        if self.is_main:
            line = f"Received {name}: saved {checkpoint}, stopping (exit {EXIT_REQUEUE} = requeue)"
            print(line, file=self.out, flush=True)
        return "interrupted"

    def _save(self, name: str) -> None:
        """A step or epoch checkpoint; every rank calls this at the same step (see RunCheckpoints)."""
        self.requests.restart_timer(time.monotonic())
        self.checkpoints.save(name, self.state_dict)

    def _save_best(self, val_loss: float) -> None:
        self.checkpoints.save_best(
            lambda: best_model_state(self.model, self.run.cfg, self.epoch, self.global_step, val_loss)
        )

    def _finish_writing(self, raise_errors: bool) -> None:
        try:
            self.checkpoints.finish(raise_errors)
        finally:
            self.metrics.close()

    def _write_log(self) -> None:
        if self.is_main:
            self.log.write(self.run_dir / TRAINING_LOG_JSON)

    def _session_seconds(self) -> float:
        return time.monotonic() - self._session_start
