"""Inputs beside the token: the candle's own time, its volume bin and its volatility level
(model.time_features, model.volume_input, model.vol_level_input).

Each candle gets three small integer ids (four with model.vol_level_input), aligned one-to-one
with its token:

    calendar_a  hour of day (0-23) for intraday intervals; month - 1 (0-11) for daily ones
    calendar_b  day of week (0 = Monday)
    volume      0 when there is no reading (a missing candle, no volume, too early for the
                EWMA); else 1..VOLUME_BINS: the candle's volume relative to the EWMA of the
                volumes before it, cut at quantile edges fitted on the training split only
    vol_level   (only with model.vol_level_input) 0 while not warm; else 1..VOL_LEVEL_BINS:
                log(sigma_t / sigma_long_t) cut at the FIXED edges VOL_LEVEL_EDGES, where
                sigma_t is the tokenizer's volatility scale once candle t has closed (its EWMA of
                squared log-close returns, halflife vol_halflife: the sigma that scales candle
                t + 1's token; with vol_estimator "range" the EWMA of its true ranges'
                Parkinson variances) and sigma_long_t the same estimator at VOL_LEVEL_SLOW x
                the halflife: the asset's long-run level. Candles up to and including t only.

Hourly crypto volatility has a strong time-of-day pattern that a model cannot learn without
knowing the hour. Volume is an input only: it is never predicted.

Why the volatility level: tokens are moves divided by sigma_t, so the model sees ratios only and
cannot tell a calm stretch from a turbulent one, which drives the mean reversion of volatility
(HAR's slow terms). The ratio to the asset's own slow EWMA is dimensionless, so fixed edges serve
every asset and interval: nothing is fitted, and nothing new is stored in data_info.json or an
export. Its warm-up is one slow halflife of returns (VOL_LEVEL_SLOW x vol_halflife), before which
the id is 0. A missing candle keeps the level of the candle before it (sigma does not change).
Forecasts hold the origin's id for the sampled future candles (common/forecasting/core.py).
"""

from __future__ import annotations

import math
from typing import Iterable, NamedTuple, Optional

import numpy as np
import pandas as pd

from common.tokens.volatility import SIGMA_FLOOR, ewma as _ewma, vol_readings

__all__ = [
    "CALENDAR_A",
    "CALENDAR_B",
    "NUM_FEATURES",
    "VOLUME_BINS",
    "VOL_LEVEL_BINS",
    "VOL_LEVEL_EDGES",
    "VOL_LEVEL_SLOW",
    "MARKET_BINS",
    "MARKET_COLUMNS",
    "feature_columns",
    "VolLevel",
    "calendar_ids",
    "candle_features",
    "run_features",
    "fit_volume_edges",
    "relative_volume",
    "volume_ids",
    "vol_level_ids",
    "vol_level_ratio",
    "binned",
]

NUM_FEATURES = 3  # calendar_a, calendar_b, volume (+ vol_level: a 4th column, with model.vol_level_input)
CALENDAR_A = 24  # hour of day (intraday) or month (daily): rows of the first time embedding
CALENDAR_B = 7  # day of week
VOLUME_BINS = 8  # id 0 is "no reading", so the volume embedding has VOLUME_BINS + 1 rows
_VOLUME_HALFLIFE = 20.0  # candles
_VOLUME_WARMUP = 20  # candles before the EWMA counts
# log(sigma / sigma_long) edges, 0.15 apart (sigma 16% above the edge below), one at "at its
# long-run level": on the shipped daily sample (log ratio median -0.13, sd 0.26) the 8 bins hold
# 10, 16, 21, 21, 17, 10, 4 and 2% of the warm candles
VOL_LEVEL_EDGES = (-0.45, -0.3, -0.15, 0.0, 0.15, 0.3, 0.45)
VOL_LEVEL_BINS = len(VOL_LEVEL_EDGES) + 1  # id 0 is "not warm", so the embedding has VOL_LEVEL_BINS + 1 rows
MARKET_COLUMNS = 3  # model.market_context: the cross-section's move, dispersion and volatility (market_context.py)
MARKET_BINS = 8  # bins of each market column (id 0 is "unknown", so each table has MARKET_BINS + 1 rows)
VOL_LEVEL_SLOW = 10.0  # the long-run EWMA's halflife, in tokenizer vol_halflifes (200 candles by default)


class VolLevel(NamedTuple):
    """The tokenizer's volatility settings the vol-level ids are computed with."""

    vol_halflife: float
    vol_warmup: int
    vol_estimator: str = "close"

    @classmethod
    def of(cls, tokenizer) -> "VolLevel":  # an OHLCTokenizer (not imported: it imports this module's users)
        return cls(tokenizer.vol_halflife, tokenizer.vol_warmup, tokenizer.vol_estimator)


def feature_columns(vol_level: bool, market_context: bool, market_peer: bool = False) -> int:
    """How many id columns a candle has: the three, then vol_level's, then market_context's three,
    then market_peer's one."""
    return NUM_FEATURES + int(vol_level) + MARKET_COLUMNS * int(market_context) + int(market_peer)


def calendar_ids(index: pd.DatetimeIndex, interval: str) -> np.ndarray:
    """(n, 2) int64: (hour or month - 1, day of week) of each candle's UTC time."""
    index = index.tz_convert("UTC") if index.tz is not None else index
    first = index.month.to_numpy() - 1 if interval == "1d" else index.hour.to_numpy()
    return np.stack([first, index.day_of_week.to_numpy()], axis=1).astype(np.int64)


def relative_volume(volume: np.ndarray) -> np.ndarray:
    """log(volume / EWMA of the volumes before it); NaN where there is no usable reading."""
    v = pd.Series(np.where(volume > 0, volume, np.nan), dtype="float64")
    ewma = v.ewm(halflife=_VOLUME_HALFLIFE, ignore_na=True).mean().shift(1)  # past candles only
    seen = v.notna().cumsum().shift(1).fillna(0)
    rel = np.log(v / ewma).to_numpy(copy=True)
    rel[(seen < _VOLUME_WARMUP).to_numpy()] = np.nan
    return rel


def fit_volume_edges(train_relative: Iterable[np.ndarray]) -> list[float]:
    """VOLUME_BINS - 1 quantile edges of the pooled training relative volumes."""
    pooled = np.concatenate([r[np.isfinite(r)] for r in train_relative] or [np.zeros(0)])
    if len(pooled) == 0:
        return [0.0] * (VOLUME_BINS - 1)  # no volume anywhere: every reading lands in one bin
    return [float(q) for q in np.quantile(pooled, np.arange(1, VOLUME_BINS) / VOLUME_BINS)]


def volume_ids(relative: np.ndarray, edges: list[float]) -> np.ndarray:
    ids = np.searchsorted(np.asarray(edges), relative, side="right") + 1
    return np.where(np.isfinite(relative), ids, 0).astype(np.int64)


def vol_level_ratio(frame: pd.DataFrame, vol: VolLevel) -> np.ndarray:
    """(n,) float64 log(sigma_t / sigma_long_t) of each candle of a cleaned frame from its
    candles up to it; NaN while not warm (a missing candle keeps the previous value)."""
    prices = frame[["open", "high", "low", "close"]].to_numpy(dtype=np.float64)
    valid = np.isfinite(prices).all(axis=1)  # the tokenizer's valid candles
    n = len(prices)
    vi = np.flatnonzero(valid)
    logs = np.log(prices[vi])
    # x[j]: the reading of valid candle j + 1 (its squared move, or its true range's)
    x = vol_readings(logs[:, 3], logs.max(axis=1), logs.min(axis=1), vol.vol_estimator)
    warmup = max(vol.vol_warmup, int(math.ceil(VOL_LEVEL_SLOW * vol.vol_halflife)))
    if len(x) < warmup:
        return np.full(n, np.nan)
    # 0.5 log(var / var_long) == log(sigma / sigma_long); var[j]: once valid candle j + 1 has closed
    fast = np.maximum(_ewma(x, vol.vol_halflife), SIGMA_FLOOR**2)
    slow = np.maximum(_ewma(x, VOL_LEVEL_SLOW * vol.vol_halflife), SIGMA_FLOOR**2)
    at = np.full(n, np.nan)  # at each valid candle (k >= warmup returns seen): its level
    at[vi[warmup:]] = 0.5 * np.log(fast / slow)[warmup - 1 :]
    # forward-fill over missing candles: the level of the last valid candle at or before each row
    last = np.maximum.accumulate(np.where(valid, np.arange(n), -1))
    return np.where(last >= 0, at[np.maximum(last, 0)], np.nan)


def binned(values: np.ndarray, edges: tuple[float, ...]) -> np.ndarray:
    """(n,) int64 ids: 0 where a value is NaN (unknown), else 1 + the number of edges at or below it."""
    ids = np.searchsorted(np.asarray(edges), values, side="right") + 1
    return np.where(np.isfinite(values), ids, 0).astype(np.int64)


def vol_level_ids(frame: pd.DataFrame, vol: VolLevel) -> np.ndarray:
    """(n,) int64 vol-level id of each candle of a cleaned frame from its close and the closes
    before it (a missing candle keeps the previous id)."""
    return binned(vol_level_ratio(frame, vol), VOL_LEVEL_EDGES)


def candle_features(
    frame: pd.DataFrame,
    interval: str,
    edges: list[float],
    relative: np.ndarray | None = None,
    vol: Optional[VolLevel] = None,
) -> np.ndarray:
    """(n, NUM_FEATURES) int64 ids of a cleaned candle frame, one row per candle (token);
    (n, NUM_FEATURES + 1) with vol (the vol-level ids last). relative: the frame's
    relative_volume, when already computed."""
    if relative is None:
        relative = relative_volume(frame["volume"].to_numpy(dtype=np.float64))
    columns = [calendar_ids(frame.index, interval), volume_ids(relative, edges)[:, None]]
    if vol is not None:
        columns.append(vol_level_ids(frame, vol)[:, None])
    return np.concatenate(columns, axis=1)


def run_features(
    frames: dict[str, pd.DataFrame], train: dict[str, tuple[int, int]], interval: str
) -> tuple[dict[str, np.ndarray], list[float]]:
    """Every asset's feature ids, with the volume edges fitted on the train ranges only."""
    relative = {s: relative_volume(f["volume"].to_numpy(dtype=np.float64)) for s, f in frames.items()}
    edges = fit_volume_edges(relative[s][train[s][0] : train[s][1]] for s in frames)
    features = {s: candle_features(f, interval, edges, relative[s]) for s, f in frames.items()}
    return features, edges
