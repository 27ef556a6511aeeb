"""Candle histories for `marketgpt forecast` and `Forecaster.predict_df`.

load_histories: the run's data source, cut at --as-of. The run's config says where its candles
came from (data.source): the shipped sample, or the case's parquet cache (the case folder is the
run folder's grandparent, case_X/checkpoints/<run>). Each asset's raw candles are cut at as-of
FIRST (rows after it are dropped before anything looks at them), then cleaned and gap-filled as
training did (clean_history), so a forecast never depends on a later candle.

frame_items: a caller's long data frame (item_id, timestamp, OHLC[V]) split into each item's raw
candles, after the checks a frame must pass; predict_df then cleans them with clean_history too.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Callable, Mapping, Optional, Sequence

import numpy as np
import pandas as pd

from common.config import DataConfig
from common.data.cleaning import clean_candles, fill_gaps
from common.data.loading import load_market_data
from common.errors import UserError
from common.markets import interval_step, series_name

__all__ = ["clean_history", "frame_items", "history_loader", "load_histories", "parse_as_of"]

FRAME_PRICES = ("open", "high", "low", "close")  # a long frame's required candle columns; volume optional


def parse_as_of(text: str) -> pd.Timestamp:
    """--as-of as a UTC timestamp (naive means UTC); a bad one is a UserError."""
    try:
        t = pd.Timestamp(text)
    except (TypeError, ValueError):
        t = None
    if t is None or pd.isna(t):
        raise UserError(f"--as-of {text!r} is not a date or time; use e.g. 2024-06-01 or 2024-06-01T00:00")
    t = t.tz_localize("UTC") if t.tzinfo is None else t.tz_convert("UTC")
    if t > pd.Timestamp.now(tz="UTC"):
        raise UserError(f"--as-of {t.isoformat()} is in the future; a forecast starts from candles that exist")
    return t


def load_histories(
    d: DataConfig,
    run_dir: Optional[Path],
    categories: Mapping[str, str],
    symbols: Sequence[str],
    as_of: Optional[str],
    interval: Optional[str] = None,
) -> list[tuple[str, pd.DataFrame]]:
    """(symbol, cleaned candles up to as-of) per symbol (default: all of its candles).
    `categories` maps each symbol to its category (crypto gaps are filled as in training).
    interval: which of a run's data.intervals (default: data.interval), read from that interval's series."""
    load = history_loader(d, run_dir, categories, as_of, interval)
    return [(symbol, load(symbol)) for symbol in symbols]


def history_loader(
    d: DataConfig,
    run_dir: Optional[Path],
    categories: Mapping[str, str],
    as_of: Optional[str],
    interval: Optional[str] = None,
) -> Callable[[str], pd.DataFrame]:
    """load_histories one symbol at a time: symbol -> its cleaned candles up to as-of, read when
    called (a caller walking many assets holds one)."""
    cut = parse_as_of(as_of) if as_of is not None else None
    case_dir = run_dir.resolve().parent.parent if run_dir is not None else None
    if d.source == "download" and case_dir is None:
        raise UserError(
            "this Forecaster has no run folder, so it cannot find the case's candle cache; "
            "pass histories to forecast() instead"
        )
    market = load_market_data(d, case_dir if case_dir is not None else Path("."))
    interval = interval or d.interval
    step = interval_step(interval)

    def load(symbol: str) -> pd.DataFrame:
        raw = market.candles.get(series_name(symbol, interval) if d.intervals else symbol)
        if raw is None or raw.empty:
            raise UserError(
                f"{symbol}: no {interval} candles in the run's data source "
                f"({d.source}); run `marketgpt data download` for its case first"
            )
        if cut is not None:
            index = raw.index.tz_localize("UTC") if raw.index.tz is None else raw.index.tz_convert("UTC")
            if cut < index.min():
                raise UserError(
                    f"{symbol}: --as-of {cut.isoformat()} is before its data starts "
                    f"({index.min().isoformat()}); pick a later --as-of"
                )
            raw = raw[index <= cut]
        frame = clean_history(raw, symbol, categories[symbol], step)
        if cut is not None and len(frame) and cut - frame.index[-1] > 10 * step:
            print(
                f"warning: {symbol}: its last candle ({frame.index[-1].isoformat()}) is "
                f"{cut - frame.index[-1]} before --as-of; the forecast starts there",
                file=sys.stderr,
            )
        return frame

    return load


def clean_history(raw: pd.DataFrame, symbol: str, category: str, step: pd.Timedelta) -> pd.DataFrame:
    """Raw candles as training cleaned them: invalid rows dropped or repaired, and for crypto
    (which trades around the clock) each missing bar an all-NaN row (a MISSING token)."""
    frame, _ = clean_candles(raw, symbol)
    if category == "crypto":
        frame, _ = fill_gaps(frame, step)
    return frame


def frame_items(
    df: pd.DataFrame, id_column: str = "item_id", timestamp_column: str = "timestamp"
) -> list[tuple[Any, pd.DataFrame]]:
    """(item, its raw candles on a UTC DatetimeIndex) per item of a long frame, in order of first
    appearance. Refused in one UserError naming the item: missing columns, no rows, an empty
    item id, a timestamp that is not one, timestamps out of order or repeated within an item."""
    if not isinstance(df, pd.DataFrame):
        raise UserError(f"predict_df: df must be a pandas DataFrame, got {type(df).__name__}")
    levels = [n for n in df.index.names if n in (id_column, timestamp_column) and n not in df.columns]
    if levels:  # e.g. an (item_id, timestamp) index
        df = df.reset_index(level=levels)
    expected = (id_column, timestamp_column, *FRAME_PRICES)
    missing = [c for c in expected if c not in df.columns]
    if missing:
        raise UserError(
            f"predict_df: the frame lacks column(s) {', '.join(missing)}; a long frame has one row per "
            f"item and timestamp with columns {', '.join(expected)}[, volume]"
        )
    if df.empty:
        raise UserError("predict_df: the frame has no rows")
    ids = df[id_column]
    if ids.isna().any():
        raise UserError(f"predict_df: {int(ids.isna().sum())} row(s) have no {id_column}")
    when = pd.to_datetime(df[timestamp_column], utc=True, errors="coerce")
    if when.isna().any():
        row = int(np.flatnonzero(when.isna().to_numpy())[0])
        raise UserError(
            f"predict_df: item {ids.iloc[row]!r}: {timestamp_column} {df[timestamp_column].iloc[row]!r} "
            "is not a date or time"
        )
    columns = [c for c in (*FRAME_PRICES, "volume") if c in df.columns]
    out = []
    codes, uniques = pd.factorize(ids)  # by position: the frame's own index may repeat labels
    for k, item in enumerate(uniques):
        rows = np.flatnonzero(codes == k)
        stamps = pd.DatetimeIndex(when.iloc[rows], name="timestamp")
        diff = stamps.asi8[1:] - stamps.asi8[:-1]
        if (diff < 0).any():
            i = int(np.flatnonzero(diff < 0)[0])
            raise UserError(
                f"predict_df: item {item!r}: timestamps are not in increasing order ({stamps[i + 1]} "
                f"comes after {stamps[i]}); sort the frame by {id_column} and {timestamp_column}"
            )
        if (diff == 0).any():
            i = int(np.flatnonzero(diff == 0)[0])
            raise UserError(
                f"predict_df: item {item!r}: timestamp {stamps[i]} appears more than once; "
                "keep one row per item and timestamp"
            )
        try:
            values = df[columns].iloc[rows].to_numpy(dtype=np.float64)
        except (TypeError, ValueError):
            raise UserError(f"predict_df: item {item!r}: the columns {', '.join(columns)} must hold numbers") from None
        candles = pd.DataFrame(values, index=stamps, columns=columns)
        if "volume" not in candles.columns:  # no readings: clean_candles wants the column (it counts them as 0)
            candles["volume"] = np.nan
        out.append((item, candles))
    return out
