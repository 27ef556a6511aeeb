"""Checkpoint files: atomic, checksummed, loadable with `torch.load(weights_only=True)`.

A checkpoint is a plain `torch.save` file (only tensors, numbers, strings, lists, tuples and
dicts), so `torch.load(path, weights_only=True)` opens it anywhere. Beside each one sits a
sidecar `<name>.sha256` in `sha256sum` format (`sha256sum -c best_model.pt.sha256` checks it
by hand). Writing order, so a `kill -9` at any moment leaves something checkable:

1. the sidecar is rewritten to list the new digest next to the one it already had,
2. the checkpoint is written to a temp file (hashed on the fly), fsynced and renamed over
   the target (common.atomic.atomic_path),
3. the sidecar is rewritten with the new digest only.

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
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import IO, Any, Callable, Mapping

import torch

from common.atomic import atomic_path, atomic_write_bytes
# The plain model under MultiGPUWrapper / DDP / DataParallel / torch.compile, which checkpoints
# store: one implementation, in distributed_utils where the wrappers live.
from common.distributed_utils import unwrap as unwrap_model
from common.errors import UserError

__all__ = [
    "CorruptCheckpoint",
    "checkpoint_files",
    "checkpoint_position",
    "epoch_checkpoint_name",
    "latest_good_checkpoint",
    "load_checkpoint",
    "prune_checkpoints",
    "save_checkpoint",
    "sidecar_path",
    "step_checkpoint_name",
    "unwrap_model",
    "unwrap_state_dict",
    "verify_checkpoint",
]

_NAME = re.compile(r"^checkpoint_epoch_(\d+)(?:_step_(\d+))?\.pt$")
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


class _HashingWriter:
    """File wrapper that hashes what torch.save writes, so the file is never read back.

    A big chunk is hashed on a helper thread while this one writes it: both drop the GIL, so
    the sha256 (about 0.5 s per GB here) overlaps the write instead of adding to it. Each
    chunk is hashed before write() returns, in order, while torch still holds its buffer.
    """

    _OVERLAP_BYTES = 1 << 20  # smaller chunks: a thread hand-off costs more than it saves

    def __init__(self, f: IO[bytes], hasher: ThreadPoolExecutor) -> None:
        self.f, self.sha, self.hasher = f, hashlib.sha256(), hasher

    def write(self, data: bytes) -> int:
        if len(data) < self._OVERLAP_BYTES:
            self.sha.update(data)
            return self.f.write(data)
        hashed = self.hasher.submit(self.sha.update, data)
        try:
            return self.f.write(data)
        finally:
            hashed.result()

    def flush(self) -> None:
        self.f.flush()


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


def save_checkpoint(obj: Mapping[str, Any], path: str | os.PathLike) -> str:
    """Write `obj` to `path` atomically with its sha256 sidecar; returns the digest."""
    path = Path(path)
    sidecar = sidecar_path(path)
    with atomic_path(path) as tmp:
        with open(tmp, "wb") as f, ThreadPoolExecutor(1, thread_name_prefix="sha256") as hasher, _no_zip_crc32():
            writer = _HashingWriter(f, hasher)
            torch.save(dict(obj), writer)
        digest = writer.sha.hexdigest()
        # Both digests are valid while the rename below is in flight.
        old = _read_digests(sidecar)[:1] if path.exists() else []
        _write_sidecar(sidecar, path.name, [digest] + [d for d in old if d != digest])
    _write_sidecar(sidecar, path.name, [digest])
    return digest


def _file_digest(path: Path) -> str:
    sha = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            sha.update(block)
    return sha.hexdigest()


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
    """Load a checkpoint with weights_only=True, checking its sha256 first.

    A file without a sidecar loads with a warning on stderr (copied by hand, or written by
    another tool); one that doesn't match its sidecar raises CorruptCheckpoint.
    """
    path = Path(path)
    if not path.is_file():
        raise UserError(f"checkpoint not found: {path}")
    if verify:
        ok = verify_checkpoint(path)
        if ok is False:
            raise CorruptCheckpoint(f"{path}: checksum mismatch (truncated or corrupted file); "
                                    "use an earlier checkpoint")
        if ok is None:
            print(f"warning: {path} has no {sidecar_path(path).name}; loading it unchecked", file=sys.stderr)
    try:
        return torch.load(path, map_location=map_location, weights_only=True)
    except Exception as e:  # a truncated zip, a pickle with code in it, ...
        raise CorruptCheckpoint(f"{path}: cannot be loaded ({type(e).__name__}: {str(e).splitlines()[0]})") from None


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
