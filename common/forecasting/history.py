"""Candle histories for `marketgpt forecast` and `Forecaster.predict_df`.

load_histories: the run's data source, cut at --as-of. The run's config says where its candles
came from (data.source): the shipped sample, or the case's parquet cache (the case folder is the
run folder's grandparent, case_X/checkpoints/<run>). Each asset's raw candles are cut at as-of
FIRST (rows after it are dropped before anything looks at them), then cleaned and gap-filled as
training did (clean_history), so a forecast never depends on a later candle.

predict_df's long data frames are common.forecasting.frames'.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Callable, Mapping, Optional, Sequence

import pandas as pd

from common.config import DataConfig
from common.data.cleaning import clean_candles, fill_gaps
from common.data.loading import load_market_data
from common.errors import UserError
from common.markets import interval_step, series_name

__all__ = ["clean_history", "history_loader", "load_histories", "parse_as_of"]


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
