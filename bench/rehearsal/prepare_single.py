"""Stage 3b, the reference: `marketgpt data prepare` without --array, on the same candles (hard
links) in another data.cache_dir. The shard the faulted array published must hold the same files,
byte for byte; so must the one the training started meanwhile published, where it won the race."""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path
from typing import Any

from rehearsal import checks
from rehearsal.base import CONFIG, Rehearsal, overrides, sets, shard_of

SINGLE = "data.cache_dir=data_single"


def link_tree(src: Path, dst: Path) -> None:
    """The candle files (not the shards) hard-linked under `dst`: the same bytes, no more disk."""
    shutil.copytree(src, dst, copy_function=os.link, ignore=shutil.ignore_patterns("shards", "*.lock"))


def file_hashes(folder: Path) -> dict[str, str]:
    out = {}
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        digest = hashlib.sha256()
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
        out[path.relative_to(folder).as_posix()] = digest.hexdigest()
    return out


def prepare_in_one_process(r: Rehearsal) -> dict[str, Any]:
    link_tree(r.case / "data", r.case / SINGLE.split("=")[1])
    proc = r.cli("prepare_single", "data", "prepare", "--config", CONFIG, *sets(overrides(r.size, SINGLE)))
    single = shard_of(r, SINGLE)
    b = file_hashes(single) if single.is_dir() else {}
    compared = {}
    if not r.rounds:  # the array preparation broke before it published anything
        r.check(checks.result("the array's shard equals a one-process preparation", False, "no array round ended"))
    # the last round is the faulted array's (the raced one, where the array won it)
    for i, (name, round_) in enumerate(r.rounds.items()):
        faulted = i == len(r.rounds) - 1
        shard = shard_of(r, *([f"data.cache_dir={round_['cache_dir']}"] if round_["cache_dir"] != "data" else []))
        a = file_hashes(shard) if shard.is_dir() else {}
        c = checks.shard_equals_single(proc.returncode, a, b, round_["publisher"], faulted)
        r.check(c)
        compared[name] = {"publisher": round_["publisher"], "files": c["files"], "differ": c["differ"]}
        if name == "raced" and c["differ"] and b:  # the shard the later stages read: repaired, so they test themselves
            repair(shard, single, [*c["differ"], "manifest.json"])  # its checksums too
    return {
        "exit": proc.returncode,
        "files": len(b),
        "compared": compared,
        "bytes": sum(p.stat().st_size for p in single.rglob("*") if p.is_file()) if single.is_dir() else 0,
    }


def repair(shard: Path, single: Path, names: list[str]) -> None:
    """What a user does on a broken shard: prepare it again (here: the one-process files)."""
    for name in names:
        (shard / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(single / name, shard / f"{name}.repair")
        os.replace(shard / f"{name}.repair", shard / name)  # new files: a run's hard links keep the old
