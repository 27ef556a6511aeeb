"""HAR-family baselines: forecasters that, like the model, see each candle's open, high, low and close.

The variance proxy of a candle is its Garman-Klass range variance
    0.5 ln(H/L)^2 - (2 ln 2 - 1) ln(C/O)^2
plus the squared gap ln(O / previous C)^2. Garman-Klass because it is the most efficient of the
three classic range estimators for a driftless price (about 7x close-to-close; Parkinson uses H/L
only, Rogers-Satchell pays for drift robustness that a candle's drift, small beside its range,
does not need); the gap term adds the move between candles that no range sees (a market closed
overnight). A candle without a range (open = high = low = close) leaves the squared return.

- har: HAR (Corsi 2009) on the proxy, x_t+1 = c + b1 x_t + b5 mean(x_t-4..t) + b22 mean(x_t-21..t)
- log_har: the same on log x, its forecast mapped back with Duan's smearing factor mean(exp(resid))

Both are fitted per asset on the TRAIN split only with `arch`'s HARX (least squares: a constant
variance with normal errors is fitted by OLS there). Multi-step variances iterate the recursion
with the forecasts in place of the unseen values. Returns are the forecast volatility times draws
(with replacement) from the asset's centred standardized train residuals r_t / sqrt(fitted x_t),
which also carry the proxy's scale against close-to-close returns.

Intraday intervals: the proxy is divided by its hour-of-day mean over the train split (the hour the
tokenizer gives the model, common.tokens.features.calendar_ids) before the fit, and each forecast
multiplied back by its target candle's hour factor. An asset with fewer than MIN_HAR_CANDLES train
candles, or a failed fit, gets the 22-candle mean of the proxy with normal draws (`fallback`).
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Optional, Sequence

import numpy as np
import pandas as pd

from common.forecasting.forecast_io import History
from common.markets import interval_step
from common.tokens.features import calendar_ids

__all__ = ["HAR_LAGS", "MIN_HAR_CANDLES", "HarFit", "HarParams", "HarRange", "range_variance"]

HAR_LAGS = (1, 5, 22)
MIN_HAR_CANDLES = 250
_KEPT_RESIDUALS = 2000  # the most recent standardized residuals kept per asset for the draws
_TAIL_ROWS = 32  # rows of a history read at an origin: the 22 candles of the longest mean and a margin
_GK = 2 * math.log(2) - 1
_OHLC = ["open", "high", "low", "close"]


@lru_cache(maxsize=16)
def _positions(columns: tuple) -> np.ndarray:
    """Where open, high, low and close sit among a frame's columns (-1: absent); every history
    of a scorecard has the same columns, so this is looked up once."""
    return np.array([columns.index(c) if c in columns else -1 for c in _OHLC])


def _ohlc(candles: pd.DataFrame) -> np.ndarray:
    """(n, 4) open, high, low, close (a missing column: NaN). The frame's one float block read
    at once: reading columns one by one costs most of a forecast at an origin."""
    cols = _positions(tuple(candles.columns))
    try:
        values = candles.to_numpy(dtype=np.float64)
    except (TypeError, ValueError):  # a column that is not a number
        return candles.reindex(columns=_OHLC).to_numpy(dtype=np.float64)
    return np.where(cols >= 0, values[:, np.maximum(cols, 0)], np.nan)


def range_variance(candles: pd.DataFrame) -> tuple[np.ndarray, np.ndarray, pd.DatetimeIndex]:
    """(proxy, log return, timestamps) of the valid candles (finite positive close; NaN rows
    skipped): Garman-Klass plus the squared gap from the previous close. The first candle has no
    previous close: its gap term and return are 0."""
    ohlc = _ohlc(candles)
    close = ohlc[:, 3]
    ok = np.isfinite(close) & (close > 0)
    c = np.log(close[ok])
    other = ohlc[ok, :3]
    other = np.log(np.where(np.isfinite(other) & (other > 0), other, np.exp(c)[:, None]))
    o, hi, lo = other[:, 0], np.maximum(other[:, 1], c), np.minimum(other[:, 2], c)
    hi, lo = np.maximum(hi, o), np.minimum(lo, o)
    gap = np.concatenate([[0.0], o[1:] - c[:-1]])
    r = np.concatenate([[0.0], np.diff(c)])
    return 0.5 * (hi - lo) ** 2 - _GK * (c - o) ** 2 + gap**2, r, candles.index[ok]


@dataclass(frozen=True)
class HarParams:
    coef: tuple[float, float, float, float]  # c, b1, b5, b22 (on log x for log-HAR)
    log: bool
    smear: float  # Duan's factor (log-HAR), 1 otherwise
    floor: float  # proxy floor: 1% of its train mean (a flat candle's log)
    fill: float  # the train mean of the fitted series: stands in for history an origin lacks (NaN: the history's mean)
    season: Optional[np.ndarray]  # (24,) hour factors (intraday), None daily
    z: np.ndarray  # centred standardized residuals drawn for the returns


def _hours(index: pd.DatetimeIndex, interval: str) -> np.ndarray:
    return calendar_ids(index, interval)[:, 0]


def _season(proxy: np.ndarray, hours: np.ndarray) -> np.ndarray:
    """Mean proxy per hour of day over the overall mean; 1 for an hour without candles."""
    out = np.ones(24)
    mean = proxy.mean()
    for h in np.unique(hours):
        out[h] = max(proxy[hours == h].mean() / mean, 1e-3) if mean > 0 else 1.0
    return out


def _fit_one(candles: pd.DataFrame, interval: str, log: bool) -> Optional[HarParams]:
    from arch.univariate import HARX  # slow to import: only when the baselines are fitted

    proxy, r, index = range_variance(candles)
    if len(proxy) < MIN_HAR_CANDLES or not proxy.mean() > 0:
        return None
    intraday = interval_step(interval) < pd.Timedelta(days=1)
    season = _season(proxy, _hours(index, interval)) if intraday else None
    x = proxy / season[_hours(index, interval)] if season is not None else proxy
    floor = 0.01 * float(x.mean())
    target = np.log(np.maximum(x, floor)) if log else x
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # arch's data-scale chatter: the fit is OLS
        res = HARX(target, lags=list(HAR_LAGS)).fit(disp="off")
    p = res.params.to_numpy()[:4]
    resid = np.asarray(res.resid)
    fitted = target - resid
    if not np.all(np.isfinite(p)):
        return None
    smear = float(np.nanmean(np.exp(resid))) if log else 1.0
    var = np.exp(fitted) * smear if log else np.maximum(fitted, floor)
    if season is not None:
        var = var * season[_hours(index, interval)]
    z = r / np.sqrt(var)
    z = z[np.isfinite(z)][-_KEPT_RESIDUALS:]
    if len(z) < 20:
        return None
    return HarParams(
        (float(p[0]), float(p[1]), float(p[2]), float(p[3])),
        log,
        smear,
        floor,
        float(target.mean()),
        season,
        z - z.mean(),
    )


def _fallback() -> HarParams:
    """The 22-candle mean of the proxy (a history shorter than that: the mean of what it has)."""
    z = np.random.default_rng(0).standard_normal(_KEPT_RESIDUALS)
    return HarParams((0.0, 0.0, 0.0, 1.0), False, 1.0, 1e-12, math.nan, None, z)


@dataclass
class HarRange:
    """HAR (log=False) or log-HAR (log=True) on the range variance, one fit per asset."""

    params: dict[str, HarParams]
    log: bool
    interval: str
    fallback: list[str] = field(default_factory=list)  # assets that got the 22-candle mean
    drift = False  # centred draws: zero mean

    def __call__(self, histories: Sequence[History], horizon: int, n_samples: int, seed: int) -> np.ndarray:
        rng = np.random.default_rng(seed)
        out = np.empty((len(histories), n_samples, horizon))
        for i, h in enumerate(histories):
            p = self.params.get(h.symbol) or _fallback()
            sd = np.sqrt(self.variances(h.candles, p, horizon))
            out[i] = np.cumsum(p.z[rng.integers(0, len(p.z), size=(n_samples, horizon))] * sd, axis=1)
        return out

    def variances(self, candles: pd.DataFrame, p: HarParams, horizon: int) -> np.ndarray:
        """(horizon,) forecast variances of the next candles' log returns, from a history's last candles."""
        proxy, _, index = range_variance(candles.iloc[-_TAIL_ROWS:])
        if len(proxy) <= HAR_LAGS[-1] < len(candles):  # gap rows in the tail: read further back
            proxy, _, index = range_variance(candles.iloc[-10 * _TAIL_ROWS :])
        x = proxy[1:]  # the first candle of the tail has no previous close read: no gap term
        if p.season is not None and len(x):
            x = x / p.season[_hours(index[1:], self.interval)]
        values = np.log(np.maximum(x, p.floor)) if p.log else x
        fill = p.fill if math.isfinite(p.fill) else float(values.mean()) if len(values) else p.floor
        past = [fill] * max(0, HAR_LAGS[-1] - len(values)) + values[-HAR_LAGS[-1] :].tolist()
        c, b1, b5, b22 = p.coef
        for _ in range(horizon):  # plain floats: a few steps, where numpy's per-call cost dominates
            past.append(c + b1 * past[-1] + b5 * sum(past[-5:]) / 5 + b22 * sum(past[-22:]) / 22)
        a = np.asarray(past[-horizon:])
        var = np.exp(np.minimum(a, 50.0)) * p.smear if p.log else np.maximum(a, p.floor)
        if p.season is not None:
            last = index[-1] if len(index) else pd.Timestamp(0, tz="UTC")
            step = interval_step(self.interval)
            var = (
                var
                * p.season[_hours(pd.DatetimeIndex([last + k * step for k in range(1, horizon + 1)]), self.interval)]
            )
        return np.maximum(var, 1e-20)


class HarFit:
    """Fits both HAR baselines one asset at a time (the scorecard reads each asset's train
    candles once, for GARCH and HAR together): `add(symbol, train_candles)`, then `baselines()`."""

    def __init__(self, interval: str) -> None:
        self.interval = interval
        self.fits: dict[bool, HarRange] = {log: HarRange({}, log, interval) for log in (False, True)}

    def add(self, symbol: str, train: pd.DataFrame) -> None:
        for log, har in self.fits.items():
            try:
                p = _fit_one(train, self.interval, log)
            except (ValueError, np.linalg.LinAlgError):  # a degenerate design: the fallback below
                p = None
            if p is None:
                har.fallback.append(symbol)
            har.params[symbol] = p or _fallback()

    def baselines(self) -> dict[str, HarRange]:
        return {"har": self.fits[False], "log_har": self.fits[True]}
