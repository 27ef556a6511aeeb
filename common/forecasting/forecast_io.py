"""What goes into a forecast and comes out of it: History (one origin: an asset's candles up to
it), ForecastResult (the table, and the paths on request), the per-step summary of sampled paths
and the future bars' timestamps. Plain pandas and numpy, shared by every forecaster and the
scorecard."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

import numpy as np
import pandas as pd

from common.markets import interval_step

__all__ = ["QUANTILES", "ForecastResult", "History", "future_timestamps", "histories_at", "summarize_paths"]

QUANTILES = (5, 10, 25, 50, 75, 90, 95)  # percent: the close's P5 ... P95 columns


@dataclass(frozen=True)
class History:
    """One forecast origin: an asset and its candles up to and including the origin, nothing after.

    candles: a canonical candle frame (UTC DatetimeIndex; open, high, low, close[, volume]) as
    the data layer cleans it (crypto gaps as NaN rows). The origin is its last row.
    """

    symbol: str
    candles: pd.DataFrame


def histories_at(symbol: str, candles: pd.DataFrame, origins: Sequence[Any]) -> list[History]:
    """One History per origin time: a copy of the candles up to and including it (a walk-forward's
    inputs; a copy, so nothing after the origin is reachable from it)."""
    index = candles.index
    return [
        History(symbol, candles.iloc[: int(index.searchsorted(pd.Timestamp(t), side="right"))].copy()) for t in origins
    ]


@dataclass
class ForecastResult:
    table: pd.DataFrame  # one row per history x step (see summarize_paths)
    paths: Optional[dict[str, np.ndarray]] = None  # close (N, S, H + 1); open, high, low (N, S, H)
    tokens: Optional[np.ndarray] = None  # (N, S, H) sampled token ids, with return_paths
    origins: list[dict[str, Any]] = field(default_factory=list)  # per history: symbol, as_of, last_close


def future_timestamps(last: pd.Timestamp, interval: str, category: str, horizon: int) -> pd.DatetimeIndex:
    """The next `horizon` bar times after `last` on the asset's calendar.

    Crypto trades around the clock: every bar. Other markets: weekdays only (daily bars on
    business days, intraday bars skip Saturday and Sunday); exchange holidays are not known
    here, so a holiday gets a bar.
    """

    step = interval_step(interval)
    if category == "crypto":
        return pd.DatetimeIndex([last + step * k for k in range(1, horizon + 1)], name="timestamp")
    stamps: list[pd.Timestamp] = []
    t = last
    while len(stamps) < horizon:
        t = t + step
        if t.weekday() < 5:
            stamps.append(t)
    return pd.DatetimeIndex(stamps, name="timestamp")


def summarize_paths(close: np.ndarray, high: np.ndarray, low: np.ndarray) -> dict[str, np.ndarray]:
    """Per-step statistics over samples of one origin's paths.

    close: (S, H + 1) with column 0 the last real close; high, low: (S, H). Returns (H,) arrays:
    p5 ... p95 of the close (linear interpolation between order statistics, so quantiles of
    higher levels are never lower), mean and std (over samples, ddof 0) of the log return from
    the last close, p_up = fraction of paths whose close is above the last close, and
    expected_range = mean of high - low (price units).
    """
    last = close[:, :1]
    future = close[:, 1:]
    q = np.percentile(future, QUANTILES, axis=0)  # (len(QUANTILES), H)
    log_ret = np.log(future / last)
    out = {f"p{p}": q[i] for i, p in enumerate(QUANTILES)}
    out.update(
        mean_log_return=log_ret.mean(axis=0),
        std_log_return=log_ret.std(axis=0),
        p_up=(future > last).mean(axis=0),
        expected_range=(high - low).mean(axis=0),
    )
    return out
