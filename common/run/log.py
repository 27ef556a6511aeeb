"""training_log.json: the run's status, best epoch and one entry per finished epoch.

The log is a plain dict that lives inside the trainer's state (so a checkpoint carries the
log so far) and is rewritten atomically after every epoch, so these work mid-run and after:
    jq '.epochs[-5:]'   jq '.epochs[] | {epoch, train_loss, val_loss}'   jq '.best_val_loss'
Standard library only: `marketgpt status` and the login-node commands read it without torch,
tqdm or numpy.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Optional

from common.atomic import atomic_write_json

__all__ = ["STATUSES", "EPOCH_KEYS", "TrainingLog", "format_duration"]

STATUSES = ("running", "finished", "early_stopped", "failed")
EPOCH_KEYS = ("epoch", "train_loss", "train_acc", "val_loss", "val_acc", "lr", "tokens_per_sec", "elapsed_s", "eta_s")


class TrainingLog:
    """Status, best val loss and one entry per finished epoch; `.data` is what is written."""

    def __init__(self, metadata: Optional[dict[str, Any]] = None) -> None:
        self.data: dict[str, Any] = {
            "status": "running",
            "error": None,
            "best_val_loss": None,
            "best_epoch": None,
            "epochs": [],
            **(metadata or {}),
        }

    def add_epoch(self, **entry: Any) -> None:
        missing = [k for k in EPOCH_KEYS if k not in entry]
        if missing:
            raise ValueError(f"epoch entry lacks {missing}")
        self.data["epochs"].append({k: _finite(v) for k, v in entry.items()})

    def set_best(self, val_loss: float, epoch: int) -> None:
        self.data["best_val_loss"], self.data["best_epoch"] = float(val_loss), int(epoch)

    def set_status(self, status: str, error: Optional[str] = None, **extra: Any) -> None:
        if status not in STATUSES:
            raise ValueError(f"unknown status {status!r}")
        self.data["status"], self.data["error"] = status, error
        self.data.update(extra)

    def write(self, path: Path) -> None:
        atomic_write_json(path, self.data)


def _finite(v: Any) -> Any:
    # JSON (and jq) has no NaN: a non-finite metric is written as null
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v


def format_duration(seconds: float) -> str:
    """'2h 15m', the seed's format (hours may exceed 24 for week-long runs)."""
    minutes = int(max(seconds, 0.0) // 60)
    return f"{minutes // 60}h {minutes % 60}m"
