"""training_log.json as one typed object, `RunLog`: read as attributes, written through its methods.

The log lives inside the trainer's state (a checkpoint carries the log so far) and is rewritten
atomically after every epoch, so these work mid-run and after:
    jq '.epochs[-5:]'   jq '.epochs[] | {epoch, train_loss, val_loss}'   jq '.best_val_loss'
Its JSON keeps every field and their order as they are written (the seed guide's `jq` reads
it); a log written by an older version opens the same, a field it lacks reading as None.
Standard library only: `marketgpt status` and the login-node commands read it without torch,
tqdm or numpy.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Mapping, Optional

from common.atomic import atomic_write_json
from common.run.files import TRAINING_LOG_JSON

__all__ = ["STATUSES", "EPOCH_KEYS", "RunLog", "format_duration"]

STATUSES = ("running", "finished", "early_stopped", "failed")
EPOCH_KEYS = ("epoch", "train_loss", "train_acc", "val_loss", "val_acc", "lr", "tokens_per_sec", "elapsed_s", "eta_s")


class RunLog:
    """A run's training_log.json: status, best epoch, one entry per finished epoch, and what the
    run records about itself (its header, resumes, the job training it, fine-tuning lineage)."""

    def __init__(self, data: Optional[Mapping[str, Any]] = None) -> None:
        """A log as written (`data`: its JSON), or a new run's (None)."""
        new: dict[str, Any] = {
            "status": "running",
            "error": None,
            "best_val_loss": None,
            "best_epoch": None,
            "epochs": [],
        }
        self._data: dict[str, Any] = dict(data) if data is not None else new

    @classmethod
    def read(cls, run_dir: str | Path) -> RunLog:
        """A run's log; an empty one (status None) where there is none yet (it died before its
        first step) or it cannot be read: nothing recorded."""
        try:
            data = json.loads((Path(run_dir) / TRAINING_LOG_JSON).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            data = {}
        return cls(data if isinstance(data, dict) else {})

    # ------------------------------------------------------------------ read

    def _get(self, key: str) -> Any:
        return self._data.get(key)

    @property
    def status(self) -> Optional[str]:
        """One of STATUSES; None for a run with no log yet."""
        return self._get("status")

    @property
    def error(self) -> Optional[str]:
        return self._get("error")

    @property
    def best_val_loss(self) -> Optional[float]:
        return self._get("best_val_loss")

    @property
    def best_epoch(self) -> Optional[int]:
        return self._get("best_epoch")

    @property
    def epochs(self) -> list[dict[str, Any]]:
        """One entry per finished epoch (EPOCH_KEYS, then step, mfu and the GPUs)."""
        return list(self._get("epochs") or [])

    @property
    def last_epoch(self) -> dict[str, Any]:
        """The newest epoch's entry, {} before the first."""
        epochs = self._get("epochs") or []
        return dict(epochs[-1]) if epochs else {}

    @property
    def experiment(self) -> Optional[str]:
        return self._get("experiment")

    @property
    def num_parameters(self) -> Optional[int]:
        return self._get("num_parameters")

    @property
    def precision(self) -> Optional[str]:
        """The precision the run trained in ("bf16", "fp16", "fp32")."""
        return self._get("precision")

    @property
    def interrupted(self) -> Optional[str]:
        """Where the last stop signal stopped it and what it saved; None once it trains again."""
        return self._get("interrupted")

    @property
    def resumes(self) -> list[str]:
        """When each resume started (ISO 8601)."""
        return list(self._get("resumes") or [])

    @property
    def slurm_job_id(self) -> Optional[str]:
        """The Slurm job that trains (or last trained) the run."""
        job = self._get("slurm_job_id")
        return str(job) if job else None

    @property
    def log_file(self) -> Optional[str]:
        """The job's stdout, as the sbatch scripts and `marketgpt submit` name it."""
        return self._get("log_file") or None

    @property
    def lineage(self) -> Optional[dict[str, Any]]:
        """A fine-tuned run's parent and what it froze."""
        return self._get("lineage")

    @property
    def model_size(self) -> Optional[dict[str, Any]]:
        """What model.size = "auto" chose, and why."""
        return self._get("model_size")

    def to_dict(self) -> dict[str, Any]:
        """The JSON as written (a copy): what a checkpoint carries."""
        return json.loads(json.dumps(self._data))

    # ------------------------------------------------------------------ write

    def start(self, **header: Any) -> None:
        """A new run's header: run, experiment, started_at, device, world_size, launcher, ..."""
        self._data.update(header)

    def add_epoch(self, **entry: Any) -> None:
        missing = [k for k in EPOCH_KEYS if k not in entry]
        if missing:
            raise ValueError(f"epoch entry lacks {missing}")
        self._data.setdefault("epochs", []).append({k: _finite(v) for k, v in entry.items()})

    def set_best(self, val_loss: float, epoch: int) -> None:
        self._data["best_val_loss"], self._data["best_epoch"] = float(val_loss), int(epoch)

    def set_status(self, status: str, error: Optional[str] = None, failed_step: Optional[int] = None) -> None:
        if status not in STATUSES:
            raise ValueError(f"unknown status {status!r}")
        self._data["status"], self._data["error"] = status, error
        if failed_step is not None:
            self._data["failed_step"] = failed_step

    def set_lineage(self, lineage: dict[str, Any]) -> None:
        self._data["lineage"] = lineage

    def set_model_size(self, model_size: dict[str, Any]) -> None:
        self._data["model_size"] = model_size

    def set_job(self, job: Mapping[str, str]) -> None:
        """The Slurm job (and its log file) that trains the run now: for status and requeues."""
        self._data.update(job)

    def record_resume(self, when: str) -> None:
        self._data.setdefault("resumes", []).append(when)

    def set_precision(self, precision: str) -> None:
        self._data["precision"] = precision

    def set_interrupted(self, where: Optional[str]) -> None:
        """Where a stop signal stopped the run (None: it trains again)."""
        if where is None:
            self._data.pop("interrupted", None)
        else:
            self._data["interrupted"] = where

    def write(self, path: Path) -> None:
        atomic_write_json(path, self._data)


def _finite(v: Any) -> Any:
    # JSON (and jq) has no NaN: a non-finite metric is written as null
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v


def format_duration(seconds: float) -> str:
    """'2h 15m', the seed's format (hours may exceed 24 for week-long runs)."""
    minutes = int(max(seconds, 0.0) // 60)
    return f"{minutes // 60}h {minutes % 60}m"
