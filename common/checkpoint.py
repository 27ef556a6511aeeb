"""Checkpoint files: atomic, checksummed, loadable with `torch.load(weights_only=True)`.

A checkpoint is a plain `torch.save` file (only tensors, numbers, strings, lists, tuples and
dicts), so `torch.load(path, weights_only=True)` opens it anywhere. Beside each one sits a
sidecar `<name>.sha256` in `sha256sum` format (`sha256sum -c best_model.pt.sha256` checks it
by hand). Writing order, so a `kill -9` at any moment leaves something checkable:

1. the checkpoint is written to a temp file (torch.save) and hashed,
2. the sidecar is rewritten to list the new digest next to the one it already had,
3. the temp file is fsynced and renamed over the target (common.atomic.replace_with),
4. the sidecar is rewritten with the new digest only.

The trainer runs steps 1 to 4 through a CheckpointWriter: training waits for the torch.save
only, and a background thread does the rest.

A file whose digest is not in its sidecar (truncated, bit-rotted, half-copied) is corrupt;
`--resume auto` then falls back to the previous good checkpoint with a warning.

File names in a run folder (ordered by position in training):
- `checkpoint_epoch_N.pt`: after epoch N (1-based); the last `training.keep_checkpoints` kept.
- `checkpoint_epoch_N_step_S.pt`: inside epoch N after S optimizer steps, written on the
  timer (`training.checkpoint_every_minutes`) or on a signal; removed once a later epoch
  checkpoint exists, and at most two are kept.
- `best_model.pt`: the model with the best val loss so far (no optimizer state).
"""
from __future__ import annotations

import contextlib
import hashlib
import os
import re
import sys
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, Mapping, Optional

import torch

from common.atomic import atomic_write_bytes, replace_with, temp_path
# The plain model under MultiGPUWrapper / DDP / DataParallel / torch.compile, which checkpoints
# store: one implementation, in distributed_utils where the wrappers live.
from common.distributed_utils import unwrap as unwrap_model
from common.errors import UserError

__all__ = [
    "CheckpointWriter",
    "CorruptCheckpoint",
    "checkpoint_files",
    "checkpoint_position",
    "epoch_checkpoint_name",
    "latest_good_checkpoint",
    "load_checkpoint",
    "prune_checkpoints",
    "remove_stale_temp_files",
    "save_checkpoint",
    "sidecar_path",
    "step_checkpoint_name",
    "unwrap_model",
    "unwrap_state_dict",
    "verify_checkpoint",
]

_NAME = re.compile(r"^checkpoint_epoch_(\d+)(?:_step_(\d+))?\.pt$")
_TEMP_NAME = re.compile(r"^\.(checkpoint_epoch_\d+(_step_\d+)?|best_model)\.pt(\.sha256)?\.\w+\.tmp$")  # atomic.temp_path
_WRAPPER_PREFIXES = ("module.", "_orig_mod.")  # DDP / DataParallel, torch.compile


class CorruptCheckpoint(UserError):
    """A checkpoint whose bytes don't match its recorded sha256, or that can't be read."""


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
    return sorted(found, key=checkpoint_position)


def sidecar_path(path: str | os.PathLike) -> Path:
    path = Path(path)
    return path.with_name(path.name + ".sha256")


# --------------------------------------------------------------------------- write and read


def _read_digests(sidecar: Path) -> list[str]:
    try:
        lines = sidecar.read_text(encoding="ascii").splitlines()
    except (OSError, UnicodeDecodeError):
        return []
    return [line.split()[0].lower() for line in lines if line.strip()]


def _write_sidecar(sidecar: Path, name: str, digests: list[str]) -> None:
    text = "".join(f"{d}  {name}\n" for d in digests)
    atomic_write_bytes(sidecar, text.encode("ascii"))


def _no_zip_crc32() -> contextlib.AbstractContextManager:
    """Switch off torch.save's CRC32 of every zip record: the sha256 sidecar already checks
    every byte, and the CRC costs 0.2 s per GB here. torch.load doesn't need it; `unzip -t`
    on a checkpoint would complain. An older torch without the switch computes it."""
    try:
        from torch.utils.serialization import config
    except ImportError:
        return contextlib.nullcontext()
    return config.patch({"save.compute_crc32": False})


def _file_digest(path: Path) -> str:
    sha = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            sha.update(block)  # releases the GIL: training goes on beside a background hash
    return sha.hexdigest()


def _serialize(obj: Mapping[str, Any], path: Path) -> Path:
    """torch.save `obj` into a new temp file beside `path`; the only step that must finish
    before the caller may change the tensors again."""
    tmp = temp_path(path)
    try:
        with _no_zip_crc32():
            torch.save(dict(obj), str(tmp))
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return tmp


def _publish(tmp: Path, path: Path) -> str:
    """Steps 1 (the hash) to 4 of the module docstring for a finished temp file; returns its digest."""
    try:
        digest = _file_digest(tmp)  # read back from the page cache: the bytes the file holds
        sidecar = sidecar_path(path)
        # Both digests are valid while the rename below is in flight.
        old = _read_digests(sidecar)[:1] if path.exists() else []
        _write_sidecar(sidecar, path.name, [digest] + [d for d in old if d != digest])
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    replace_with(tmp, path)
    _write_sidecar(sidecar, path.name, [digest])
    return digest


def save_checkpoint(obj: Mapping[str, Any], path: str | os.PathLike) -> str:
    """Write `obj` to `path` atomically with its sha256 sidecar; returns the digest."""
    path = Path(path)
    return _publish(_serialize(obj, path), path)


class CheckpointWriter:
    """save_checkpoint with the slow half off the caller's thread.

    save() returns once the state is serialized into a temp file (plain torch.save speed), so
    training may change the tensors again. A background thread then hashes that file, fsyncs
    it, renames it over the target with the sidecar protocol and runs `then` (the trainer
    prunes there, so an older checkpoint goes only once a newer one is on disk). Saves publish
    in order; a crash at any point leaves the same checkable files as save_checkpoint.
    wait() blocks until everything is published and raises the first failure: call it before
    reading the files or exiting.
    """

    _MAX_PENDING = 2  # temp files waiting to publish: bounds the extra disk a burst of saves takes

    def __init__(self) -> None:
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="checkpoint-publish")
        self._pending: list[Future] = []

    def save(self, obj: Mapping[str, Any], path: str | os.PathLike,
             then: Optional[Callable[[], Any]] = None) -> None:
        path = Path(path)
        tmp = _serialize(obj, path)
        self._pending.append(self._pool.submit(self._publish_then, tmp, path, then))
        self._reap(keep=self._MAX_PENDING)  # raises an earlier save's failure, this one queued

    def wait(self) -> None:
        self._reap(keep=0)

    def _reap(self, keep: int) -> None:
        errors = []
        while len(self._pending) > keep or (self._pending and self._pending[0].done()):
            try:
                self._pending.pop(0).result()
            except Exception as e:
                errors.append(e)
        if errors:
            raise errors[0]

    @staticmethod
    def _publish_then(tmp: Path, path: Path, then: Optional[Callable[[], Any]]) -> None:
        _publish(tmp, path)
        if then is not None:
            then()


def remove_stale_temp_files(run_dir: str | os.PathLike) -> list[Path]:
    """Delete temp files a killed writer left (`kill -9`, a node crash), each up to a whole
    checkpoint's size. For the run folder's one trainer, at its start."""
    run_dir = Path(run_dir)
    stale = [p for p in run_dir.iterdir() if _TEMP_NAME.match(p.name)] if run_dir.is_dir() else []
    for path in stale:
        path.unlink(missing_ok=True)
    return stale


def verify_checkpoint(path: str | os.PathLike) -> bool | None:
    """True if the file matches its sidecar, False if not (or unreadable), None without a sidecar."""
    path = Path(path)
    digests = _read_digests(sidecar_path(path))
    if not digests:
        return None if not sidecar_path(path).exists() else False
    try:
        return _file_digest(path) in digests
    except OSError:
        return False


def load_checkpoint(path: str | os.PathLike, map_location: str | torch.device = "cpu",
                    verify: bool = True) -> dict:
    """Load a checkpoint with weights_only=True and check its sha256.

    The check runs on a helper thread while torch.load reads the file (weights_only makes
    reading a corrupt file harmless; its result is thrown away). A file without a sidecar
    loads with a warning on stderr (copied by hand, or written by another tool); one that
    doesn't match its sidecar raises CorruptCheckpoint.
    """
    path = Path(path)
    if not path.is_file():
        raise UserError(f"checkpoint not found: {path}")
    with ThreadPoolExecutor(1, thread_name_prefix="checkpoint-verify") as pool:
        check = pool.submit(verify_checkpoint, path) if verify else None
        try:
            state, error = torch.load(path, map_location=map_location, weights_only=True), None
        except Exception as e:  # a truncated zip, a pickle with code in it, ...
            state, error = None, e
        ok = check.result() if check is not None else True
    if ok is False:
        raise CorruptCheckpoint(f"{path}: checksum mismatch (truncated or corrupted file); "
                                "use an earlier checkpoint")
    if ok is None:
        print(f"warning: {path} has no {sidecar_path(path).name}; loading it unchecked", file=sys.stderr)
    if error is not None:
        raise CorruptCheckpoint(f"{path}: cannot be loaded ({type(error).__name__}: "
                                f"{(str(error).splitlines() or [''])[0]})") from None
    return state


def latest_good_checkpoint(run_dir: str | os.PathLike,
                           warn: Callable[[str], None] = lambda m: print(m, file=sys.stderr)) -> Path | None:
    """The newest checkpoint of a run folder whose checksum holds; older ones are the fallback."""
    for path in reversed(checkpoint_files(run_dir)):
        ok = verify_checkpoint(path)
        if ok:
            return path
        why = "has no checksum sidecar" if ok is None else "is truncated or corrupted (checksum mismatch)"
        warn(f"warning: {path} {why}; falling back to the previous checkpoint")
    return None


def prune_checkpoints(run_dir: str | os.PathLike, keep: int, keep_steps: int = 2) -> list[Path]:
    """Delete old checkpoints: keep the last `keep` epoch ones and the last `keep_steps`
    step ones newer than the newest epoch checkpoint. Returns what was deleted."""
    files = checkpoint_files(run_dir)
    epochs = [p for p in files if checkpoint_position(p)[1] == float("inf")]
    steps = [p for p in files if checkpoint_position(p)[1] != float("inf")]
    newest_epoch = checkpoint_position(epochs[-1]) if epochs else (-1, 0.0)
    stale_steps = [p for p in steps if checkpoint_position(p) < newest_epoch]
    fresh_steps = [p for p in steps if checkpoint_position(p) > newest_epoch]
    doomed = epochs[:-keep] + stale_steps + fresh_steps[:-keep_steps]
    for path in doomed:
        # the checkpoint first: a sidecar without its file is harmless, the reverse is "unchecked"
        path.unlink(missing_ok=True)
        sidecar_path(path).unlink(missing_ok=True)
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
                    key, changed = key[len(prefix):], True
        out[key] = value
    return out
