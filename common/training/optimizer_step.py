"""One optimizer step of the training loop: the model as training runs it and the step itself.

`OptimizerStep` holds what a step needs: the model on its device, its precision and grad scaler,
torch.compile (CUDA graphs where chosen) and AdamW. `queue` runs a step's forward and backward
passes, clips, starts the agreement with the other ranks and applies the step, without waiting
for the device; `settle` later reads the agreed sums back and checks them. The Trainer (the
loop) decides when to read, records the step and checkpoints between steps.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Iterator, NamedTuple, Optional, cast

import torch

from common.config import TrainingConfig
from common.distributed.ddp import no_sync, unwrap
from common.distributed.precision import (
    CUDA_GRAPH_MODES,
    autocast,
    choose_compile_mode,
    compile_problem,
    grad_scaler,
    resolve_precision,
    use_tf32,
)
from common.errors import UserError
from common.training.batches import Batch, TokenWindows
from common.training.muon import MuonAdamW
from common.training.signals import Agreement, CheckpointRequests
from common.training.step import TrainingForward, clip_values, nonfinite, step_values

if TYPE_CHECKING:  # the model module imports pandas, kept out of the training start-up
    from common.model.gpt import MarketGPT

__all__ = ["Flight", "NonFiniteStep", "OptimizerStep", "StepSums", "steps_per_epoch"]


def steps_per_epoch(windows: TokenWindows, t: TrainingConfig, world_size: int) -> int:
    """Optimizer steps in an epoch: full global batches only (DDP's gradient mean equals one big
    batch's only when every rank has one), at most training.max_steps_per_epoch."""
    batches = windows.num_batches("train", t.batch_size, world_size, drop_last=True, shuffle=True) // t.grad_accum_steps
    steps = min(batches, t.max_steps_per_epoch or batches)
    if steps == 0:
        raise UserError(
            f"{windows.num_windows('train')} training windows are too few for one optimizer "
            f"step (training.batch_size {t.batch_size} x grad_accum_steps {t.grad_accum_steps} x "
            f"{world_size} processes); lower them or use more data"
        )
    return steps


class StepSums(NamedTuple):
    """One optimizer step as every rank agreed on it: the whole job's sums, and what comes next."""

    loss_sum: float  # token losses summed
    correct: int
    tokens: int
    grad_norm: Optional[float]  # None without clipping, or when fp16 overflowed
    signal: Optional[int]  # a checkpoint signal some rank got
    timer_due: bool  # some rank's checkpoint timer is due


class Flight(NamedTuple):
    """A step queued on the device whose sums are still on their way to the host."""

    agreement: Agreement
    lr: float
    step_in_epoch: int  # this step's number, 1-based, as its progress line counts
    global_step: int


class NonFiniteStep(Exception):
    """The step's loss or gradient norm is not finite; no checkpoint holds it."""


class OptimizerStep:
    """The model on `device` as training runs it, AdamW and the grad scaler, and one step of them.

    `model` may be wrapped (DDP): the step runs through it, `self.model` is the plain MarketGPT."""

    def __init__(
        self,
        t: TrainingConfig,
        model: torch.nn.Module,
        device: torch.device,
        world_size: int,
        is_main: bool,
        requests: CheckpointRequests,
    ) -> None:
        self.training, self.device, self.world_size, self.is_main, self.requests = (
            t,
            device,
            world_size,
            is_main,
            requests,
        )
        cuda = device.type == "cuda"
        self.model = cast("MarketGPT", unwrap(model).to(device))  # MarketGPT's methods, or a model with them
        self.model.gradient_checkpointing = t.gradient_checkpointing
        self.train_model: torch.nn.Module = model.to(device)  # what forward runs through (DDP / compiled)
        self.precision = resolve_precision(t.precision, device)
        self.tf32 = use_tf32(device)
        self.scaler = grad_scaler(self.precision, device)  # enabled for fp16 only
        # why training.compile cannot run on this node (None: it can, or it is off / on the CPU)
        self.compile_problem = compile_problem() if cuda and t.compile else None
        self.compiled = cuda and t.compile and self.compile_problem is None
        # the mode (CUDA graphs on one GPU under "auto") and why it differs from the one asked for
        self.compile_mode, self.compile_mode_note = choose_compile_mode(
            t.compile_mode, world_size, t.gradient_checkpointing
        )
        self.cuda_graphs = self.compiled and self.compile_mode in CUDA_GRAPH_MODES
        # a training micro-batch runs through TrainingForward (the loss and the step's sums in one graph),
        # evaluation through the model itself
        self._forward: torch.nn.Module = TrainingForward(self.train_model)
        # few fused kernels rather than dozens of launches per step, where compiled: a small
        # model's GPU step is over before the host has launched it
        self._step_values, self._nonfinite = step_values, nonfinite
        if self.compiled:
            # torch.compile of a module is a module (typed as the callable it wraps)
            self.train_model = cast(torch.nn.Module, torch.compile(self.train_model, mode=self.compile_mode))
            self._forward = cast(torch.nn.Module, torch.compile(self._forward, mode=self.compile_mode))
            self._step_values, self._nonfinite = torch.compile(step_values), torch.compile(nonfinite)
        self._params = list(self.model.parameters())
        self._no_norm = torch.zeros((), dtype=torch.float64, device=device)  # read only
        self.optimizer = self._optimizer(t, device)
        # the kernel choice this device wants; a checkpoint's param_groups carry the saving device's
        self.kernel_flags = [{k: g.get(k) for k in ("fused", "foreach")} for g in self.optimizer.param_groups]

    def _optimizer(self, t: TrainingConfig, device: torch.device) -> torch.optim.Optimizer:
        """training.optimizer: AdamW over every parameter, or Muon for the blocks' weight
        matrices and AdamW for the rest (common/training/muon.py)."""
        if t.optimizer == "adamw":
            return self.model.configure_optimizer(t.weight_decay, t.learning_rate, (t.beta1, t.beta2), device.type)
        matrices = [p for p in self.model.blocks.parameters() if p.dim() == 2 and p.requires_grad]
        chosen = {id(p) for p in matrices}
        rest = [p for p in self.model.parameters() if p.requires_grad and id(p) not in chosen]
        groups = [
            {"params": [p for p in rest if p.dim() >= 2], "weight_decay": t.weight_decay},
            {"params": [p for p in rest if p.dim() < 2], "weight_decay": 0.0},
        ]
        return MuonAdamW(
            matrices, groups, t.learning_rate, t.muon_lr / t.learning_rate, t.weight_decay, (t.beta1, t.beta2)
        )

    def settle_buckets(self, b: Batch) -> None:
        """One throwaway forward and backward on micro-batch `b`, under DDP, before a process's
        first step: nothing of it is kept (gradients dropped, the random state restored).

        DDP lays its gradient buckets out again after its first backward, in the order the
        gradients arrived, and a sum over 3 or more ranks rounds by an element's place in its
        bucket. Without this, the first step of every process, a resumed one's included, would
        round unlike the same step of a job that never stopped, and a resume would drift from it
        (by 2e-7 in a 4-rank test, 8e-3 after 20 restarts in 12,000 steps)."""
        if self.world_size == 1:
            return
        devices = [self.device] if self.device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices, device_type=self.device.type):
            if self.cuda_graphs:
                torch.compiler.cudagraph_mark_step_begin()
            with autocast(self.precision, self.device):
                loss, _ = self._forward(b.x, b.asset_ids, b.category_ids, b.y, **b.extra_inputs())
            loss.backward()  # the all-reduce in the first layout; the next forward settles the next
        self.optimizer.zero_grad(set_to_none=True)

    def queue(self, batches: Iterator, lr: float, step_in_epoch: int, global_step: int) -> Flight:
        """Queue one optimizer step: forward and backward over grad_accum_steps micro-batches
        (DDP all-reduces the gradients on the last one), clip, start the agreement with the other
        ranks, step (through the grad scaler, a pass-through unless fp16), zero the gradients.
        Nothing here waits for the device (except fp16's scaler); `settle` reads the sums.
        step_in_epoch and global_step number this step (1-based)."""
        t = self.training
        accum = t.grad_accum_steps
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        sums: Optional[torch.Tensor] = None  # loss x tokens, correct, tokens
        for i in range(accum):
            b = next(batches)
            if self.cuda_graphs:
                torch.compiler.cudagraph_mark_step_begin()  # the last replay's outputs are read
            with no_sync(self.train_model, skip=i < accum - 1):
                with autocast(self.precision, self.device):
                    loss, batch = self._forward(b.x, b.asset_ids, b.category_ids, b.y, **b.extra_inputs())
                # (dividing by 1 would cost a kernel each way)
                self.scaler.scale(loss / accum if accum > 1 else loss).backward()
            sums = batch if sums is None else sums + batch  # before the next replay overwrites `batch`
        assert sums is not None  # grad_accum_steps >= 1 (the config checks it)
        # The clipped norm rides in the step's one all-reduce (rank 0's alone: DDP gave every
        # rank the same gradients), with the sums and the checkpoint flags (see signals.py).
        if t.gradient_clip > 0:
            self.scaler.unscale_(self.optimizer)  # clip the true gradients
            grads = [p.grad for p in self._params if p.grad is not None]
            # eager: compiled, its guards over every gradient cost case C more host time than its
            # launches (docs/performance.md#gpu)
            values, bad = clip_values(grads, t.gradient_clip, sums, self.is_main)
        else:
            values, bad = self._step_values(sums, self._no_norm)
        agreement = self.requests.send(values)
        if self.world_size > 1:  # every rank skips a step that is not finite on any rank
            bad = self._nonfinite(agreement.values)
        self._apply(bad)
        self.optimizer.zero_grad(set_to_none=True)
        return Flight(agreement, lr, step_in_epoch, global_step)

    def _apply(self, bad: torch.Tensor) -> None:
        """The optimizer step, unless `bad` (the agreed loss sum or gradient norm is not finite):
        then nothing of it is applied, and `settle` stops the run."""
        if not self.scaler.is_enabled():  # fp16's scaler skips the steps that overflow itself
            if self.optimizer.defaults.get("fused"):
                # the fused AdamW skips on the device: no wait (an attribute torch reads but does not declare)
                self.optimizer.found_inf = bad  # type: ignore[attr-defined]
            elif bad:  # the CPU's AdamW has no found_inf: a host read (its steps are read at once anyway)
                return
        self.scaler.step(self.optimizer)
        self.scaler.update()

    def settle(self, flight: Flight, where: str) -> StepSums:
        """Wait for a queued step's agreed sums and check them (`where`: the step, for the
        message). A non-finite step was skipped (`_apply`) and raises NonFiniteStep here."""
        values, sig, timer_due = flight.agreement.get()
        loss_sum, correct, tokens = values[0], int(values[1]), int(values[2])  # the whole job's
        if not math.isfinite(loss_sum):
            raise NonFiniteStep(
                f"non-finite training loss ({loss_sum / max(tokens, 1)}) at {where}; nothing of it "
                "was saved; lower training.learning_rate or check the data"
            )
        grad_norm = values[3] if self.training.gradient_clip > 0 else None
        if grad_norm is not None and not math.isfinite(grad_norm):
            if not self.scaler.is_enabled():
                raise NonFiniteStep(
                    f"non-finite gradient norm at {where}; nothing of it was saved; lower training.learning_rate"
                )
            grad_norm = None  # fp16 overflow: the scaler skipped this step and lowered its scale
        return StepSums(loss_sum, correct, tokens, grad_norm, sig, timer_due)
