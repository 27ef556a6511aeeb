"""The candle cache: one parquet file per source, interval and symbol, plus a JSON manifest.

    <root>/yfinance/1d/AAPL.parquet
    <root>/ccxt/1h/BTC%2FUSDT.parquet
    <root>/manifest.json        {"ccxt/1h/BTC%2FUSDT.parquet": {"first": ..., "last": ..., ...}}

Files hold canonical candle frames (UTC "timestamp" index, sorted, unique; float64 open, high,
low, close, volume), zstd-compressed. Every write goes through a temp file and a rename
(common.atomic), so a download killed halfway leaves each file either as it was or complete, and
a rerun resumes from what is there. The parquet files are the truth; the manifest is a summary
for people and `jq` (first/last timestamp, rows, fetch time, adjusted prices or not, origin: the
exchange the candles came from), written atomically right after each file, under an advisory
lock (fcntl.flock). Each file also carries its own entry in its parquet metadata, so the record
is never lost with the manifest: a missing manifest is rebuilt from the files (`manifest()`), and
an unreadable one is an error naming it, never read as empty (an empty record would let the next
download append one exchange's candles to another's). Lustre and NFS mounts without lock
support raise OSError on flock: the cache then warns once and goes on unlocked, which is safe as
long as one download at a time writes into a cache (the data files are atomic either way).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from datetime import datetime, timezone
from pathlib import Path
from types import ModuleType
from typing import Iterator, Optional
from urllib.parse import quote

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from common.atomic import atomic_path, atomic_write_json
from common.errors import UserError

fcntl: Optional[ModuleType]
try:  # a lock file keeps two downloads into one cache from losing each other's manifest entries
    import fcntl
except ImportError:  # Windows: no advisory locks; single-process use is still safe
    fcntl = None

__all__ = ["COLUMNS", "CandleCache", "canonical_frame", "merge_candles"]

COLUMNS = ["open", "high", "low", "close", "volume"]
MANIFEST = "manifest.json"
RECORD_KEY = b"marketgpt.cache"  # the file's manifest entry, JSON, in its parquet metadata

log = logging.getLogger(__name__)
_unlocked_warned: set[str] = set()  # cache roots already warned about, so the warning comes once


def canonical_frame(frame: pd.DataFrame) -> pd.DataFrame:
    """The canonical form of a candle frame: UTC index named "timestamp", sorted, unique
    (the last row of a duplicated timestamp wins), float64 columns in COLUMNS order.

    The index is always nanoseconds (pandas 3 builds s/ms/us indexes depending on the input),
    so frames from any source compare, merge and `asi8` the same way."""
    missing = [c for c in COLUMNS if c not in frame.columns]
    if missing:
        raise ValueError(f"candle frame lacks columns {missing}; has {list(frame.columns)}")
    if not isinstance(frame.index, pd.DatetimeIndex) or frame.index.tz is None:
        raise ValueError("candle frame needs a tz-aware DatetimeIndex (UTC)")
    out = frame[COLUMNS].astype("float64")
    out.columns = pd.Index(COLUMNS)  # drop a columns name such as yfinance's "Price"
    out.index = frame.index.tz_convert("UTC").as_unit("ns").rename("timestamp")
    out = out[~out.index.duplicated(keep="last")]
    return out.sort_index()


def merge_candles(old: pd.DataFrame | None, new: pd.DataFrame) -> pd.DataFrame:
    """Old candles extended by new ones; where both have a timestamp the new candle wins
    (the old one may have been a still-forming bar)."""
    if old is None or old.empty:
        return canonical_frame(new)
    return canonical_frame(pd.concat([canonical_frame(old), canonical_frame(new)]))


def _safe_name(symbol: str) -> str:
    # Percent-encoding keeps names readable for plain tickers (AAPL, SAP.DE, BRK-B) and stays
    # one-to-one for the rest ("BTC/USDT" -> "BTC%2FUSDT", "^GSPC" -> "%5EGSPC"), so two symbols
    # can never share a file.
    if not symbol or not symbol.strip():
        raise ValueError("empty symbol")
    name = quote(symbol, safe="-_.")
    return "%2E" + name[1:] if name.startswith(".") else name  # no hidden files, no "..".


def _iso(ts: pd.Timestamp | None) -> str | None:
    return None if ts is None else ts.isoformat()


class CandleCache:
    """Parquet candle files under `root`, one per (source, interval, symbol)."""

    def __init__(self, root: str | os.PathLike) -> None:
        self.root = Path(root)

    def path_for(self, source: str, interval: str, symbol: str) -> Path:
        return self.root / _safe_name(source) / _safe_name(interval) / f"{_safe_name(symbol)}.parquet"

    def read(self, source: str, interval: str, symbol: str) -> pd.DataFrame | None:
        """The cached candles, or None if there is no file yet."""
        path = self.path_for(source, interval, symbol)
        if not path.exists():
            return None
        try:
            frame = pq.read_table(path).to_pandas()
            frame = canonical_frame(frame)
        except (pa.ArrowException, OSError, ValueError, KeyError) as e:
            raise UserError(
                f"{path}: cache file is corrupt or unreadable ({type(e).__name__}: {e}); "
                f"delete it and run `marketgpt data download` again to re-fetch {symbol}"
            ) from None
        return frame

    def read_times(self, source: str, interval: str, symbol: str) -> pd.DatetimeIndex | None:
        """The cached candles' timestamps alone (one column of the file), or None if there is no file yet."""
        path = self.path_for(source, interval, symbol)
        if not path.exists():
            return None
        try:
            column = pq.read_table(path, columns=["timestamp"]).column("timestamp").to_pandas()
            return pd.DatetimeIndex(column).tz_convert("UTC").as_unit("ns").rename("timestamp")
        except (pa.ArrowException, OSError, ValueError, KeyError, TypeError) as e:
            raise UserError(
                f"{path}: cache file is corrupt or unreadable ({type(e).__name__}: {e}); "
                f"delete it and run `marketgpt data download` again to re-fetch {symbol}"
            ) from None

    def write(
        self,
        source: str,
        interval: str,
        symbol: str,
        frame: pd.DataFrame,
        adjusted: bool,
        *,
        origin: str | None = None,
        fetched_at: datetime | None = None,
    ) -> None:
        """Replace the file with `frame` (atomically), then update its manifest entry.

        `origin` names where the candles came from within the source (e.g. the ccxt exchange),
        so a later download can tell that the config now points somewhere else.
        """
        frame = canonical_frame(frame)
        path = self.path_for(source, interval, symbol)
        fetched_at = fetched_at or datetime.now(timezone.utc)
        entry = {
            "source": source,
            "interval": interval,
            "symbol": symbol,
            "rows": int(len(frame)),
            "first": _iso(frame.index[0]) if len(frame) else None,
            "last": _iso(frame.index[-1]) if len(frame) else None,
            "fetched_at": fetched_at.isoformat(timespec="seconds"),
            "adjusted": bool(adjusted),
            "origin": origin,
        }
        table = pa.Table.from_pandas(frame, preserve_index=True)
        table = table.replace_schema_metadata({**(table.schema.metadata or {}), RECORD_KEY: json.dumps(entry)})
        with atomic_path(path) as tmp:
            pq.write_table(table, tmp, compression="zstd")
        self._update_manifest(path.relative_to(self.root).as_posix(), entry)

    def append(
        self,
        source: str,
        interval: str,
        symbol: str,
        frame: pd.DataFrame,
        adjusted: bool,
        *,
        origin: str | None = None,
        fetched_at: datetime | None = None,
    ) -> int:
        """Merge new candles into the cached ones (incremental update); returns rows added."""
        old = self.read(source, interval, symbol)
        merged = merge_candles(old, frame)
        self.write(source, interval, symbol, merged, adjusted, origin=origin, fetched_at=fetched_at)
        return len(merged) - (0 if old is None else len(old))

    def manifest(self) -> dict:
        """Per file (path relative to root): source, interval, symbol, rows, first, last (ISO),
        fetched_at, adjusted, origin. Empty if nothing was written yet; rebuilt from the files'
        own records when it is missing; a UserError naming it when it cannot be read."""
        if not (self.root / MANIFEST).exists() and self._files():
            return self.rebuild_manifest()
        return self._read_manifest()

    def _read_manifest(self) -> dict:
        path = self.root / MANIFEST
        if not path.exists():
            return {}
        fix = (
            "it records which exchange each series came from; delete it and the next `marketgpt data download` "
            "rebuilds it from the cache files' own records"
        )
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            raise UserError(f"{path}: cannot read the cache manifest ({e}); {fix}") from None
        if not isinstance(data, dict):
            raise UserError(f"{path}: the cache manifest is not a JSON object; {fix}")
        return data

    def manifest_entry(self, source: str, interval: str, symbol: str) -> dict | None:
        rel = self.path_for(source, interval, symbol).relative_to(self.root).as_posix()
        return self.manifest().get(rel)

    def file_record(self, path: Path) -> dict | None:
        """The manifest entry a cache file carries in its parquet metadata (None: a file written
        before the files carried one, or unreadable)."""
        try:
            raw = (pq.read_schema(path).metadata or {}).get(RECORD_KEY)
            entry = json.loads(raw) if raw else None
        except (pa.ArrowException, OSError, ValueError):
            return None
        return entry if isinstance(entry, dict) else None

    def rebuild_manifest(self) -> dict:
        """The manifest from the files' own records, written (atomically) and returned. A file
        without one (written by an older version) gets no entry: where its candles came from is
        unknown, and a download fetches its whole history again rather than guess."""
        with self._locked():
            manifest = self._records()
            atomic_write_json(self.root / MANIFEST, dict(sorted(manifest.items())))
        return manifest

    def _records(self) -> dict:
        records = {p.relative_to(self.root).as_posix(): self.file_record(p) for p in self._files()}
        return {key: entry for key, entry in records.items() if entry is not None}

    def _files(self) -> list[Path]:
        return sorted(self.root.glob("*/*/*.parquet")) if self.root.is_dir() else []

    def _update_manifest(self, key: str, entry: dict) -> None:
        with self._locked():
            # an unreadable manifest stops here (it is never replaced by this entry alone); a missing
            # one is rebuilt from the files' records, this file's among them
            manifest = self._read_manifest() if (self.root / MANIFEST).exists() else self._records()
            manifest[key] = entry
            atomic_write_json(self.root / MANIFEST, dict(sorted(manifest.items())))

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        self.root.mkdir(parents=True, exist_ok=True)
        if fcntl is None:
            yield
            return
        with open(self.root / ".manifest.lock", "a") as f:
            try:
                fcntl.flock(f, fcntl.LOCK_EX)
            except OSError as e:  # Lustre/NFS without lock support: ENOLCK, EOPNOTSUPP, ENOSYS
                key = str(self.root)
                if key not in _unlocked_warned:
                    _unlocked_warned.add(key)
                    log.warning(
                        "%s: this filesystem does not support file locks (%s); going on "
                        "without the manifest lock: run one download into this cache at a time",
                        self.root,
                        e.strerror or e,
                    )
                yield
                return
            try:
                yield
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)
