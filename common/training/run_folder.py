"""The run folder `case_X/checkpoints/<experiment>_YYYYMMDD_HHMMSS/`: naming, finding the run
to resume, the config identity check, and the token set a run trains and is evaluated on.

Files (written by common.commands.train and common.training.trainer):
    config.json          fully resolved config; a resume reads this, not the case file
    tokenizer.json       the tokenizer fitted on the train split
    asset_info.json      symbol -> asset id, category -> category id (the model's embeddings)
    data_info.json       cleaning counts, split cuts, per-asset split sizes
    tokens/              every asset's tokens, actual moves and split ranges, memory-mapped
                         (common/tokens/token_set.py; hard links to the shard it was prepared
                         from): a resume and the final evaluation see exactly the data the run
                         started with, even if the candle cache was updated since. Runs made
                         before token folders have tokens.npz, still read
    training_log.json    status, best val loss and epoch, one entry per epoch
    checkpoint_epoch_N.pt, checkpoint_epoch_N_step_S.pt, best_model.pt
    report.png, test_results.json   the final outputs, written in that order before the
                         log's status says "finished" / "early_stopped"
    tensorboard/
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

from common.atomic import check_writable as _check_writable
from common.config import Config, config_to_dict, load_config
from common.data.run_info import RunInfo
from common.errors import UserError
from common.slurm import scheduler
from common.tokens.token_set import TokenSet, token_path
from common.tokens.tokenizer import OHLCTokenizer
from common.training.checkpoint import checkpoint_position, latest_good_checkpoint

__all__ = [
    "HARMLESS_ON_RESUME",
    "RUN_FILES",
    "OpenRun",
    "TokenSet",
    "auto_resume_run",
    "check_writable",
    "config_differences",
    "find_runs",
    "has_final_outputs",
    "new_run_dir",
    "open_run",
    "resolve_resume",
    "reuse_unstarted_run",
]

# Keys a resumed run may change (with --set): they don't touch the model, the data, the
# optimizer or the batch order. Everything else must equal the run's config.json.
HARMLESS_ON_RESUME = (
    "training.epochs",
    "training.early_stopping_patience",
    "training.checkpoint_every_minutes",
    "training.log_every_steps",
    "training.keep_checkpoints",
    "training.eval_max_batches",
    "training.peak_flops",
    "training.device",
    "training.gradient_checkpointing",
    "training.scorecard_origins",
    "training.scorecard_samples",
    "training.scorecard_budget",
    "training.tracker",
    "data.shards",
    "slurm.",
)
_STAMP = "%Y%m%d_%H%M%S"
# What a run writes before its first resumable checkpoint (its set-up, the trainer's log and
# tensorboard, and best_model.pt, published just before the first epoch checkpoint): a folder
# holding nothing else has nothing to resume from, and a new run may start over in it.
_BEFORE_FIRST_CHECKPOINT = (
    "config.json",
    "tokenizer.json",
    "asset_info.json",
    "data_info.json",
    "tokens",
    "tokens.npz",
    "training_log.json",
    "tensorboard",
    "wandb",
    "mlruns",
    "best_model.pt",
)


def check_writable(folder: Path) -> None:
    """Create `folder` if needed and prove a file can be written in it, or raise UserError."""
    _check_writable(
        folder,
        "run folder location",
        "fix its permissions or free space, or point --config at a case folder you can write",
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
    logs = {run: _read_log(run) for run in runs}
    me = scheduler.slurm_job_id()
    mine = [run for run in runs if me and logs[run].get("slurm_job_id") == me]
    if mine:
        return mine[-1]
    if not runs:
        return None
    newest = runs[-1]
    log = logs[newest]
    done = log.get("status") == "failed" or (
        log.get("status") in ("finished", "early_stopped") and has_final_outputs(newest)
    )
    if done or _live_owner(newest, log) is not None:
        return None
    return newest


def _live_owner(run_dir: Path, log: Optional[dict] = None) -> Optional[str]:
    """The id of another Slurm job, still queued or running, that trains this run (else None)."""
    owner = (log if log is not None else _read_log(run_dir)).get("slurm_job_id")
    # through the module, so a test can stand in for squeue
    return owner if owner and owner != scheduler.slurm_job_id() and scheduler.job_is_alive(owner) else None


def has_final_outputs(run_dir: Path) -> bool:
    """Whether the run's report.png and test_results.json are written (test_results.json comes
    last, and records a report that could not be drawn, so it is not retried forever)."""
    try:
        results = json.loads((run_dir / "test_results.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return (run_dir / "report.png").is_file() or (isinstance(results, dict) and "report_error" in results)


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


def _read_log(run_dir: Path) -> dict:
    try:
        log = json.loads((run_dir / "training_log.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}  # no log yet (died before its first step) or unreadable: nothing recorded
    return log if isinstance(log, dict) else {}


def _flatten(cfg: Config | Mapping[str, Any]) -> dict[str, Any]:
    """'section.key' -> value (a config is sections of leaves; a dict value is one leaf)."""
    out = {}
    raw = config_to_dict(cfg) if isinstance(cfg, Config) else cfg
    for name, value in raw.items():
        if isinstance(value, Mapping):
            out.update({f"{name}.{k}": v for k, v in value.items()})
        else:
            out[name] = value
    return out


def config_differences(
    a: Config | Mapping[str, Any], b: Config | Mapping[str, Any], harmless: Sequence[str] = HARMLESS_ON_RESUME
) -> list[str]:
    """Keys (as 'section.key: a_value != b_value') where two configs (or their dicts, as
    stored in a checkpoint) describe different runs. A key one side lacks counts as its default:
    a checkpoint written before a setting existed describes the run the default gives."""
    defaults = _flatten(Config())
    fa, fb = {**defaults, **_flatten(a)}, {**defaults, **_flatten(b)}
    out = []
    for key in sorted(set(fa) | set(fb)):
        if any(key == h or (h.endswith(".") and key.startswith(h)) for h in harmless):
            continue
        if fa.get(key) != fb.get(key):
            out.append(f"{key}: {fa.get(key)!r} != {fb.get(key)!r}")
    return out


# What a finished epoch leaves in a run folder, enough to rebuild its best model (forecasts,
# exports); evaluating the test split also needs the token set (tokens/).
RUN_FILES = ("config.json", "tokenizer.json", "asset_info.json", "best_model.pt")


@dataclass
class OpenRun:
    """A run folder's files read back: config.json, tokenizer.json, asset_info.json, and the token
    set when asked for; best_model.pt is known to exist, and is the caller's to load."""

    path: Path
    cfg: Config
    tokenizer: Any  # common.tokens.tokenizer.OHLCTokenizer
    info: RunInfo  # asset_info.json
    tokens: Optional[TokenSet] = None


def open_run(run_dir: str | os.PathLike, need_tokens: bool) -> OpenRun:
    """Check that `run_dir` is a run folder with a best model and read its files, or raise a
    UserError that says which file is missing or damaged. need_tokens: also the token set
    (the test split), for evaluation."""

    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise UserError(
            f"{run_dir}: no such run folder; pass one like case_c_crypto/checkpoints/<experiment>_YYYYMMDD_HHMMSS"
        )
    names = RUN_FILES[:-1] + ((token_path(run_dir).name,) if need_tokens else ()) + RUN_FILES[-1:]
    missing = [name for name in names if not (run_dir / name).exists()]
    if missing == ["best_model.pt"]:
        raise UserError(
            f"{run_dir}: no best_model.pt yet (the run has not finished an epoch); use a run "
            "that has, or wait for this one"
        )
    if missing:
        raise UserError(
            f"{run_dir}: missing {', '.join(missing)}; is it a run folder, and did training get past its set-up?"
        )
    return OpenRun(
        run_dir,
        load_config(run_dir / "config.json"),
        OHLCTokenizer.load(run_dir / "tokenizer.json"),
        RunInfo.read(run_dir / "asset_info.json"),
        TokenSet.load(token_path(run_dir)) if need_tokens else None,
    )
