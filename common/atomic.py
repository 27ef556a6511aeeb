"""Atomic file writes: a reader sees the old file or the new one, never half of one.

Every file the suite writes that someone may read while a job runs (training_log.json,
checkpoints, the parquet cache, its manifest) goes through here: write to a temp file in the
same directory, fsync it, rename it over the target, fsync the directory.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Iterator

from common.errors import UserError

__all__ = [
    "atomic_folder",
    "atomic_path",
    "atomic_savefig",
    "atomic_write_bytes",
    "atomic_write_json",
    "check_writable",
    "default_mode",
    "publish_folder",
    "read_json",
    "replace_with",
    "temp_path",
]


def default_mode(folder: bool = False) -> int:
    """The mode a new file (folder) gets from the umask: 0o666 (0o777) less the umask's bits."""
    # mkstemp creates 0600 files (mkdtemp 0700 folders); what we publish should read like any
    # other the user writes (group members on a shared cluster read run folders and the data cache).
    umask = os.umask(0)
    os.umask(umask)
    return (0o777 if folder else 0o666) & ~umask


def _fsync_dir(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:  # some filesystems refuse to open directories; the rename is still atomic
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def temp_path(target: str | os.PathLike) -> Path:
    """A new empty temp file beside `target` (same filesystem, so the rename is atomic), named
    `.<target name>.<random>.tmp`."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    os.close(fd)
    return Path(tmp)


def replace_with(tmp: Path, target: str | os.PathLike, fsync: bool = True) -> None:
    """Publish the finished temp file `tmp` as `target`: permissions, fsync, rename, fsync dir.
    The temp file is removed if this fails."""
    target = Path(target)
    try:
        os.chmod(tmp, target.stat().st_mode & 0o777 if target.exists() else default_mode())
        if fsync:
            with open(tmp, "rb+") as f:
                os.fsync(f.fileno())
        os.replace(tmp, target)
        if fsync:
            _fsync_dir(target.parent)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        raise


@contextlib.contextmanager
def atomic_path(target: str | os.PathLike, fsync: bool = True) -> Iterator[Path]:
    """Yield a temp path beside `target`; on clean exit it replaces `target` atomically.

    The caller writes the file at the yielded path by any means (torch.save, pyarrow, ...).
    On an exception the temp file is removed and `target` is left untouched.
    """
    tmp = temp_path(target)
    try:
        yield tmp
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        raise
    replace_with(tmp, target, fsync)


@contextlib.contextmanager
def atomic_folder(target: str | os.PathLike) -> Iterator[Path]:
    """Yield a new empty folder beside `target`; on clean exit it becomes `target` by rename
    (an existing `target` is swapped out and removed). On an exception it is removed and
    `target` is left untouched, so a reader sees the old folder or the whole new one."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent))
    try:
        os.chmod(tmp, default_mode(folder=True))
        yield tmp
        if target.exists():
            old = target.with_name(f".{target.name}.old")
            shutil.rmtree(old, ignore_errors=True)
            os.replace(target, old)
            os.replace(tmp, target)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, target)
        _fsync_dir(target.parent)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def publish_folder(tmp: Path, target: str | os.PathLike) -> bool:
    """Rename the finished folder `tmp` to `target` unless `target` exists: True if it was
    published, False if another writer's whole folder got there first (`tmp` is then the
    caller's to remove). Unlike atomic_folder, a published folder is never replaced."""
    target = Path(target)
    os.chmod(tmp, default_mode(folder=True))
    try:
        os.rename(tmp, target)
    except OSError as e:
        if e.errno in (errno.EEXIST, errno.ENOTEMPTY) and target.is_dir():
            return False
        raise
    _fsync_dir(target.parent)
    return True


def atomic_write_bytes(target: str | os.PathLike, data: bytes, fsync: bool = True) -> None:
    with atomic_path(target, fsync=fsync) as tmp:
        tmp.write_bytes(data)


def atomic_write_json(target: str | os.PathLike, obj: Any, fsync: bool = True) -> None:
    """Write `obj` as indented JSON (NaN/inf are refused: jq cannot read them)."""
    text = json.dumps(obj, indent=2, allow_nan=False, default=_json_default) + "\n"
    atomic_write_bytes(target, text.encode("utf-8"), fsync=fsync)


def atomic_savefig(fig: Any, path: str | os.PathLike, dpi: int = 100) -> None:
    """Write a matplotlib figure as a PNG atomically (matplotlib is the caller's: nothing is imported here)."""
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=dpi)


def read_json(path: str | os.PathLike) -> Any:
    with open(path, "r", encoding="utf-8") as f:
        return json.load(f)


def read_json_or_empty(path: str | os.PathLike) -> dict:
    """A JSON object file, or {} when it is missing, unreadable or not an object (optional outputs)."""
    try:
        data = read_json(path)
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _json_default(obj: Any) -> Any:
    # numpy scalars and paths show up in metrics and configs; everything else is a bug.
    if hasattr(obj, "item") and callable(obj.item):
        return obj.item()
    if isinstance(obj, os.PathLike):
        return os.fspath(obj)
    raise TypeError(f"not JSON serializable: {type(obj).__name__}")


def check_writable(folder: Path, what: str, fix: str) -> None:
    """Create `folder` if needed and prove a file can be written in it, else a UserError
    "<what> <folder> is not writable (<why>); <fix>"."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".write_test_", dir=folder)
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise UserError(f"{what} {folder} is not writable ({e.strerror or e}); {fix}") from None
