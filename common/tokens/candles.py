"""The candles the tokenizer reads: a frame, a mapping of columns or an array -> price arrays.

Accepted: a canonical candle DataFrame (sorted DatetimeIndex, columns open/high/low/close
[/volume]), a mapping of those column names to arrays, or an (n, 4|5) array in that column
order. A missing candle is a row with NaN prices; a non-positive price is a UserError that
names the asset and the timestamp (or row).
"""

from __future__ import annotations

from typing import Any, Mapping, Optional, Sequence, Union

import numpy as np
import pandas as pd

from common.errors import UserError

__all__ = ["PRICE_COLUMNS", "CandleInput", "check_positive", "price_arrays"]

PRICE_COLUMNS = ("open", "high", "low", "close")

CandleInput = Union[pd.DataFrame, np.ndarray, Mapping[str, Any]]


def price_arrays(
    candles: CandleInput, asset: str, timestamps: Optional[Sequence]
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, Optional[Sequence]]:
    """open, high, low, close as float64 arrays, plus timestamps for error messages (or None)."""
    if isinstance(candles, pd.DataFrame):
        missing = [c for c in PRICE_COLUMNS if c not in candles.columns]
        if missing:
            raise UserError(
                f"{asset}: candle frame lacks column(s) {', '.join(missing)}; expected open, high, low, close, volume"
            )
        if not candles.index.is_monotonic_increasing:
            raise UserError(f"{asset}: candles are not sorted by time; sort the frame by its index first")
        cols = [candles[c].to_numpy(dtype=np.float64) for c in PRICE_COLUMNS]
        if timestamps is None and isinstance(candles.index, pd.DatetimeIndex):
            timestamps = candles.index
    elif isinstance(candles, Mapping):
        try:
            cols = [np.asarray(candles[c], dtype=np.float64) for c in PRICE_COLUMNS]
        except KeyError as e:
            raise UserError(f"{asset}: candle arrays lack {e}; expected open, high, low, close") from None
    else:
        arr = np.asarray(candles, dtype=np.float64)
        if arr.ndim != 2 or arr.shape[1] not in (4, 5):
            raise UserError(
                f"{asset}: candle array must have shape (n, 4) or (n, 5) with columns "
                f"open, high, low, close[, volume]; got {arr.shape}"
            )
        cols = [arr[:, i] for i in range(4)]
    n = len(cols[3])
    if any(len(c) != n for c in cols) or cols[0].ndim != 1:
        raise UserError(f"{asset}: open, high, low, close must be 1-D and of equal length")
    if timestamps is not None and len(timestamps) != n:
        raise UserError(f"{asset}: {len(timestamps)} timestamps for {n} candles")
    return cols[0], cols[1], cols[2], cols[3], timestamps


def check_positive(
    o: np.ndarray, h: np.ndarray, low: np.ndarray, c: np.ndarray, asset: str, timestamps: Optional[Sequence]
) -> None:
    """UserError at the first candle with a price <= 0 (NaN compares False, so missing candles
    pass; -inf is caught here)."""
    bad = (o <= 0) | (h <= 0) | (low <= 0) | (c <= 0)
    if bad.any():
        i = int(np.argmax(bad))
        where = f"at {_format_time(timestamps[i])}" if timestamps is not None else f"at row {i}"
        prices = ", ".join(f"{name}={col[i]:g}" for name, col in zip(PRICE_COLUMNS, (o, h, low, c)))
        raise UserError(
            f"{asset}: non-positive price {where} ({prices}; {int(bad.sum())} such candle(s)); "
            "prices must be > 0: repair or drop these rows in the data layer"
        )


def _format_time(t: Any) -> str:
    try:
        return pd.Timestamp(t).isoformat()
    except (TypeError, ValueError):
        return str(t)
