"""The cross-section judged: the rank IC of the factors a quant ranks by without a model, beside
the model's, on the same origins (dates and assets).

Each factor is a score per (asset, origin) from the candles up to and including the origin
(nothing later), higher meaning "expect a higher return":

- reversal: minus the last return (short-term reversal)
- range_reversal: minus the close's position in the last candle's range, (C - L) / (H - L) - 1/2
- momentum20, momentum250: the log return over the 20 (250) candles before the last one
  (skipping the last, whose reversal would otherwise mask the momentum)
- low_vol: minus the standard deviation of the last 20 returns

Returns are between valid closes (gap rows skipped), as the baselines read them. The card per
horizon gives each factor's mean rank IC with its Newey-West t, and the model's IC minus the best
factor's (the highest mean IC) per date on the dates both rank, with its Newey-West t: a model
whose ranking is a factor's shows no edge over it.
"""

from __future__ import annotations

import math
from typing import Optional, Sequence

import numpy as np

from common.evaluation.asset_series import AssetSeries
from common.evaluation.metrics import newey_west_t, rank_ic
from common.evaluation.walk_forward import Origins

__all__ = ["FACTORS", "edge_over", "factor_card", "factor_signals", "nw_lags"]

FACTORS = ("reversal", "range_reversal", "momentum20", "momentum250", "low_vol")
_VOL_WINDOW = 20


def nw_lags(n: int, horizon: int, stride: int) -> int:
    """The rank IC's Newey-West lags: the horizon's overlap in origin steps, or the usual
    floor(4 (n / 100)^(2/9)), whichever is more."""
    return max(math.ceil(horizon / stride) - 1, math.floor(4 * (n / 100) ** (2 / 9))) if n else 0


def factor_signals(series: Sequence[AssetSeries], o: Origins) -> dict[str, np.ndarray]:
    """factor -> (len(o.index),) scores at each origin; NaN without enough history."""
    out = {name: np.full(len(o.index), np.nan) for name in FACTORS}
    for k, s in enumerate(series):
        rows = np.flatnonzero(o.series == k)
        if not len(rows):
            continue
        close = s.candles["close"].to_numpy(dtype=np.float64)
        valid = np.flatnonzero(np.isfinite(close) & (close > 0))
        logc = np.log(close[valid])
        # the origin's position among the valid closes (an origin is a valid close)
        pos = np.searchsorted(valid, o.index[rows])
        r = np.diff(logc, prepend=np.nan)  # r[j]: return into valid close j
        ok = pos >= 1
        out["reversal"][rows[ok]] = -r[pos[ok]]
        high = s.candles["high"].to_numpy(dtype=np.float64)[o.index[rows]]
        low = s.candles["low"].to_numpy(dtype=np.float64)[o.index[rows]]
        span = high - low
        with np.errstate(invalid="ignore", divide="ignore"):
            where = np.where(span > 0, (close[o.index[rows]] - low) / span - 0.5, np.nan)
        out["range_reversal"][rows] = -where
        for name, n in (("momentum20", 20), ("momentum250", 250)):
            ok = pos >= n + 1
            out[name][rows[ok]] = logc[pos[ok] - 1] - logc[pos[ok] - 1 - n]
        cs, cs2 = (
            np.concatenate([[0.0], np.cumsum(np.nan_to_num(r))]),
            np.concatenate([[0.0], np.cumsum(np.nan_to_num(r) ** 2)]),
        )
        ok = pos >= _VOL_WINDOW
        hi, lo = pos[ok] + 1, pos[ok] + 1 - _VOL_WINDOW  # returns lo..pos, the last 20
        mean = (cs[hi] - cs[lo]) / _VOL_WINDOW
        var = (cs2[hi] - cs2[lo]) / _VOL_WINDOW - mean**2
        out["low_vol"][rows[ok]] = -np.sqrt(np.maximum(var, 0.0))
    return out


def _ic(dates: np.ndarray, signal: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    ok = np.isfinite(signal)
    return rank_ic(dates[ok], signal[ok], y[ok])


def _ic_stats(ic: np.ndarray, horizon: int, stride: int) -> Optional[dict]:
    lags = nw_lags(len(ic), horizon, stride)
    if len(ic) < 2:
        return None
    return {"mean": float(ic.mean()), "t_nw": newey_west_t(ic, lags), "n_dates": int(len(ic)), "nw_lags": lags}


def factor_card(
    dates: np.ndarray,
    y: np.ndarray,
    model_mean: np.ndarray,
    signals: dict[str, np.ndarray],
    horizon: int,
    stride: int,
    model_p_up: Optional[np.ndarray] = None,
) -> dict:
    """Each factor's rank IC (mean, Newey-West t, dates), the model's edge over the best one, and
    (model_p_up given) the rank IC of the model's P(up) beside its mean's."""
    ics = {name: _ic(dates, sig, y) for name, sig in signals.items()}
    card: dict = {"factors": {name: _ic_stats(ic, horizon, stride) for name, (_, ic) in ics.items()}, "edge": None}
    if model_p_up is not None:
        card["model_p_up"] = _ic_stats(_ic(dates, model_p_up, y)[1], horizon, stride)
    ranked = {k: v for k, v in card["factors"].items() if v is not None}
    if not ranked:
        return card
    best = max(ranked, key=lambda k: ranked[k]["mean"])
    card["edge"] = {"best_factor": best, **edge_over(dates, y, model_mean, signals[best], horizon, stride)}
    return card


def edge_over(
    dates: np.ndarray, y: np.ndarray, mean: np.ndarray, factor: np.ndarray, horizon: int, stride: int
) -> dict:
    """A forecaster's rank IC (of its `mean`) minus a factor's, per date on the dates both rank: the
    mean difference, its Newey-West t (None with fewer than two dates), the dates and the lags."""
    mean_dates, mean_ic = _ic(dates, mean, y)
    factor_dates, factor_ic = _ic(dates, factor, y)
    common, mi, fi = np.intersect1d(mean_dates, factor_dates, return_indices=True)
    diff = mean_ic[mi] - factor_ic[fi]
    lags = nw_lags(len(diff), horizon, stride)
    return {
        "model_minus_best": float(diff.mean()) if len(diff) else None,
        "t_nw": newey_west_t(diff, lags) if len(diff) >= 2 else None,
        "n_dates": int(len(common)),
        "nw_lags": lags,
    }
