"""A token shard's manifest.json: what the shard holds, and a checksum of every file in it.

    {"key": ..., "created": ..., "assets": N, "candles": N, "inputs": {...},
     "files": {"tokens/tokens.bin": {"bytes": ..., "sha256": ...}, ...},
     "manifest_sha256": the sha256 of this JSON without this field (sorted keys)}

The manifest is written last into the shard's private folder, which is then published whole by
a rename (common/tokens/shards.py), so a shard folder either has a manifest that names every
file or does not exist. Readers verify what they open: every file's size, the manifest's own
checksum and the full sha256 of each file up to FULL_CHECK_BYTES (training, each time a run or
rank opens the shard); `marketgpt data check` verifies every byte. A mismatch is one line naming
the file and the command that rebuilds the shard. Shards published before checksums have no
"files": they are checked by size only, as then.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Iterable, Optional

from common.errors import UserError

__all__ = ["FULL_CHECK_BYTES", "REBUILD", "Hasher", "file_sha256", "manifest_checksum", "verify_shard"]

# Training hashes each file up to this size whenever it opens a shard (a 10^8-candle shard's
# tokens.bin is 200 MB: well under a second); larger files (moves.bin, features.bin at that
# size) are checked by size there and in full by `marketgpt data check`.
FULL_CHECK_BYTES = 256 * 2**20
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


def file_sha256(path: Path) -> dict:
    """{"bytes", "sha256"} of a file, read in chunks."""
    h = hashlib.sha256()
    size = 0
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
            size += len(chunk)
    return {"bytes": size, "sha256": h.hexdigest()}


def manifest_checksum(manifest: dict) -> str:
    body = {k: v for k, v in manifest.items() if k != "manifest_sha256"}
    return hashlib.sha256(json.dumps(body, sort_keys=True, default=str).encode()).hexdigest()


def verify_shard(folder: Path, full: bool = False, only: Optional[Iterable[str]] = None) -> dict:
    """The shard's manifest, after checking that the shard is what it says: the manifest's own
    checksum, every file's size, and the sha256 of every file (full=True) or of those up to
    FULL_CHECK_BYTES. A UserError naming the first damaged file otherwise."""
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
        if (full or size <= FULL_CHECK_BYTES) and file_sha256(path)["sha256"] != want["sha256"]:
            raise _damaged(folder, path, "does not match its sha256 in manifest.json (changed on disk)")
    return manifest


def _damaged(folder: Path, file: Path, why: str) -> UserError:
    return UserError(f"the token shard {folder} is damaged: {file.relative_to(folder)} {why}; {REBUILD}")
