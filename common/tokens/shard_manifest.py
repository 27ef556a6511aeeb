"""A token shard's manifest.json: what the shard holds, and a checksum of every file in it.

    {"key": ..., "created": ..., "assets": N, "candles": N,
     "prepared_by": {"host", "pid", "slurm_job"}: the preparer that published it (not in older shards),
     "inputs": {...},
     "files": {"tokens/tokens.bin": {"bytes": ..., "sha256": ...}, ...},
     "manifest_sha256": the sha256 of this JSON without this field (sorted keys)}

The manifest is written last into the shard's private folder, which is then published whole by
a rename (common/tokens/shards.py), so a shard folder either has a manifest that names every
file or does not exist. Readers verify what they open: every file's size, the manifest's own
checksum and the full sha256 of every file, once per process (`file_sha256` remembers what this
process has hashed: every rank checks every byte it will read, a rank that opens the shard and then
the run's hard links to it hashes them once). At 10^8 candles that is about 1 GB of tokens and
moves, a few seconds a rank (bench/bench_verify.py). A mismatch is one line naming the file and the
command that rebuilds the shard. Shards published before checksums have no "files": they are
checked by size only, as then.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Iterable, Optional

from common.errors import UserError

__all__ = ["REBUILD", "Hasher", "file_sha256", "manifest_checksum", "remember_sha256", "verify_shard"]

REBUILD = (
    "rebuild it with `marketgpt data prepare --rebuild` and the same --config and --set as the run "
    "(it moves the damaged shard aside and prepares it anew)"
)
_CHUNK = 8 * 2**20


class Hasher:
    """sha256 of a file as it is written (no second read of a large file)."""

    def __init__(self) -> None:
        self.digest, self.bytes = hashlib.sha256(), 0

    def write(self, f, data: bytes) -> None:  # noqa: ANN001 (an open binary file)
        f.write(data)
        self.digest.update(data)
        self.bytes += len(data)

    def entry(self) -> dict:
        return {"bytes": self.bytes, "sha256": self.digest.hexdigest()}


# (device, inode, size, mtime) -> {"bytes", "sha256"} of the files this process has hashed: a hard
# link of a file already hashed costs nothing, a file written since is hashed again
_HASHED: dict[tuple[int, int, int, int], dict] = {}


def remember_sha256(path: Path, entry: dict) -> None:
    """Record a file this process has just written and hashed as it wrote (a Hasher's entry), so
    opening it next does not read it again."""
    st = os.stat(path)
    _HASHED[(st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)] = dict(entry)


def file_sha256(path: Path) -> dict:
    """{"bytes", "sha256"} of a file, read in chunks, once per process for the same file."""
    st = os.stat(path)
    key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
    if key not in _HASHED:
        h = hashlib.sha256()
        size = 0
        with open(path, "rb") as f:
            while chunk := f.read(_CHUNK):
                h.update(chunk)
                size += len(chunk)
        _HASHED[key] = {"bytes": size, "sha256": h.hexdigest()}
    return dict(_HASHED[key])


def manifest_checksum(manifest: dict) -> str:
    body = {k: v for k, v in manifest.items() if k != "manifest_sha256"}
    return hashlib.sha256(json.dumps(body, sort_keys=True, default=str).encode()).hexdigest()


def verify_shard(folder: Path, only: Optional[Iterable[str]] = None) -> dict:
    """The shard's manifest, after checking that the shard is what it says: the manifest's own
    checksum, every file's size and sha256 (once per process). A UserError naming the first
    damaged file otherwise."""
    folder = Path(folder)
    manifest_file = folder / "manifest.json"
    try:
        manifest = json.loads(manifest_file.read_text())
    except (OSError, ValueError) as e:
        raise _damaged(folder, manifest_file, f"cannot read it ({e})") from None
    if not isinstance(manifest, dict):
        raise _damaged(folder, manifest_file, "not a JSON object")
    files = manifest.get("files")
    if files is None:  # published before checksums: the token folder checks sizes when opened
        return manifest
    if manifest.get("manifest_sha256") != manifest_checksum(manifest):
        raise _damaged(folder, manifest_file, "its own checksum does not match its content")
    for name, want in files.items():
        if only is not None and name not in only:
            continue
        path = folder / name
        try:
            size = path.stat().st_size
        except OSError:
            raise _damaged(folder, path, "is missing") from None
        if size != want["bytes"]:
            raise _damaged(folder, path, f"has {size:,} bytes where the manifest says {want['bytes']:,} (truncated?)")
        if file_sha256(path)["sha256"] != want["sha256"]:
            raise _damaged(folder, path, "does not match its sha256 in manifest.json (changed on disk)")
    return manifest


def _damaged(folder: Path, file: Path, why: str) -> UserError:
    return UserError(f"the token shard {folder} is damaged: {file.relative_to(folder)} {why}; {REBUILD}")
