"""Inputs beside the token: the candle's own time and its volume bin (model.time_features,
model.volume_input).

Each candle gets three small integer ids, aligned one-to-one with its token:

    calendar_a  hour of day (0-23) for intraday intervals; month - 1 (0-11) for daily ones
    calendar_b  day of week (0 = Monday)
    volume      0 when there is no reading (a missing candle, no volume, too early for the
                EWMA); else 1..VOLUME_BINS: the candle's volume relative to the EWMA of the
                volumes before it, cut at quantile edges fitted on the training split only

Hourly crypto volatility has a strong time-of-day pattern that a model cannot learn without
knowing the hour. Volume is an input only: it is never predicted.
"""

from __future__ import annotations

from typing import Iterable

import numpy as np
import pandas as pd

__all__ = [
    "CALENDAR_A",
    "CALENDAR_B",
    "NUM_FEATURES",
    "VOLUME_BINS",
    "calendar_ids",
    "candle_features",
    "run_features",
    "fit_volume_edges",
    "relative_volume",
    "volume_ids",
]

NUM_FEATURES = 3  # calendar_a, calendar_b, volume
CALENDAR_A = 24  # hour of day (intraday) or month (daily): rows of the first time embedding
CALENDAR_B = 7  # day of week
VOLUME_BINS = 8  # id 0 is "no reading", so the volume embedding has VOLUME_BINS + 1 rows
_VOLUME_HALFLIFE = 20.0  # candles
_VOLUME_WARMUP = 20  # candles before the EWMA counts


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


def candle_features(
    frame: pd.DataFrame, interval: str, edges: list[float], relative: np.ndarray | None = None
) -> np.ndarray:
    """(n, NUM_FEATURES) int64 ids of a cleaned candle frame, one row per candle (token).
    relative: the frame's relative_volume, when already computed."""
    if relative is None:
        relative = relative_volume(frame["volume"].to_numpy(dtype=np.float64))
    return np.concatenate([calendar_ids(frame.index, interval), volume_ids(relative, edges)[:, None]], axis=1)


def run_features(
    frames: dict[str, pd.DataFrame], train: dict[str, tuple[int, int]], interval: str
) -> tuple[dict[str, np.ndarray], list[float]]:
    """Every asset's feature ids, with the volume edges fitted on the train ranges only."""
    relative = {s: relative_volume(f["volume"].to_numpy(dtype=np.float64)) for s, f in frames.items()}
    edges = fit_volume_edges(relative[s][train[s][0] : train[s][1]] for s in frames)
    features = {s: candle_features(f, interval, edges, relative[s]) for s, f in frames.items()}
    return features, edges
