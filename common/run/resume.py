"""Which run a training command continues, or where a new one starts: naming a new run folder,
finding an experiment's runs, `--resume auto` and `--resume PATH`, and starting over in a folder
killed before its first checkpoint. The folder's files: folder.py; its checkpoints: checkpoint.py.
"""

from __future__ import annotations

import re
import shutil
import time
from pathlib import Path
from typing import Optional, Sequence

from common.distributed import scheduler
from common.errors import UserError
from common.run.checkpoint import checkpoint_position, latest_good_checkpoint
from common.run.files import (
    ASSET_INFO_JSON,
    BEST_MODEL_PT,
    CONFIG_JSON,
    DATA_INFO_JSON,
    TOKENIZER_JSON,
    TRAINING_LOG_JSON,
)
from common.run.folder import check_writable, has_final_outputs
from common.run.log import RunLog

__all__ = ["auto_resume_run", "find_runs", "new_run_dir", "resolve_resume", "resumable_run", "reuse_unstarted_run"]

_STAMP = "%Y%m%d_%H%M%S"
# What a run writes before its first resumable checkpoint (its set-up, the trainer's log and
# tensorboard, and best_model.pt, published just before the first epoch checkpoint): a folder
# holding nothing else has nothing to resume from, and a new run may start over in it.
_BEFORE_FIRST_CHECKPOINT = (
    CONFIG_JSON,
    TOKENIZER_JSON,
    ASSET_INFO_JSON,
    DATA_INFO_JSON,
    "tokens",
    "tokens.npz",
    TRAINING_LOG_JSON,
    "tensorboard",
    "wandb",
    "mlruns",
    BEST_MODEL_PT,
)


def new_run_dir(checkpoints: Path, experiment: str) -> Path:
    """Create `<experiment>_YYYYMMDD_HHMMSS` (with `_2`, `_3`, ... if that second is taken)."""
    check_writable(checkpoints)
    stamp = time.strftime(_STAMP)
    for n in range(1, 1000):
        path = checkpoints / (f"{experiment}_{stamp}" + (f"_{n}" if n > 1 else ""))
        try:
            path.mkdir()
            return path
        except FileExistsError:
            continue
        except OSError as e:
            raise UserError(f"cannot create run folder {path} ({e.strerror or e})") from None
    raise UserError(f"too many runs of {experiment} started at {stamp} in {checkpoints}")


def find_runs(checkpoints: Path, experiment: str) -> list[Path]:
    """The experiment's run folders under `checkpoints`, oldest first."""
    pattern = re.compile(rf"^{re.escape(experiment)}_(\d{{8}}_\d{{6}})(?:_(\d+))?$")
    runs = []
    if checkpoints.is_dir():
        for path in checkpoints.iterdir():
            m = pattern.match(path.name)
            if m and path.is_dir():
                runs.append(((m.group(1), int(m.group(2) or 1)), path))
    return [p for _, p in sorted(runs)]


def resolve_resume(
    resume: str, checkpoints: Optional[Path], experiment: Optional[str]
) -> tuple[Optional[Path], Optional[Path]]:
    """(run folder, checkpoint) to resume from.

    "auto": the run `auto_resume_run` picks and its newest checkpoint that checks out
    (older ones are the fallback, with a warning); (None, None) when there is none to
    continue, (run, None) when it has no usable checkpoint (the caller starts a new run).
    A path: a run folder (its newest good checkpoint) or one checkpoint file, unless another
    live Slurm job trains that run.
    """
    if resume == "auto":
        # both come from --config, which --resume auto needs
        runs = find_runs(checkpoints, experiment) if checkpoints is not None and experiment is not None else []
        run = auto_resume_run(runs)
        if run is None:
            return None, None
        return run, latest_good_checkpoint(run)
    path = Path(resume)
    if not path.exists():
        raise UserError(f"--resume {resume}: no such run folder or checkpoint file")
    owner = _live_owner(path if path.is_dir() else path.parent)
    if owner is not None:  # two trainers in one folder would overwrite each other's checkpoints
        raise UserError(
            f"--resume {resume}: Slurm job {owner} is still training this run; wait for it to "
            f"end or stop it (scancel {owner}: it saves a checkpoint), then resume"
        )
    if path.is_dir():
        ckpt = latest_good_checkpoint(path)
        if ckpt is None:
            raise UserError(f"--resume {resume}: the folder has no complete checkpoint_epoch_*.pt to resume from")
        return path, ckpt
    if checkpoint_position(path) is None:
        raise UserError(
            f"--resume {resume}: not a resumable checkpoint (expected checkpoint_epoch_N.pt or "
            "checkpoint_epoch_N_step_S.pt; best_model.pt holds no optimizer state)"
        )
    return path.parent, path


def auto_resume_run(runs: Sequence[Path]) -> Optional[Path]:
    """The run `--resume auto` continues, from an experiment's runs (oldest first):

    1. inside a Slurm job, the run this job already trains (its id is in training_log.json):
       a requeued job continues its own run even if another job started a newer one;
    2. else the newest run, unless it is done (finished or early-stopped with its final
       outputs written, or failed) or another job still queued or running trains it: then
       None, and a new run starts. A run that trained to the end but lacks a final output
       is continued: its last checkpoint has nothing left to train, so only the outputs are
       computed.
    """
    logs = {run: RunLog.read(run) for run in runs}
    me = scheduler.slurm_job_id()
    mine = [run for run in runs if me and logs[run].slurm_job_id == me]
    if mine:
        return mine[-1]
    if not runs:
        return None
    newest = runs[-1]
    log = logs[newest]
    done = log.status == "failed" or (log.status in ("finished", "early_stopped") and has_final_outputs(newest))
    if done or _live_owner(newest, log) is not None:
        return None
    return newest


def resumable_run(checkpoints: Path, experiment: str) -> Optional[Path]:
    """The run `--resume auto` would continue here, if it has a checkpoint that checks out (a
    requeue names it, so the job continues its own run even if another job starts a newer one)."""
    run = auto_resume_run(find_runs(checkpoints, experiment))
    if run is None or latest_good_checkpoint(run, warn=lambda m: None) is None:
        return None
    return run


def _live_owner(run_dir: Path, log: Optional[RunLog] = None) -> Optional[str]:
    """The id of another Slurm job, still queued or running, that trains this run (else None)."""
    owner = (log if log is not None else RunLog.read(run_dir)).slurm_job_id
    # through the module, so a test can stand in for squeue
    return owner if owner and owner != scheduler.slurm_job_id() and scheduler.job_is_alive(owner) else None


def reuse_unstarted_run(run_dir: Path) -> bool:
    """Empty a run folder that was killed before its first checkpoint, so a new run starts in it
    instead of beside it; False (and untouched) if it holds anything more: a checkpoint, even a
    damaged one, an output, a file someone put there."""
    entries = list(run_dir.iterdir())
    if any(
        p.name not in _BEFORE_FIRST_CHECKPOINT and not (p.name.startswith(".") and p.name.endswith(".tmp"))
        for p in entries
    ):
        return False
    try:
        for p in entries:
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p)
            else:
                p.unlink()
    except OSError as e:
        raise UserError(f"cannot clear {run_dir} to reuse it ({e.strerror or e}); remove it by hand") from None
    return True
