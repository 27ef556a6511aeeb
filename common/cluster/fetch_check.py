"""A fetched run's files, checked in their staging folder before any is moved into place.

`remote fetch` lists the run there, rsyncs the listed files into `.fetch_<run>` beside the run
folder, checks them (sizes against the listing, every checkpoint's CRC32s as load_checkpoint
checks them, every JSON file parses), and only then renames each file to its final name, so
the run folder never holds a partial file.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

__all__ = ["fetch_problems", "parse_listing", "publish"]


def parse_listing(listing: str, all_checkpoints: bool) -> dict[str, int]:
    """`find -printf '%s\\t%P\\n'` -> {relative path: size}, epoch checkpoints left out unless asked."""
    from common.run.checkpoint import checkpoint_position  # lazy: torch, and only when fetching

    files = {}
    for line in listing.splitlines():
        size, _, name = line.partition("\t")
        if not name or name.startswith(".rsync-partial/"):
            continue
        if not all_checkpoints and checkpoint_position(name) is not None:
            continue
        files[name] = int(size)
    return files


def fetch_problems(folder: Path, files: dict[str, int]) -> list[str]:
    """What is wrong with the fetched files, one line each (none: every listed file arrived whole,
    with its size, each checkpoint's CRC32s, each JSON file parsing)."""
    from common.run.checkpoint import verify_checkpoint  # lazy: torch, and only when fetching

    bad = []
    for name, size in sorted(files.items()):
        path = folder / name
        if not path.is_file():
            bad.append(f"{name}: missing")
        elif path.stat().st_size != size:
            bad.append(f"{name}: {path.stat().st_size} bytes, {size} there (changed while fetching? fetch again)")
        elif name.endswith(".pt") and not verify_checkpoint(path):
            bad.append(f"{name}: fails its CRC32 check (damaged there or in transit)")
        elif name.endswith(".json"):
            try:
                json.loads(path.read_text())
            except ValueError as e:
                bad.append(f"{name}: not valid JSON ({e})")
    return bad


def publish(staging: Path, local: Path) -> None:
    """Move every checked file from the staging folder to its final name, each by one rename."""
    for path in sorted(staging.rglob("*")):
        if path.is_file() and ".rsync-partial" not in path.relative_to(staging).parts:
            target = local / path.relative_to(staging)
            target.parent.mkdir(parents=True, exist_ok=True)
            os.replace(path, target)
    for path in sorted(staging.rglob("*"), reverse=True):
        if path.is_dir():
            path.rmdir() if not any(path.iterdir()) else None
    if not any(staging.iterdir()):
        staging.rmdir()
