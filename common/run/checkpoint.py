"""Checkpoint files: atomic, self-checking, loadable with `torch.load(weights_only=True)`.

A checkpoint is a plain `torch.save` file (only tensors, numbers, strings, lists, tuples and
dicts), so `torch.load(path, weights_only=True)` opens it anywhere. torch.save writes a zip
archive whose every record carries its CRC32: `verify_checkpoint` checks them all (as
`unzip -t best_model.pt` does by hand), so a truncated, bit-rotted or half-copied file is
caught before anyone trains on it, and `--resume auto` falls back to the previous good
checkpoint with a warning. (torch.load itself reads a flipped bit without noticing.)

Writing: torch.save into a temp file beside the target, fsync, rename over the target, fsync
the directory (common.atomic): a `kill -9` at any moment leaves the old file or the new one,
whole. The trainer saves through a CheckpointWriter: training waits for the torch.save only,
and a background thread does the fsync, the rename and the pruning of older checkpoints.

File names in a run folder (ordered by position in training):
- `checkpoint_epoch_N.pt`: after epoch N (1-based); the last `training.keep_checkpoints` kept.
- `checkpoint_epoch_N_step_S.pt`: inside epoch N after S optimizer steps, written on the
  timer (`training.checkpoint_every_minutes`) or on a signal; removed once a later epoch
  checkpoint exists, and at most two are kept.
- `best_model.pt`: the model with the best val loss so far (no optimizer state).
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import zipfile
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, Mapping, Optional

import torch

from common.atomic import replace_with, temp_path
from common.config import Config, config_to_dict
from common.errors import UserError

__all__ = [
    "CheckpointWriter",
    "best_model_state",
    "CorruptCheckpoint",
    "checkpoint_files",
    "checkpoint_position",
    "epoch_checkpoint_name",
    "latest_good_checkpoint",
    "load_checkpoint",
    "prune_checkpoints",
    "remove_stale_temp_files",
    "save_checkpoint",
    "step_checkpoint_name",
    "unwrap_state_dict",
    "verify_checkpoint",
]

_NAME = re.compile(r"^checkpoint_epoch_(\d+)(?:_step_(\d+))?\.pt$")
# atomic.temp_path's names for what a trainer writes: checkpoints, the log, the final outputs
_TEMP_NAME = re.compile(
    r"^\.((checkpoint_epoch_\d+(_step_\d+)?|best_model)\.pt|training_log\.json|test_results\.json"
    r"|report\.png)\.\w+\.tmp$"
)
_WRAPPER_PREFIXES = ("module.", "_orig_mod.")  # DDP / DataParallel, torch.compile


class CorruptCheckpoint(UserError):
    """A checkpoint that is truncated, fails its CRC32 check, or can't be read."""


# --------------------------------------------------------------------------- names


def epoch_checkpoint_name(epoch: int) -> str:
    return f"checkpoint_epoch_{epoch}.pt"


def step_checkpoint_name(epoch: int, step: int) -> str:
    return f"checkpoint_epoch_{epoch}_step_{step}.pt"


def checkpoint_position(path: str | os.PathLike) -> tuple[int, float] | None:
    """(epoch, step) for ordering; an end-of-epoch checkpoint sorts after all of its steps."""
    m = _NAME.match(Path(path).name)
    if m is None:
        return None
    return int(m.group(1)), float(m.group(2)) if m.group(2) is not None else float("inf")


def checkpoint_files(run_dir: str | os.PathLike) -> list[Path]:
    """The run's resumable checkpoints, oldest first (temp files and best_model.pt excluded)."""
    found = [p for p in Path(run_dir).glob("checkpoint_epoch_*.pt") if checkpoint_position(p) is not None]
    return sorted(found, key=_position)


def _position(path: Path) -> tuple[int, float]:
    """checkpoint_position of a file checkpoint_files lists (so it has one)."""
    position = checkpoint_position(path)
    assert position is not None
    return position


# --------------------------------------------------------------------------- write and read


def _zip_crc32_on() -> contextlib.AbstractContextManager:
    """torch.save's per-record CRC32s are what verify_checkpoint checks: keep them on even if
    someone switched them off globally (torch.utils.serialization.config)."""
    try:
        from torch.utils.serialization import config
    except ImportError:  # an older torch always computes them
        return contextlib.nullcontext()
    return config.patch({"save.compute_crc32": True})  # type: ignore[attr-defined]  # made at import, untyped


def _serialize(obj: Mapping[str, Any], path: Path) -> Path:
    """torch.save `obj` into a new temp file beside `path`: the only step that must finish
    before the caller may change the tensors again."""
    tmp = temp_path(path)
    try:
        with _zip_crc32_on():
            torch.save(dict(obj), str(tmp))
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return tmp


def save_checkpoint(obj: Mapping[str, Any], path: str | os.PathLike) -> None:
    """Write `obj` to `path` atomically (see the module docstring)."""
    path = Path(path)
    replace_with(_serialize(obj, path), path)


class CheckpointWriter:
    """save_checkpoint with the slow half off the caller's thread.

    save() returns once the state is serialized into a temp file (plain torch.save speed), so
    training may change the tensors again. A background thread then fsyncs it, renames it over
    the target and runs `then` (the trainer prunes there, so an older checkpoint goes only once
    a newer one is on disk). Saves publish in order; a crash at any point leaves the same files
    as save_checkpoint. check() raises a failed publish without waiting; wait() blocks until
    everything is published and raises the first failure: call it before reading the files or
    exiting.
    """

    _MAX_PENDING = 2  # temp files waiting to publish: bounds the extra disk a burst of saves takes

    def __init__(self) -> None:
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="checkpoint-publish")
        self._pending: list[Future] = []

    def save(self, obj: Mapping[str, Any], path: str | os.PathLike, then: Optional[Callable[[], Any]] = None) -> None:
        path = Path(path)
        tmp = _serialize(obj, path)
        self._pending.append(self._pool.submit(self._publish, tmp, path, then))
        self._reap(keep=self._MAX_PENDING)  # raises an earlier save's failure, this one queued

    def check(self) -> None:
        self._reap(keep=len(self._pending))

    def wait(self) -> None:
        self._reap(keep=0)

    def _reap(self, keep: int) -> None:
        """Collect finished publishes (and wait until at most `keep` are left); raise the
        first failure among them, after collecting the rest."""
        errors = []
        while len(self._pending) > keep or (self._pending and self._pending[0].done()):
            try:
                self._pending.pop(0).result()
            except Exception as e:
                errors.append(e)
        if errors:
            raise errors[0]

    @staticmethod
    def _publish(tmp: Path, path: Path, then: Optional[Callable[[], Any]]) -> None:
        replace_with(tmp, path)
        if then is not None:
            then()


def remove_stale_temp_files(run_dir: str | os.PathLike) -> list[Path]:
    """Delete temp files a killed writer left (`kill -9`, a node crash) beside checkpoints, the
    training log and the final outputs. For the run folder's one trainer, at its start."""
    run_dir = Path(run_dir)
    stale = [p for p in run_dir.iterdir() if _TEMP_NAME.match(p.name)] if run_dir.is_dir() else []
    for path in stale:
        path.unlink(missing_ok=True)
    return stale


def _damage(path: Path) -> Optional[str]:
    """None if every record of the zip archive matches its CRC32, else what is wrong."""
    try:
        with zipfile.ZipFile(path) as archive:
            bad = archive.testzip()  # reads every record, 1 MB at a time
    except (zipfile.BadZipFile, OSError, EOFError, ValueError) as e:
        return f"truncated or corrupted: not a whole zip archive ({type(e).__name__}: {e})"
    if bad is not None:
        return f"truncated or corrupted: record {bad} fails its CRC32 check"
    return None


def verify_checkpoint(path: str | os.PathLike) -> bool:
    """True if the file is a whole torch.save archive whose every record matches its CRC32."""
    return _damage(Path(path)) is None


def load_checkpoint(path: str | os.PathLike, map_location: str | torch.device = "cpu", verify: bool = True) -> dict:
    """Load a checkpoint with weights_only=True and check every record's CRC32.

    The check runs on a helper thread while torch.load reads the file (weights_only makes
    reading a damaged file harmless; its result is then thrown away). A damaged file raises
    CorruptCheckpoint.
    """
    path = Path(path)
    if not path.is_file():
        raise UserError(f"checkpoint not found: {path}")
    with ThreadPoolExecutor(1, thread_name_prefix="checkpoint-verify") as pool:
        check = pool.submit(_damage, path) if verify else None
        try:
            state, error = torch.load(path, map_location=map_location, weights_only=True), None
        except Exception as e:  # a truncated zip, a pickle with code in it, ...
            state, error = None, e
        damage = check.result() if check is not None else None
    if damage is not None:
        raise CorruptCheckpoint(f"{path}: {damage}; use an earlier checkpoint")
    if error is not None:
        raise CorruptCheckpoint(
            f"{path}: cannot be loaded ({type(error).__name__}: {(str(error).splitlines() or [''])[0]})"
        ) from None
    return state


def latest_good_checkpoint(
    run_dir: str | os.PathLike, warn: Callable[[str], None] = lambda m: print(m, file=sys.stderr)
) -> Path | None:
    """The newest checkpoint of a run folder that checks out; older ones are the fallback."""
    for path in reversed(checkpoint_files(run_dir)):
        damage = _damage(path)
        if damage is None:
            return path
        warn(f"warning: {path} is {damage}; falling back to the previous checkpoint")
    return None


def prune_checkpoints(run_dir: str | os.PathLike, keep: int, keep_steps: int = 2) -> list[Path]:
    """Delete old checkpoints: keep the last `keep` epoch ones and the last `keep_steps`
    step ones newer than the newest epoch checkpoint. Returns what was deleted."""
    files = checkpoint_files(run_dir)
    epochs = [p for p in files if _position(p)[1] == float("inf")]
    steps = [p for p in files if _position(p)[1] != float("inf")]
    newest_epoch = _position(epochs[-1]) if epochs else (-1, 0.0)
    stale_steps = [p for p in steps if _position(p) < newest_epoch]
    fresh_steps = [p for p in steps if _position(p) > newest_epoch]
    doomed = epochs[:-keep] + stale_steps + fresh_steps[:-keep_steps]
    for path in doomed:
        path.unlink(missing_ok=True)
    return doomed


# --------------------------------------------------------------------------- unwrapping


def unwrap_state_dict(state: Mapping[str, Any]) -> dict[str, Any]:
    """Strip `module.` and `_orig_mod.` prefixes, so any wrapper's weights load into the plain model."""
    out = {}
    for key, value in state.items():
        changed = True
        while changed:
            changed = False
            for prefix in _WRAPPER_PREFIXES:
                if key.startswith(prefix):
                    key, changed = key[len(prefix) :], True
        out[key] = value
    return out


def best_model_state(model: Any, cfg: Config, epoch: int, global_step: int, val_loss: float) -> dict[str, Any]:
    """best_model.pt: the weights of the best epoch so far with what loads them (the model's
    config and table sizes) and where they were reached. `model`: the plain MarketGPT."""
    return {
        "model": unwrap_state_dict(model.state_dict()),
        "model_config": config_to_dict(cfg)["model"],
        "num_assets": model.num_assets,
        "num_categories": model.num_categories,
        "epoch": epoch,
        "global_step": global_step,
        "val_loss": float(val_loss),
        "config": config_to_dict(cfg),
    }
