"""The human-readable progress a training job prints: the seed guide's epoch block, the
epoch's record for the log and TensorBoard, and the within-epoch bar or lines.
(training_log.json itself is common/run/log.py.)
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any, Optional, TextIO

from tqdm import tqdm

from common.run.log import format_duration

__all__ = ["EpochEnd", "EpochSums", "epoch_summary", "Progress"]


def epoch_summary(
    epoch: int,
    epochs: int,
    train_loss: float,
    train_acc: float,
    val_loss: float,
    val_acc: float,
    elapsed_s: float,
    eta_s: float,
) -> str:
    """The four lines the seed guide shows for every epoch (accuracies as fractions in [0, 1])."""
    return (
        f"Epoch {epoch}/{epochs}\n"
        f"Train Loss: {train_loss:.3f} | Train Acc: {100 * train_acc:.1f}%\n"
        f"Val Loss: {val_loss:.3f} | Val Acc: {100 * val_acc:.1f}%\n"
        f"Time: {format_duration(elapsed_s)} | ETA: {format_duration(eta_s)}"
    )


class EpochSums:
    """The epoch in progress, summed over its steps as every rank agreed on them: token losses,
    correct predictions and tokens; and, for tokens/s, the seconds and tokens (per rank) of the
    timed steps. Its state_dict is a checkpoint's "epoch_sums": a resume mid-epoch goes on summing."""

    def __init__(self) -> None:
        self.loss, self.correct, self.tokens, self.seconds, self.seen = 0.0, 0, 0, 0.0, 0

    def add(self, loss_sum: float, correct: int, tokens: int, timed: Optional[tuple[float, int]]) -> None:
        """One step's sums; `timed`: its (seconds, tokens per rank), None for a warm-up step
        (a GPU's first steps set up kernels and CUDA graphs: they stay out of tokens/s)."""
        self.loss += loss_sum
        self.correct += correct
        self.tokens += tokens
        if timed is not None:
            self.seconds += timed[0]
            self.seen += timed[1]

    @property
    def train_loss(self) -> float:
        return self.loss / max(self.tokens, 1)

    @property
    def train_acc(self) -> float:
        return self.correct / max(self.tokens, 1)

    def tokens_per_sec(self, world_size: int) -> float:
        return self.seen * world_size / max(self.seconds, 1e-9)

    def state_dict(self) -> dict[str, float]:
        return {
            "loss": self.loss,
            "correct": self.correct,
            "tokens": self.tokens,
            "seconds": self.seconds,
            "seen": self.seen,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.loss, self.correct, self.tokens = state["loss"], state["correct"], state["tokens"]
        self.seconds, self.seen = state["seconds"], state["seen"]


@dataclass(frozen=True)
class EpochEnd:
    """A finished epoch as training_log.json, the TensorBoard scalars and the printed block report it."""

    epoch: int
    epochs: int
    train_loss: float
    train_acc: float
    val_loss: float
    val_acc: float
    lr: float
    elapsed_s: float  # this run's seconds so far, every session
    eta_s: float
    step: int  # global optimizer steps

    def log_entry(self, tokens_per_sec: float, mfu: Optional[float], gpus: Any) -> dict[str, Any]:
        """The epoch's entry of training_log.json (EPOCH_KEYS, then step, mfu and the GPUs)."""
        return {
            "epoch": self.epoch,
            "train_loss": self.train_loss,
            "train_acc": self.train_acc,
            "val_loss": self.val_loss,
            "val_acc": self.val_acc,
            "lr": self.lr,
            "tokens_per_sec": tokens_per_sec,
            "elapsed_s": round(self.elapsed_s, 3),
            "eta_s": round(self.eta_s, 3),
            "step": self.step,
            "mfu": mfu,
            "gpus": gpus,
        }

    def scalars(self, tokens_per_sec: float) -> dict[str, float]:
        """The epoch's TensorBoard scalars (tag -> value)."""
        return {
            "loss/train": self.train_loss,
            "loss/val": self.val_loss,
            "accuracy/train": self.train_acc,
            "accuracy/val": self.val_acc,
            "epoch/lr": self.lr,
            "epoch/tokens_per_sec": tokens_per_sec,
            "epoch/epoch": self.epoch,
        }

    def summary(self) -> str:
        """The seed guide's four lines for the epoch."""
        losses = (self.train_loss, self.train_acc, self.val_loss, self.val_acc)
        return epoch_summary(self.epoch, self.epochs, *losses, self.elapsed_s, self.eta_s)


class Progress:
    """Within-epoch progress: a tqdm bar in a terminal, plain lines every N steps in a batch log.

    A Slurm .out file is not a terminal, so it gets `step 150/1200 | loss 3.412 | lr 2.9e-04 |
    41k tok/s` lines and never a carriage return.
    """

    def __init__(
        self,
        epoch: int,
        epochs: int,
        total: int,
        done: int,
        every: int,
        out: Optional[TextIO] = None,
        enabled: bool = True,
    ) -> None:
        self.epoch, self.epochs, self.total, self.every = epoch, epochs, total, every
        self.out = out or sys.stdout
        self.enabled = enabled
        self.bar = None
        if enabled and _is_terminal(out):
            self.bar = tqdm(
                total=total, initial=done, desc=f"Epoch {epoch}/{epochs}", file=out, dynamic_ncols=True, leave=False
            )

    def update(self, step: int, loss: float, lr: float, tokens_per_sec: float) -> None:
        """`step`: optimizer steps done in this epoch."""
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.update(step - self.bar.n)
            self.bar.set_postfix(loss=f"{loss:.3f}", lr=f"{lr:.1e}", refresh=False)
        elif step % self.every == 0 or step == self.total:
            print(
                f"  epoch {self.epoch}/{self.epochs} step {step}/{self.total} | loss {loss:.3f} | "
                f"lr {lr:.2e} | {tokens_per_sec / 1000:.1f}k tok/s",
                file=self.out,
                flush=True,
            )

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _is_terminal(out: Optional[TextIO]) -> bool:
    if out is None:
        return False
    try:
        return out.isatty()
    except (AttributeError, ValueError):
        return False
