"""Token shards: a corpus prepared once into a memory-mapped token folder in the case's data cache.

    <case>/<data.cache_dir>/shards/<key>/   key: a hash of everything that decides the tokens
        manifest.json   written last: a folder without it is unfinished and never read
        tokens/         the token folder (common/tokens/token_set.py) runs hard-link
        tokenizer.json, asset_info.json, data_info.json      what a run copies into its folder
        work/           only while preparing: each asset's cleaned candles and the encoding's
                        progress, so a killed preparation continues where it stopped
    <case>/<data.cache_dir>/shards/<key>.lock   one preparer at a time (flock); a second waits,
                        then reuses what the first made

The key covers the data settings (source, universe, dates, interval, split ratios, purge gap,
categories, ...), the tokenizer section, the context length, the time and volume inputs, the
formats of the tokenizer and the token folder, a fine-tuning parent's tokenizer, and the size
and time stamp of every input file (the parquet cache, your files, the sample): change any and
the next run prepares a new shard; change none and every run, rank and resumed job reuses it
without reading a candle.

Preparation streams asset by asset and holds one asset's candles at a time:
  1. clean   read, clean and gap-fill each asset (common.data.prepare.clean_asset) and keep
             its candles in work/clean/<i>.npz
  2. split   the cuts from the pooled timestamps alone (common.data.prepare.split_data)
  3. fit     the tokenizer (and the volume edges) on the train ranges only, asset by asset
  4. encode  each asset's tokens, moves (and time and volume ids) written at its offset into
             the preallocated arrays; work/encoded.json counts the assets done
The tokens equal those of the in-memory path (data.shards = false) bit for bit.
"""
from __future__ import annotations

import contextlib
import dataclasses
import errno
import fcntl
import hashlib
import json
import shutil
import sys
import time
from pathlib import Path
from typing import Any, Iterator, Mapping, Optional, TextIO

import numpy as np
import pandas as pd

from common.atomic import atomic_path, atomic_write_json, read_json
from common.config import Config, config_to_dict
from common.data.loading import input_files, load_market_data
from common.data.market import LazyFrames
from common.data.prepare import COLUMNS, PreparedData, clean_asset, prepare_data, split_data
from common.data.universe import asset_info
from common.errors import UserError
from common.markets import interval_step
from common.tokens.features import NUM_FEATURES, candle_features, fit_volume_edges, relative_volume
from common.tokens.token_set import FORMAT_VERSION, TokenSet, write_index
from common.tokens.tokenizer import FORMAT_VERSION as TOKENIZER_FORMAT
from common.tokens.tokenizer import OHLCTokenizer

__all__ = ["SHARD_VERSION", "Prepared", "encode_asset", "fit_tokenizer", "prepare_in_memory", "prepare_shards",
           "shard_folder"]

SHARD_VERSION = 1  # bump when cleaning, splitting or encoding changes what a shard holds
# data settings that only choose windows or say where the cache is: not part of the key
_NOT_KEYED = ("window_stride", "epoch_stride", "cache_dir", "shards")


@dataclasses.dataclass
class Prepared:
    """A corpus ready to train on: its token set (memory-mapped from a shard, or in memory) and
    what a run folder records beside it."""
    tokens: TokenSet
    tokenizer: OHLCTokenizer
    asset_info: dict
    data_info: dict


# --------------------------------------------------------------------------- shared with the in-memory path


def fit_tokenizer(cfg: Config, prepared: PreparedData, parent: Optional[Path] = None) -> OHLCTokenizer:
    """The tokenizer fitted on the train ranges only (asset by asset), or a fine-tuning parent's."""
    if parent is not None:
        return OHLCTokenizer.load(parent)
    train = (prepared.candles[a.symbol].iloc[prepared.splits[a.symbol].train.start:
                                             prepared.splits[a.symbol].train.stop] for a in prepared.assets)
    return OHLCTokenizer.from_config(cfg).fit(train)


def fit_volume(prepared: PreparedData) -> list[float]:
    """The volume-bin edges, fitted on the train ranges only."""
    def train_relative() -> Iterator[np.ndarray]:
        for a in prepared.assets:
            split = prepared.splits[a.symbol].train
            yield relative_volume(prepared.candles[a.symbol]["volume"].to_numpy(dtype=np.float64))[split.start:split.stop]
    return fit_volume_edges(train_relative())


def encode_asset(tokenizer: OHLCTokenizer, frame: pd.DataFrame, symbol: str, interval: str,
                 edges: Optional[list[float]]) -> tuple[np.ndarray, np.ndarray, Optional[np.ndarray]]:
    """One asset's (tokens, moves, time and volume ids or None when `edges` is None)."""
    tokens = tokenizer.encode(frame, asset=symbol)
    moves = tokenizer.features(frame, asset=symbol)[0]
    features = None if edges is None else candle_features(frame, interval, edges)
    return tokens, moves, features


def ranges_of(prepared: PreparedData, symbol: str) -> dict[str, tuple[int, int]]:
    split = prepared.splits[symbol]
    return {name: (r.start, r.stop) for name, r in (("train", split.train), ("val", split.val), ("test", split.test))}


def wants_features(cfg: Config) -> bool:
    return cfg.model.time_features or cfg.model.volume_input


def prepare_in_memory(cfg: Config, case_dir: Path, parent: Optional[Path] = None,
                      out: Optional[TextIO] = None) -> Prepared:
    """The same corpus prepared in memory for one run (data.shards = false): every asset's
    candles held at once, nothing written to the data cache."""
    prepared = prepare_data(cfg, load_market_data(cfg, case_dir))
    tokenizer = fit_tokenizer(cfg, prepared, parent)
    edges = fit_volume(prepared) if wants_features(cfg) else None
    symbols = [a.symbol for a in prepared.assets]
    tokens, moves, features = {}, {}, {}
    for s in symbols:
        tokens[s], moves[s], features[s] = encode_asset(tokenizer, prepared.candles[s], s, prepared.interval, edges)
    data_info = dict(prepared.info, tokenizer_clip_counts=dict(tokenizer.clip_counts))
    if edges is not None:
        data_info["volume_edges"] = edges
    token_set = TokenSet(symbols, tokens, moves, {s: ranges_of(prepared, s) for s in symbols},
                         features if edges is not None else None)
    return Prepared(token_set, tokenizer, asset_info(prepared.assets), data_info)


# --------------------------------------------------------------------------- the key


def shard_folder(cfg: Config, case_dir: Path, parent: Optional[Path] = None) -> tuple[Path, dict]:
    """(the shard folder this config's tokens belong in, the inputs its key is the hash of)."""
    data = {k: v for k, v in config_to_dict(cfg)["data"].items() if k not in _NOT_KEYED}
    inputs = {
        "versions": {"shard": SHARD_VERSION, "token_folder": FORMAT_VERSION,
                     "tokenizer": TOKENIZER_FORMAT},
        "data": data,
        "purge_gap": cfg.data.purge_gap or cfg.model.context_length,
        "model": {k: getattr(cfg.model, k) for k in ("vocab_size", "context_length", "time_features", "volume_input")},
        "tokenizer": config_to_dict(cfg)["tokenizer"],
        "parent_tokenizer": _sha256(parent) if parent is not None else None,
        "files": [[str(p), *_stamp(p)] for p in input_files(cfg, case_dir)],
    }
    key = hashlib.sha256(json.dumps(inputs, sort_keys=True, default=str).encode()).hexdigest()[:16]
    return Path(case_dir) / cfg.data.cache_dir / "shards" / key, inputs


def _stamp(path: Path) -> tuple[int, int]:
    st = path.stat()
    return st.st_size, st.st_mtime_ns


def _sha256(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


# --------------------------------------------------------------------------- prepare or reuse


def prepare_shards(cfg: Config, case_dir: Path, parent: Optional[Path] = None, out: Optional[TextIO] = None) -> Prepared:
    """The config's shard, prepared now if no earlier run (or another job right now) made it.

    parent: a fine-tuning parent's tokenizer.json, whose token ids the corpus is encoded with."""
    out = out or sys.stdout
    folder, inputs = shard_folder(cfg, case_dir, parent)
    if not (folder / "manifest.json").is_file():
        with _locked(folder.with_name(f"{folder.name}.lock"), out):
            if not (folder / "manifest.json").is_file():  # not made by the job we waited for
                started = time.monotonic()
                try:
                    _build(cfg, case_dir, folder, inputs, parent, out)
                except OSError as e:
                    raise _write_error(folder, e) from None
                print(f"Token shards: prepared {folder} in {time.monotonic() - started:.1f} s", file=out, flush=True)
                return _open(folder)
    shard = _open(folder)
    print(f"Token shards: reusing {folder} ({len(shard.tokens.symbols)} assets, "
          f"{sum(len(t) for t in shard.tokens.tokens.values()):,} candles; no candle read)", file=out, flush=True)
    return shard


def _open(folder: Path) -> Prepared:
    try:
        return Prepared(TokenSet.load(folder / "tokens"), OHLCTokenizer.load(folder / "tokenizer.json"),
                        read_json(folder / "asset_info.json"), read_json(folder / "data_info.json"))
    except (OSError, ValueError) as e:
        raise UserError(f"the token shard {folder} is damaged ({e}); delete that folder and run again to "
                        "prepare it anew") from None


@contextlib.contextmanager
def _locked(lock: Path, out: TextIO) -> Iterator[None]:
    """Hold an exclusive flock on `lock`: the kernel drops it when the holder dies, so a killed
    preparer never blocks the next one."""
    lock.parent.mkdir(parents=True, exist_ok=True)
    with open(lock, "a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(f"Token shards: another job is preparing {lock.with_suffix('')}; waiting for it", file=out, flush=True)
            fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _write_error(folder: Path, e: OSError) -> UserError:
    why = "the disk is full" if e.errno == errno.ENOSPC else (e.strerror or str(e))
    return UserError(f"cannot write the token shard {folder} ({why}): free space there, or set data.cache_dir "
                     "to a larger filesystem, or data.shards = false to prepare in memory; a rerun continues "
                     "where this one stopped")


# --------------------------------------------------------------------------- building


class _Cleaned(Mapping[str, np.ndarray]):
    """Pass 1's output on disk: symbol -> the timestamps (or, via frames(), the candles) of each
    cleaned asset, read from work/clean/<i>.npz when asked for."""

    def __init__(self, files: dict[str, Path]) -> None:
        self.files = files

    def __getitem__(self, symbol: str) -> np.ndarray:
        with np.load(self.files[symbol]) as z:
            return z["ts"]

    def __iter__(self) -> Iterator[str]:
        return iter(self.files)

    def __len__(self) -> int:
        return len(self.files)

    def frame(self, symbol: str) -> pd.DataFrame:
        with np.load(self.files[symbol]) as z:
            ts, values = z["ts"], z["values"]
        index = pd.DatetimeIndex(ts.view("datetime64[ns]"), name="timestamp").tz_localize("UTC")
        return pd.DataFrame({c: values[:, i] for i, c in enumerate(COLUMNS)}, index=index)


def _build(cfg: Config, case_dir: Path, folder: Path, inputs: dict, parent: Optional[Path], out: TextIO) -> None:
    work = folder / "work"
    (work / "clean").mkdir(parents=True, exist_ok=True)
    if not (work / "inputs.json").is_file():
        atomic_write_json(work / "inputs.json", inputs)
    market = load_market_data(cfg, case_dir)
    n = len(market.assets)
    print(f"Token shards: preparing {folder} from {n} assets ({cfg.data.source}, {market.interval}); "
          "a killed preparation continues on the next run", file=out, flush=True)
    cleaned, real_ts, records, dropped = _clean_pass(market, work, out)
    prepared = split_data(cfg, market.assets, market.interval, cleaned, real_ts, records, dropped,
                          LazyFrames(list(cleaned), cleaned.frame))
    del real_ts
    tokenizer, edges = _fit_pass(cfg, prepared, work, parent)
    clip_counts = _encode_pass(prepared, cleaned, tokenizer, edges, work, out)
    data_info = dict(prepared.info, tokenizer_clip_counts=dict(clip_counts))
    if edges is not None:
        data_info["volume_edges"] = edges
    tokens = work / "tokens"
    symbols = [a.symbol for a in prepared.assets]
    write_index(tokens, symbols, [len(cleaned[s]) for s in symbols], {s: ranges_of(prepared, s) for s in symbols},
                edges is not None)
    target = folder / "tokens"
    shutil.rmtree(target, ignore_errors=True)  # an unfinished earlier try's (no manifest)
    tokens.rename(target)
    tokenizer.save(folder / "tokenizer.json")
    atomic_write_json(folder / "asset_info.json", asset_info(prepared.assets))
    atomic_write_json(folder / "data_info.json", data_info)
    atomic_write_json(folder / "manifest.json", {"key": folder.name, "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                                                 "assets": len(symbols), "candles": int(sum(len(cleaned[s]) for s in symbols)),
                                                 "inputs": inputs})
    shutil.rmtree(work, ignore_errors=True)


def _clean_pass(market: Any, work: Path, out: TextIO) -> tuple[_Cleaned, dict, dict, dict]:
    """Pass 1: each asset cleaned once (a rerun after a kill skips the ones already kept)."""
    step = interval_step(market.interval)
    files: dict[str, Path] = {}
    real_ts: dict[str, np.ndarray] = {}
    records: dict[str, dict] = {}
    dropped: dict[str, str] = {}
    for i, asset in enumerate(market.assets):
        file = work / "clean" / f"{i:06d}.npz"
        if not file.is_file():
            s = asset.symbol
            frame, record, why = clean_asset(asset, market.candles[s], step, reader_fixes=market.fixes.get(s),
                                             file=market.files.get(s))
            ts = frame.index.asi8 if frame is not None else np.zeros(0, np.int64)
            values = frame[list(COLUMNS)].to_numpy(np.float64) if frame is not None else np.zeros((0, len(COLUMNS)))
            real = np.isfinite(values[:, 3])  # not the rows fill_gaps added
            meta = json.dumps({"symbol": s, "record": record, "why": why})
            with atomic_path(file) as tmp, open(tmp, "wb") as f:
                np.savez(f, ts=ts, values=values, real=real, meta=np.array(meta))
        with np.load(file) as z:
            meta = json.loads(str(z["meta"]))
            if meta["symbol"] != asset.symbol:
                raise UserError(f"{file} holds {meta['symbol']}, not {asset.symbol}: delete {work} and run again")
            records[asset.symbol] = meta["record"]
            if meta["why"] is not None:
                dropped[asset.symbol] = meta["why"]
                continue
            real_ts[asset.symbol] = z["ts"][z["real"]]
        files[asset.symbol] = file
        if (i + 1) % max(1, len(market.assets) // 10) == 0:
            print(f"Token shards: cleaned {i + 1}/{len(market.assets)} assets", file=out, flush=True)
    return _Cleaned(files), real_ts, records, dropped


def _fit_pass(cfg: Config, prepared: PreparedData, work: Path,
              parent: Optional[Path]) -> tuple[OHLCTokenizer, Optional[list[float]]]:
    """Pass 3: the tokenizer and volume edges from the train ranges (kept in work/ for a rerun)."""
    file, fit = work / "tokenizer.json", work / "fit.json"
    if file.is_file() and fit.is_file():
        return OHLCTokenizer.load(file), read_json(fit)["volume_edges"]
    tokenizer = fit_tokenizer(cfg, prepared, parent)
    edges = fit_volume(prepared) if wants_features(cfg) else None
    tokenizer.save(file)
    atomic_write_json(fit, {"volume_edges": edges})
    return tokenizer, edges


def _encode_pass(prepared: PreparedData, cleaned: _Cleaned, tokenizer: OHLCTokenizer, edges: Optional[list[float]],
                 work: Path, out: TextIO) -> dict:
    """Pass 4: every asset's arrays written at its offset; returns the tokenizer's clip counts."""
    symbols = [a.symbol for a in prepared.assets]
    lengths = np.array([len(cleaned[s]) for s in symbols], dtype=np.int64)
    bounds = np.concatenate([[0], np.cumsum(lengths)])
    total = int(bounds[-1])
    folder = work / "tokens"
    folder.mkdir(exist_ok=True)
    progress_file = work / "encoded.json"
    progress = read_json(progress_file) if progress_file.is_file() else {"done": 0, "clip_counts": None}
    arrays = {"tokens": _array(folder / "tokens.bin", np.int16, (total,)),
              "moves": _array(folder / "moves.bin", np.float64, (total,))}
    if edges is not None:
        arrays["features"] = _array(folder / "features.bin", np.int16, (total, NUM_FEATURES))
    if progress["clip_counts"] is not None:
        tokenizer.clip_counts = progress["clip_counts"]
    for j in range(progress["done"], len(symbols)):
        s = symbols[j]
        toks, moves, features = encode_asset(tokenizer, prepared.candles[s], s, prepared.interval, edges)
        lo, hi = int(bounds[j]), int(bounds[j + 1])
        arrays["tokens"][lo:hi] = toks
        arrays["moves"][lo:hi] = moves
        if features is not None:
            arrays["features"][lo:hi] = features
        for a in arrays.values():
            if isinstance(a, np.memmap):
                a.flush()  # on disk before the progress says so
        atomic_write_json(progress_file, {"done": j + 1, "clip_counts": dict(tokenizer.clip_counts)}, fsync=False)
        if (j + 1) % max(1, len(symbols) // 10) == 0:
            print(f"Token shards: encoded {j + 1}/{len(symbols)} assets", file=out, flush=True)
    del arrays
    return dict(tokenizer.clip_counts)


def _array(file: Path, dtype: type, shape: tuple[int, ...]) -> np.ndarray:
    """A preallocated array on disk: reopened as it is when a killed run left it at full size."""
    size = int(np.prod(shape)) * np.dtype(dtype).itemsize
    if size == 0:
        file.write_bytes(b"")
        return np.zeros(shape, dtype)
    exists = file.is_file() and file.stat().st_size == size
    return np.memmap(file, dtype=dtype, mode="r+" if exists else "w+", shape=shape)
