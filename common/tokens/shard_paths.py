"""Where a config's token shard lives: its key (a hash of everything that decides the tokens),
whether it is published, its work folder while it is prepared, and moving a damaged one aside.
The layout and how a shard is published: common.tokens.shards."""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from pathlib import Path
from typing import Optional, TextIO

from common.config import Config, config_to_dict
from common.data.loading import input_files
from common.tokens.token_set import FORMAT_VERSION
from common.tokens.tokenizer import FORMAT_VERSION as TOKENIZER_FORMAT

__all__ = ["SHARD_VERSION", "published", "rebuild", "shard_folder", "work_folder"]

# bump when cleaning, splitting or encoding changes what a shard holds; 2: its tokenizer.json carries
# the within-bin quantiles that forecasts decode by (a shard of version 1 would train runs without them)
SHARD_VERSION = 2
# data settings that only choose windows or say where the cache is: not part of the key
_NOT_KEYED = ("window_stride", "epoch_stride", "cache_dir", "shards", "train_fraction", "fraction_by")
# data settings added after the seed configs: in the key only when not at their default, so every
# config that does not use them keeps its shard
_KEYED_WHEN_SET = {"intervals": [], "interval_split": "pooled"}
# model settings likewise: model.vol_level_input adds a 4th feature column, market_context 3 more
_MODEL_KEYED_WHEN_SET = {"vol_level_input": False, "market_context": False}


def shard_folder(cfg: Config, case_dir: Path, parent: Optional[Path] = None) -> tuple[Path, dict]:
    """(the shard folder this config's tokens belong in, the inputs its key is the hash of)."""
    data = {
        k: v
        for k, v in config_to_dict(cfg)["data"].items()
        if k not in _NOT_KEYED and not (k in _KEYED_WHEN_SET and v == _KEYED_WHEN_SET[k])
    }
    inputs = {
        "versions": {"shard": SHARD_VERSION, "token_folder": FORMAT_VERSION, "tokenizer": TOKENIZER_FORMAT},
        "data": data,
        "purge_gap": cfg.data.purge_gap or cfg.model.context_length,
        "model": {
            **{k: getattr(cfg.model, k) for k in ("vocab_size", "context_length", "time_features", "volume_input")},
            **{k: getattr(cfg.model, k) for k, off in _MODEL_KEYED_WHEN_SET.items() if getattr(cfg.model, k) != off},
            **({"market_peer": True} if cfg.model.reads_peer else {}),  # read only with market_context
        },
        "tokenizer": config_to_dict(cfg)["tokenizer"],
        "parent_tokenizer": _sha256(parent) if parent is not None else None,
        "files": [[str(p), *_stamp(p)] for p in input_files(cfg.data, case_dir)],
    }
    key = hashlib.sha256(json.dumps(inputs, sort_keys=True, default=str).encode()).hexdigest()[:16]
    return Path(case_dir) / cfg.data.cache_dir / "shards" / key, inputs


def _stamp(path: Path) -> tuple[int, int]:
    st = path.stat()
    return st.st_size, st.st_mtime_ns


def _sha256(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def published(folder: Path) -> bool:
    """Whether the shard is there: a shard folder appears whole, manifest.json included."""
    return (folder / "manifest.json").is_file()


def work_folder(folder: Path) -> Path:
    """Where the shard's preparation keeps its per-asset files until the finish stage."""
    return folder.with_name(f"{folder.name}.work")


def rebuild(folder: Path, out: Optional[TextIO] = None) -> Optional[Path]:
    """Move a published (damaged) shard aside, so the next preparation makes it anew; where it went.
    A run still reading the old one keeps its open files; the moved folder is the user's to delete."""
    if not folder.exists():
        return None
    aside = folder.with_name(f"{folder.name}.damaged-{time.strftime('%Y%m%d_%H%M%S')}")
    os.rename(folder, aside)
    print(f"Token shards: moved {folder} aside to {aside} (delete it when no run reads it)", file=out or sys.stdout)
    return aside
