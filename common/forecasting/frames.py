"""predict_df's long data frames: items in, checked histories, a frame of quantiles out.

frame_items splits a caller's long frame (item_id, timestamp, OHLC[V]) into each item's raw
candles after the checks a frame must pass; frame_history cleans one item as training cleaned
its candles (common.forecasting.history.clean_history) and refuses what a forecast cannot start
from; quantile_frame lays the sampled closes out in the forecasting libraries' convention.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import pandas as pd

from common.errors import UserError
from common.forecasting.history import clean_history
from common.markets import interval_step

__all__ = ["DEFAULT_LEVELS", "check_levels", "frame_history", "frame_items", "quantile_frame"]

DEFAULT_LEVELS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)  # predict_df's quantiles, as the libraries'
FRAME_PRICES = ("open", "high", "low", "close")  # a long frame's required candle columns; volume optional


def check_levels(levels: Sequence[float]) -> list[float]:
    """The quantile levels as floats: distinct, each in (0, 1); else a UserError."""
    try:
        out = [float(q) for q in levels]
    except (TypeError, ValueError):
        raise UserError(f"quantile_levels {levels!r}: expected a list of numbers in (0, 1)") from None
    if not out or not all(0 < q < 1 for q in out) or len(set(out)) != len(out):
        raise UserError(f"quantile_levels {levels!r}: expected distinct numbers in (0, 1), e.g. [0.1, 0.5, 0.9]")
    return out


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


def frame_history(
    item: Any, raw: pd.DataFrame, category: str, interval: str, *, needs_volume: bool = False
) -> pd.DataFrame:
    """One item's raw candles (frame_items) cleaned as training cleaned them, once they are on
    the model's interval and end on a valid candle; else a UserError naming it."""
    if needs_volume and raw["volume"].isna().all():
        raise UserError(
            f"predict_df: item {item!r}: the model reads volume (model.volume_input), "
            "so the frame needs a volume column with readings"
        )
    step = interval_step(interval)
    # the median spacing: weekends and holidays leave gaps, a wrong interval changes every step
    gaps = np.diff(raw.index.as_unit("ns").asi8)
    spacing = pd.Timedelta(int(np.median(gaps)), unit="ns") if len(gaps) else step
    if spacing != step:
        raise UserError(
            f"predict_df: item {item!r}: its candles are {spacing} apart (median), the model "
            f"forecasts {interval} candles; resample to {interval}"
        )
    candles = clean_history(raw, str(item), category, step)
    if not len(candles) or candles.index[-1] != raw.index[-1]:
        # cleaning dropped the last candle: the origin would move back and the first forecast
        # step would land on the frame's own last timestamp
        raise UserError(
            f"predict_df: item {item!r}: its last candle, at {raw.index[-1]}, has "
            f"{_invalid_prices(raw[list(FRAME_PRICES)].iloc[-1])}; the forecast starts after "
            "the last row, so fill that candle or drop its row to forecast from the one before"
        )
    return candles


def quantile_frame(
    items: Sequence[Any],
    future: np.ndarray,
    stamps: pd.DatetimeIndex,
    levels: Sequence[float],
    id_column: str,
    timestamp_column: str,
) -> pd.DataFrame:
    """One row per item and future step from the sampled closes `future` (N, samples, horizon):
    the item, the step's timestamp, "mean" and one column per level named str(level)."""
    horizon = future.shape[2]
    quantiles = np.quantile(future, levels, axis=1)  # (Q, N, H), linear as summarize_paths
    ids = pd.Series(list(items)).repeat(horizon).to_numpy()
    out = pd.DataFrame({id_column: ids, timestamp_column: stamps, "mean": future.mean(axis=1).reshape(-1)})
    for j, q in enumerate(levels):
        out[str(q)] = quantiles[j].reshape(-1)
    return out


def _invalid_prices(prices: pd.Series) -> str:
    """`close NaN`: the prices for which cleaning drops a candle (missing, infinite or not positive)."""
    bad = [
        f"{name} {'NaN' if np.isnan(v) else f'{v:g}'}" for name, v in prices.items() if not (np.isfinite(v) and v > 0)
    ]
    return ", ".join(bad) or "invalid prices"
