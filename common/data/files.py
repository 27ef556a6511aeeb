"""Your own candles: data.source = "files" reads CSV or parquet files from data.files_dir.

    data.files_dir = "my_data"            # a folder: one file per symbol (BTC-USD.csv, SPY.parquet)
    data.files_dir = "my_data/all.csv"    # or one long file with a `symbol` column

Columns are found case-insensitively: timestamp (or date, datetime, time), open, high, low,
close, volume. Naive timestamps are taken as UTC (said once); tz-aware ones are converted.
Integer timestamps are Unix epochs (seconds, or milliseconds when they are that large).

A file that can't be used (missing columns, no rows, no timestamp parses, spacing far from
data.interval) is a UserError naming the file. Rows that can be dropped are dropped and
counted per asset (`unparsable_timestamp`, `off_interval`); the usual cleaning
(common.data.prepare: duplicates, non-positive prices, ...) then runs as for downloaded candles,
and every count lands in data_info.json.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Mapping

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from common.config import DataConfig
from common.data.cleaning import COLUMNS
from common.data.market_data import LazyFrames, MarketData
from common.data.universe import Asset, load_universe
from common.errors import UserError
from common.markets import interval_step

__all__ = ["FILES_UNIVERSE", "SUFFIXES", "files_root", "load_files", "read_candle_file"]

FILES_UNIVERSE = "files"  # data.universe value: every file is an asset, in data.default_category
SUFFIXES = (".csv", ".csv.gz", ".parquet")
_TIME_ALIASES = ("timestamp", "date", "datetime", "time")


def _symbol_of(path: Path) -> str:
    name = path.name
    for suffix in SUFFIXES:
        if name.lower().endswith(suffix):
            return name[: -len(suffix)]
    return path.stem


def _read_table(path: Path, only: tuple[str, ...] = ()) -> pd.DataFrame:
    """The file's rows; only: just the columns of these names (matched case-insensitively), when it has any."""
    try:
        parquet = path.name.lower().endswith(".parquet")
        columns = None
        if only:  # the header alone first: a parquet schema, a CSV's first line
            names = pq.read_schema(path).names if parquet else list(pd.read_csv(path, nrows=0).columns)
            columns = [n for n in names if str(n).strip().lower() in only] or None
        if parquet:
            raw = pd.read_parquet(path, columns=columns)
            if isinstance(raw.index, pd.DatetimeIndex) and raw.index.name:  # saved with its index
                raw = raw.reset_index()
            return raw
        return pd.read_csv(path, usecols=columns)
    except pd.errors.EmptyDataError:
        return pd.DataFrame()
    except (OSError, ValueError, pd.errors.ParserError, pa.ArrowException) as e:
        raise UserError(
            f"{path}: cannot read the file ({str(e).splitlines()[0] if str(e) else type(e).__name__}); "
            "expected a CSV with a header row or a parquet file"
        ) from None


def _columns(raw: pd.DataFrame, path: Path, extra: tuple[str, ...] = (), prices: bool = True) -> dict[str, str]:
    """Canonical name -> the file's column name, matched case-insensitively, aliases for the time;
    prices: the OHLCV columns are needed too."""
    by_lower = {str(c).strip().lower(): c for c in raw.columns}
    found: dict[str, str] = {}
    time = next((by_lower[a] for a in _TIME_ALIASES if a in by_lower), None)
    if time is not None:
        found["timestamp"] = time
    for name in (*COLUMNS, *extra):
        if name in by_lower:
            found[name] = by_lower[name]
    missing = [n for n in ("timestamp", *(COLUMNS if prices else ()), *extra) if n not in found]
    if missing:
        have = ", ".join(map(str, raw.columns)) or "none"
        raise UserError(
            f"{path}: missing column(s) {', '.join(missing)} (found: {have}); a candle file needs "
            f"timestamp (or date/datetime/time), {', '.join(COLUMNS)}" + (f", {', '.join(extra)}" if extra else "")
        )
    return found


def _parse_times(column: pd.Series, path: Path) -> tuple[np.ndarray, bool]:
    """UTC nanoseconds (NaT as int64 min) and whether the stamps were naive."""
    if pd.api.types.is_numeric_dtype(column) and not pd.api.types.is_bool_dtype(column):
        values = pd.to_numeric(column, errors="coerce")
        unit = "ms" if values.abs().max() > 1e11 else "s"  # 1e11 s is the year 5138: must be ms
        return _ns(pd.to_datetime(values, unit=unit, utc=True, errors="coerce")), False
    if isinstance(column.dtype, pd.DatetimeTZDtype):
        return _ns(column.dt.tz_convert("UTC")), False
    if pd.api.types.is_datetime64_dtype(column):
        return _ns(column.dt.tz_localize("UTC")), True
    text = column.astype("string").str.strip()
    # Offsets in the text (+00:00, Z) make the stamps tz-aware; parse each row so mixed offsets work.
    aware = bool(text.str.contains(r"(?:[+-]\d{2}:?\d{2}|Z)$", regex=True, na=False).any())
    try:
        parsed = pd.to_datetime(text, utc=True, errors="coerce", format="mixed")
    except (ValueError, TypeError) as e:
        raise UserError(f"{path}: cannot parse the timestamps ({e})") from None
    return _ns(parsed), not aware


def _ns(stamps: pd.Series) -> np.ndarray:
    # pandas picks a unit per parse (s, ms, us, ns); the rest of the code counts in ns
    return pd.DatetimeIndex(stamps).as_unit("ns").asi8


def _off_interval(ts: np.ndarray, step_ns: int) -> np.ndarray:
    """Rows closer than one step to the last kept row (ts sorted, unique): the finer-grained rows."""
    drop = np.zeros(len(ts), dtype=bool)
    if len(ts) < 2 or (np.diff(ts) >= step_ns).all():
        return drop
    last = ts[0]
    for i in range(1, len(ts)):
        if ts[i] - last < step_ns:
            drop[i] = True
        else:
            last = ts[i]
    return drop


def _check_spacing(ts: np.ndarray, step: pd.Timedelta, interval: str, path: Path) -> None:
    """The most common spacing must be the configured interval; else say how far off it is."""
    diffs = np.diff(np.unique(ts))
    if len(diffs) == 0:
        return
    values, counts = np.unique(diffs, return_counts=True)
    modal = int(values[np.argmax(counts)])
    if modal == step.value:
        return
    ratio = modal / step.value
    how = f"{ratio:g}x as long as" if ratio >= 1 else f"1/{1 / ratio:g} of"
    raise UserError(
        f"{path}: candles are mostly {_duration(modal)} apart, {how} the configured data.interval = "
        f"{interval!r}; set data.interval to match the file, or resample it"
    )


def _duration(ns: int) -> str:
    seconds = ns / 1e9
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:g}{unit}"
    return f"{seconds:g}s"


def read_candle_file(
    path: Path, interval: str, symbol_column: bool = False, times_only: bool = False
) -> tuple[dict[str, pd.DataFrame], dict[str, dict[str, int]], bool]:
    """One file's candles: {symbol: frame} (UTC index, float OHLCV), per-symbol drop counts, naive?

    Without `symbol_column` the file is one symbol, named by the file. times_only: read the
    time (and symbol) column alone and give every candle the placeholder prices 1.0, for
    counting candles: the rows kept are those of a full read, as no row is dropped for its prices.
    """
    extra = ("symbol",) if symbol_column else ()
    raw = _read_table(path, (*_TIME_ALIASES, *extra) if times_only else ())
    if raw.empty:
        raise UserError(f"{path}: the file is empty (no candle rows); remove it or fill it")
    cols = _columns(raw, path, extra, prices=not times_only)
    ts, naive = _parse_times(raw[cols["timestamp"]], path)
    bad_time = ts == np.iinfo(np.int64).min
    if bad_time.all():
        example = raw[cols["timestamp"]].iloc[0]
        raise UserError(
            f"{path}: no timestamp in column '{cols['timestamp']}' parses (first: {example!r}); "
            "expected dates like 2024-01-31 or 2024-01-31 13:00:00+00:00, or Unix epochs"
        )
    values = np.ones((len(raw), len(COLUMNS)))
    for i, name in enumerate(COLUMNS if not times_only else ()):
        values[:, i] = pd.to_numeric(raw[cols[name]], errors="coerce").to_numpy(dtype=np.float64, na_value=np.nan)
    symbols = (
        raw[cols["symbol"]].astype("string").str.strip().to_numpy(dtype=object, na_value="")
        if symbol_column
        else np.full(len(raw), _symbol_of(path), dtype=object)
    )
    step = interval_step(interval)

    frames: dict[str, pd.DataFrame] = {}
    fixes: dict[str, dict[str, int]] = {}
    for symbol in dict.fromkeys(symbols):
        if symbol == "":
            raise UserError(
                f"{path}: {int((symbols == '').sum())} row(s) have an empty symbol; fill the symbol column on every row"
            )
        rows = symbols == symbol
        good = rows & ~bad_time
        where = f"{path} ({symbol})" if symbol_column else str(path)
        if not good.any():
            raise UserError(f"{where}: no timestamp parses; expected dates like 2024-01-31 or Unix epochs")
        s_ts, s_values = ts[good], values[good]
        order = np.argsort(s_ts, kind="stable")
        s_ts, s_values = s_ts[order], s_values[order]
        _check_spacing(s_ts, step, interval, Path(where))
        off = _off_interval_rows(s_ts, int(step.value))
        keep = ~off
        index = pd.DatetimeIndex(s_ts[keep].view("datetime64[ns]"), name="timestamp").tz_localize("UTC")
        frames[symbol] = pd.DataFrame(s_values[keep], index=index, columns=list(COLUMNS))
        # rows dropped because the timestamp does not parse, or is closer than one data.interval to
        # the row before (mixed intervals): counted per asset in data_info.json
        fixes[symbol] = {"unparsable_timestamp": int((rows & bad_time).sum()), "off_interval": int(off.sum())}
    return frames, fixes, naive


def _off_interval_rows(s_ts: np.ndarray, step_ns: int) -> np.ndarray:
    """Mask of the sorted stamps to drop as off the interval, judged on unique stamps: duplicates
    stay for clean_candles to count, except those of a dropped stamp, which go with it."""
    unique_last = np.ones(len(s_ts), dtype=bool)
    unique_last[:-1] = s_ts[:-1] != s_ts[1:]
    off = np.zeros(len(s_ts), dtype=bool)
    off[unique_last] = _off_interval(s_ts[unique_last], step_ns)
    off |= np.isin(s_ts, s_ts[off]) & ~unique_last  # the duplicates of a dropped stamp go with it
    return off


def _files_in(folder: Path) -> dict[str, Path]:
    found: dict[str, Path] = {}
    for path in sorted(folder.iterdir()):
        if path.is_file() and path.name.lower().endswith(SUFFIXES) and not path.name.startswith("."):
            symbol = _symbol_of(path)
            if symbol in found:
                raise UserError(
                    f"{folder}: two files for symbol {symbol} ({found[symbol].name}, {path.name}); keep one"
                )
            found[symbol] = path
    if not found:
        raise UserError(
            f"{folder}: no candle files (*.csv, *.csv.gz, *.parquet); put one file per symbol "
            "there, or point data.files_dir at one long file with a symbol column"
        )
    return found


def _file_key(symbol: str) -> str:
    # File names can't hold "/": BTC/USDT in a universe matches BTC-USDT or BTC_USDT files.
    return symbol.upper().replace("/", "-").replace("_", "-")


def load_files(d: DataConfig, case_dir: Path, times_only: bool = False) -> MarketData:
    """The assets and candles of data.files_dir (relative to the case folder, or absolute).

    A folder of files is read one file at a time, when its asset is asked for (preparation
    holds one asset's candles, and an array task reads only its own assets); one long file
    with a symbol column is read whole, once. times_only: see read_candle_file."""
    if not d.files_dir:
        raise UserError(
            "data.source = 'files' needs data.files_dir: a folder with one CSV or parquet file "
            "per symbol, or one file with a symbol column (e.g. --set data.files_dir=my_data)"
        )
    root = files_root(d, case_dir)
    if not root.exists():
        raise UserError(f"data.files_dir {root} does not exist; point it at a folder of candle files or one file")

    if root.is_dir():
        paths = _files_in(root)
        reader = _FolderReader(paths, d.interval, times_only)
        symbols = list(paths)
        candles: Mapping[str, pd.DataFrame] = LazyFrames(symbols, reader.frame)
        fixes: Mapping[str, dict[str, int]] = LazyFrames(symbols, reader.fixes)
        sources = {s: str(p) for s, p in paths.items()}
    else:
        candles, fixes, naive = read_candle_file(root, d.interval, symbol_column=True, times_only=times_only)
        symbols = list(candles)
        sources = dict.fromkeys(symbols, str(root))
        if naive:
            _note_naive(root.name)

    if d.universe == FILES_UNIVERSE:
        assets = [Asset(symbol=s, source="files", category=d.default_category or "", name=s) for s in symbols]
    else:
        assets = _match_universe(load_universe(Path(case_dir) / d.universe, d.universe_counts or None), symbols, root)
    by_key = {_file_key(s): s for s in symbols}
    name_of = {a.symbol: by_key[_file_key(a.symbol)] for a in assets}  # universe symbol -> file symbol
    return MarketData(
        assets=assets,
        candles=LazyFrames(list(name_of), lambda s: candles[name_of[s]]),
        interval=d.interval,
        fixes=LazyFrames(list(name_of), lambda s: fixes[name_of[s]]),
        files={s: sources[f] for s, f in name_of.items()},
    )


def files_root(d: DataConfig, case_dir: Path) -> Path:
    """data.files_dir: absolute, or relative to the case folder."""
    assert d.files_dir is not None  # the config checks it with data.source = "files"
    root = Path(d.files_dir).expanduser()
    return root if root.is_absolute() else Path(case_dir) / root


class _FolderReader:
    """One file per symbol, read when asked for; the last one read is kept, so an asset's
    candles and its reader's drop counts come from one read."""

    def __init__(self, paths: dict[str, Path], interval: str, times_only: bool = False) -> None:
        self.paths, self.interval, self.times_only = paths, interval, times_only
        self._last: tuple[str, pd.DataFrame, dict[str, int]] | None = None
        self._noted = False  # the note on naive time stamps: once, not once per file of a large folder

    def _read(self, symbol: str) -> tuple[str, pd.DataFrame, dict[str, int]]:
        if self._last is None or self._last[0] != symbol:
            frames, fixes, naive = read_candle_file(self.paths[symbol], self.interval, times_only=self.times_only)
            if naive and not self._noted:
                self._noted = True
                _note_naive(self.paths[symbol].name, others=True)
            (frame,), (fix,) = frames.values(), fixes.values()  # the file's one symbol
            self._last = (symbol, frame, fix)
        return self._last

    def frame(self, symbol: str) -> pd.DataFrame:
        return self._read(symbol)[1]

    def fixes(self, symbol: str) -> dict[str, int]:
        return self._read(symbol)[2]


def _note_naive(name: str, others: bool = False) -> None:
    where = f"{name} (and any other file without one)" if others else name
    print(f"note: timestamps without a time zone in {where} are taken as UTC", file=sys.stderr)


def _match_universe(assets: list[Asset], symbols: list[str], root: Path) -> list[Asset]:
    """Every universe symbol needs candles; files the universe does not list are ignored (said)."""
    keys = {_file_key(s) for s in symbols}
    missing = [a.symbol for a in assets if _file_key(a.symbol) not in keys]
    if missing:
        shown = ", ".join(missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
        have = ", ".join(sorted(symbols)[:5]) + (" ..." if len(symbols) > 5 else "")
        raise UserError(
            f"{root}: no candles for {len(missing)} universe symbol(s): {shown} (files have: {have}); "
            f'add them, remove them from the universe, or set data.universe = "{FILES_UNIVERSE}" '
            "to train on every file"
        )
    listed = {_file_key(a.symbol) for a in assets}
    unused = [s for s in symbols if _file_key(s) not in listed]
    if unused:
        print(
            f"note: {len(unused)} symbol(s) in {root} are not in the universe and are left out: "
            f"{', '.join(unused[:5])}{' ...' if len(unused) > 5 else ''}",
            file=sys.stderr,
        )
    return assets
