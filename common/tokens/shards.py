"""Token shards: a corpus prepared once into a memory-mapped token folder in the case's data cache.

    <case>/<data.cache_dir>/shards/<key>/   key: a hash of everything that decides the tokens
        manifest.json   what the shard holds and the sha256 of every file (common/tokens/shard_manifest.py)
        tokens/         the token folder (common/tokens/token_set.py) runs hard-link
        tokenizer.json, asset_info.json, data_info.json      what a run copies into its folder
    <case>/<data.cache_dir>/shards/<key>.work/   only while preparing: each asset's cleaned candles
                        and tokens, one file each, so a killed preparation continues where it stopped
    <case>/<data.cache_dir>/shards/.<key>.<random>.publish/   the finish stage's private folder

Nothing is published in place. Every file under <key>.work/ is written under a temp name and
renamed (a killed writer leaves no half file under a final name); the finish stage writes the
whole shard into a folder of its own and renames it to <key>, which succeeds once: a second
preparer (a resubmitted array, a training run started meanwhile, a task on another node) can
waste work but never corrupt or half-publish a shard. <key>.lock (flock) only saves that wasted
work where the filesystem supports it; no correctness rests on it (NFS without lockd and some
Lustre mounts do not carry flock across nodes).

The key covers the data settings (source, universe, dates, interval, split ratios, purge gap,
categories, ...; data.intervals and data.interval_split only when set, so older configs keep
their key), the tokenizer section, the context length, the time and volume inputs, the
formats of the tokenizer and the token folder, a fine-tuning parent's tokenizer, and the size
and time stamp of every input file (the parquet cache, your files, the sample): change any and
the next run prepares a new shard; change none and every run, rank and resumed job reuses it
without reading a candle.

Preparation runs in four stages (common.tokens.shard_stages), in one process here or as
Slurm array tasks (common.slurm.prepare_jobs); the key and paths: common.tokens.shard_paths.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket
import sys
import time
from pathlib import Path
from typing import Iterator, Optional, TextIO

from common.atomic import read_json
from common.config import Config
from common.errors import UserError
from common.run.files import ASSET_INFO_JSON, DATA_INFO_JSON, TOKENIZER_JSON
from common.tokens.corpus import Prepared
from common.tokens.ids import RunInfo
from common.tokens.shard_manifest import REBUILD, verify_shard
from common.tokens.shard_paths import published, shard_folder
from common.tokens.shard_stages import STAGES, prepare_stage, remove_leftover_work
from common.tokens.token_set import TokenSet
from common.tokens.tokenizer import OHLCTokenizer

__all__ = ["prepare_shards"]


def prepare_shards(
    cfg: Config, case_dir: Path, parent: Optional[Path] = None, out: Optional[TextIO] = None
) -> Prepared:
    """The config's shard, prepared now if no earlier run (or another job right now) made it.

    parent: a fine-tuning parent's tokenizer.json, whose token ids the corpus is encoded with."""
    out = out or sys.stdout
    folder, _ = shard_folder(cfg, case_dir, parent)
    if not published(folder):
        with _locked(folder.with_name(f"{folder.name}.lock"), out):
            if not published(folder):  # not made by the job we waited for
                started = time.monotonic()
                for stage in STAGES:
                    prepare_stage(cfg, case_dir, stage, parent=parent, out=out)
                shard = _open(folder)
                by = read_json(folder / "manifest.json").get("prepared_by") or {}
                if (by.get("host"), by.get("pid")) == (socket.gethostname(), os.getpid()):
                    seconds = time.monotonic() - started
                    print(f"Token shards: prepared {folder} in {seconds:.1f} s", file=out, flush=True)
                else:  # a preparer without our lock (another node, no flock) published first
                    print(f"Token shards: {folder} was published by another preparer ({by or 'unknown'})", file=out)
                return shard
    remove_leftover_work(folder, out)
    shard = _open(folder)
    print(
        f"Token shards: reusing {folder} ({len(shard.tokens.symbols)} assets, "
        f"{sum(len(t) for t in shard.tokens.tokens.values()):,} candles; no candle read)",
        file=out,
        flush=True,
    )
    return shard


def _open(folder: Path) -> Prepared:
    verify_shard(folder)  # sizes, the manifest's checksum, the sha256 of every file
    try:
        return Prepared(
            TokenSet.load(folder / "tokens"),
            OHLCTokenizer.load(folder / TOKENIZER_JSON),
            RunInfo.from_json(read_json(folder / ASSET_INFO_JSON)),
            read_json(folder / DATA_INFO_JSON),
        )
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise UserError(f"the token shard {folder} is damaged ({e}); {REBUILD}") from None


@contextlib.contextmanager
def _locked(lock: Path, out: TextIO) -> Iterator[None]:
    """Hold an exclusive flock on `lock` where the filesystem has one (the kernel drops it when
    the holder dies, so a killed preparer never blocks the next one). It only keeps a second
    preparer from repeating the first one's work: publishing is safe without it."""
    lock.parent.mkdir(parents=True, exist_ok=True)
    with open(lock, "a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(
                f"Token shards: another job is preparing {lock.with_suffix('')}; waiting for it", file=out, flush=True
            )
            fcntl.flock(f, fcntl.LOCK_EX)
        except OSError:  # no flock here (NFS without lockd): preparers may race, which costs only time
            yield
            return
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)
