"""Cleaning one asset's candles: the repairs every source needs, counted by kind (FIX_KINDS),
and the holes of 24/7 markets filled with NaN rows on a regular grid (fill_gaps). Splitting the
cleaned assets by time is common.data.prepare."""

from __future__ import annotations

import sys
from typing import Any, Optional

import numpy as np
import pandas as pd

from common.data.universe import Asset
from common.errors import UserError

__all__ = ["COLUMNS", "FIX_KINDS", "SUBUNIT_SUFFIXES", "clean_asset", "clean_candles", "fill_gaps", "real_rows"]

COLUMNS = ("open", "high", "low", "close", "volume")
FIX_KINDS = (
    "out_of_order",  # rows earlier than the row before them (the frame is re-sorted)
    "duplicates",  # rows dropped because a later row has the same timestamp
    "nan_price",  # rows dropped: open, high, low or close is NaN or infinite
    "nonpositive_price",  # rows dropped: a price <= 0
    "high_repaired",  # high below max(open, close): set to max(open, high, close)
    "low_repaired",  # low above min(open, close): set to min(open, low, close)
    "volume_clipped",  # negative or missing volume set to 0
    "subunit_repaired",  # rows with prices 100x off (pence vs pounds, cents vs rand) scaled back
)
# Yahoo tickers quoted in a sub-unit (GBp, ZAc, ILA) on which Yahoo now and then reports a bar in
# the main unit (or the other way round): 100x one-day jumps that revert. London, Johannesburg, Tel Aviv.
SUBUNIT_SUFFIXES = (".L", ".IL", ".JO", ".TA")
_SUBUNIT_WINDOW = 11  # bars around each bar whose median close is the reference (a glitch run < 6 bars)


def _utc_ns(index: pd.Index, symbol: str) -> np.ndarray:
    if not isinstance(index, pd.DatetimeIndex):
        raise UserError(f"{symbol}: candles need a DatetimeIndex of timestamps, got {type(index).__name__}")
    index = index.tz_localize("UTC") if index.tz is None else index.tz_convert("UTC")
    return index.as_unit("ns").asi8


def _frame(ts: np.ndarray, values: np.ndarray) -> pd.DataFrame:
    index = pd.DatetimeIndex(ts.view("datetime64[ns]"), name="timestamp").tz_localize("UTC")
    return pd.DataFrame({c: values[:, i] for i, c in enumerate(COLUMNS)}, index=index)


def clean_candles(frame: pd.DataFrame, symbol: str, *, subunits: bool = False) -> tuple[pd.DataFrame, dict[str, int]]:
    """Sort, dedupe, drop or repair invalid candles; returns the canonical frame and fix counts.

    Only the canonical columns are kept; a naive index is taken as UTC. `subunits`: the prices
    are quoted in a sub-unit (pence): a price 80-125x below or above the median close of the
    bars around it is scaled back by 100 (Yahoo's pence/pound glitch; no market moves 100x for a
    day and back).
    """
    missing = [c for c in COLUMNS if c not in frame.columns]
    if missing:
        raise UserError(f"{symbol}: candle frame lacks column(s) {', '.join(missing)}; expected {', '.join(COLUMNS)}")
    ts = _utc_ns(frame.index, symbol)
    values = frame[list(COLUMNS)].to_numpy(dtype=np.float64, copy=True)
    fixes = dict.fromkeys(FIX_KINDS, 0)

    behind = ts[1:] < ts[:-1]
    if behind.any():
        fixes["out_of_order"] = int(behind.sum())
        order = np.argsort(ts, kind="stable")  # stable: among equal timestamps, file order stays
        ts, values = ts[order], values[order]

    # Keep the last row of each timestamp: a later row is a later (corrected) fetch.
    dup = np.zeros(len(ts), dtype=bool)
    dup[:-1] = ts[:-1] == ts[1:]
    prices = values[:, :4]
    nan_price = ~np.isfinite(prices).all(axis=1) & ~dup
    nonpositive = (prices <= 0).any(axis=1) & ~dup & ~nan_price
    fixes["duplicates"] = int(dup.sum())
    fixes["nan_price"] = int(nan_price.sum())
    fixes["nonpositive_price"] = int(nonpositive.sum())
    keep = ~(dup | nan_price | nonpositive)
    if not keep.all():
        ts, values = ts[keep], values[keep]

    if subunits and len(ts) >= 3:
        fixes["subunit_repaired"] = _repair_subunits(values)
    o, h, low, c, v = (values[:, i] for i in range(5))  # views: writes below fix `values`
    top, bottom = np.maximum(o, c), np.minimum(o, c)
    bad_high, bad_low = h < top, low > bottom
    fixes["high_repaired"] = int(bad_high.sum())
    fixes["low_repaired"] = int(bad_low.sum())
    h[bad_high] = top[bad_high]
    low[bad_low] = bottom[bad_low]
    bad_volume = ~(v >= 0)  # NaN compares False, so this catches it too
    fixes["volume_clipped"] = int(bad_volume.sum())
    v[bad_volume] = 0.0
    return _frame(ts, values), fixes


def _repair_subunits(values: np.ndarray) -> int:
    """Scale prices 100x off the local median close back in place; returns the rows changed."""
    reference = pd.Series(values[:, 3]).rolling(_SUBUNIT_WINDOW, center=True, min_periods=3).median().to_numpy()
    ratio = values[:, :4] / reference[:, None]
    low = (ratio > 1 / 125) & (ratio < 1 / 80)  # in pounds among pence
    high = (ratio > 80) & (ratio < 125)  # in pence among pounds
    values[:, :4][low] *= 100.0
    values[:, :4][high] /= 100.0
    return int((low | high).any(axis=1).sum())


def _subunits(asset: Asset) -> bool:
    return asset.source == "yfinance" and asset.symbol.upper().endswith(SUBUNIT_SUFFIXES)


def fill_gaps(frame: pd.DataFrame, step: pd.Timedelta) -> tuple[pd.DataFrame, int]:
    """Insert an all-NaN row for every bar missing inside a regular series (24/7 markets).

    Only holes that are a whole number of bars long are filled; timestamps off the grid are
    left alone rather than guessed at.
    """
    ts = frame.index.as_unit("ns").asi8
    step_ns = int(step.value)
    diff = np.diff(ts)
    gaps = np.zeros(len(ts), dtype=np.int64)  # bars missing after each row
    gaps[:-1] = np.where((diff > step_ns) & (diff % step_ns == 0), diff // step_ns - 1, 0)
    filled = int(gaps.sum())
    if filled == 0:
        return frame, 0
    run = gaps + 1  # each row followed by its missing bars
    starts = np.cumsum(run) - run  # position of each original row in the new arrays
    offset = np.arange(len(ts) + filled) - np.repeat(starts, run)
    new_ts = np.repeat(ts, run) + offset * step_ns
    values = np.full((len(new_ts), len(COLUMNS)), np.nan)
    values[starts] = frame[list(COLUMNS)].to_numpy(dtype=np.float64)
    return _frame(new_ts, values), filled


def _report_fixes(path: str, fixes: dict[str, int]) -> None:
    # The user's own files: say what was dropped or repaired, not only in data_info.json.
    done = [f"{n} {kind.replace('_', ' ')}" for kind, n in fixes.items() if n]
    if done:
        print(f"cleaned {path}: {', '.join(done)} (rows; see data_info.json)", file=sys.stderr)


def _fills_gaps(asset: Asset) -> bool:
    # Crypto trades around the clock, so a missing bar is a real hole (a MISSING token).
    # Stock and futures markets close at night, weekends and holidays: absent bars are normal.
    return asset.category == "crypto"


def real_rows(frame: pd.DataFrame) -> np.ndarray:
    """(n,) bool: the cleaned frame's real candles, not the all-NaN rows fill_gaps adds (the split
    cuts count real candles only)."""
    return np.isfinite(frame["close"].to_numpy())


def clean_asset(
    asset: Asset,
    raw: pd.DataFrame,
    step: pd.Timedelta,
    *,
    reader_fixes: Optional[dict[str, int]] = None,
    file: Optional[str] = None,
) -> tuple[Optional[pd.DataFrame], dict[str, Any], Optional[str]]:
    """One asset's (cleaned frame or None, record for data_info.json, why it was dropped or None).

    reader_fixes, file: data.source = "files": the rows the file reader dropped, and the file."""
    reader_fixes = reader_fixes or {}
    frame, fixes = clean_candles(raw, asset.symbol, subunits=_subunits(asset))
    record: dict[str, Any] = {
        "category": asset.category,
        "raw_rows": len(raw),
        "rows": len(frame),
        "fixes": {**fixes, **reader_fixes},
        "gaps_filled": 0,
    }
    if file is not None:  # the rows the reader dropped count too
        record["file"] = file
        record["raw_rows"] += sum(reader_fixes.values())
        _report_fixes(record["file"], record["fixes"])
    if frame.empty:
        return (
            None,
            record,
            (
                f"no valid candles after cleaning ({len(raw)} raw rows)"
                if len(raw)
                else "no candles (not in the cache, or none in the configured date range)"
            ),
        )
    if _fills_gaps(asset):
        frame, record["gaps_filled"] = fill_gaps(frame, step)
        record["rows"] = len(frame)
    record["first"], record["last"] = frame.index[0].isoformat(), frame.index[-1].isoformat()
    return frame, record, None
