"""Volatility-scaled candles: the two numbers a token carries, and the walk back to prices.

Both numbers are divided by sigma_t, a volatility estimate built from PAST candles only (see
the tokenizer's docstring for the definitions): `candle_features` computes them for every
candle of one series, and where the series stands after its last candle (VolState).
`walk` goes the other way: scaled moves -> closes, updating sigma with the same EWMA, step by
step (each step's sigma depends on the previous moves) and vectorized over paths.

What the EWMA averages, one reading per candle (tokenizer.vol_estimator):
    close   r^2, the squared log-close move (the default)
    range   TR^2 / (4 ln 2), the Parkinson variance of the candle's true range
            TR = log(max(high, previous close) / min(low, previous close)): for a driftless
            Brownian candle E[log(high/low)^2] = 4 ln 2 sigma^2, a reading some five times less
            noisy than r^2, and the previous close keeps an overnight gap in it. A sampled
            candle opens at the previous close, so its TR is max(range, |move|).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple, Optional, Sequence, Union, get_args

import numpy as np
import pandas as pd

from common.config import VolEstimator
from common.errors import UserError
from common.special_tokens import BOS_TOKEN, MISSING_TOKEN
from common.tokens.candles import CandleInput, check_positive, price_arrays

__all__ = [
    "SIGMA_FLOOR",
    "VOL_ESTIMATORS",
    "ArrayOrFloat",
    "CandleFeatures",
    "VolState",
    "candle_features",
    "ewma",
    "ewma_alpha",
    "vol_readings",
    "walk",
]

# sigma never goes below this (log-return units): a series that has not moved for vol_halflife
# candles would otherwise divide by zero. Its next real move then lands in an end bin (clipped).
SIGMA_FLOOR = 1e-8
VOL_ESTIMATORS: tuple[str, ...] = get_args(VolEstimator)  # what the EWMA averages: see the module docstring
_PARKINSON = 4.0 * math.log(2.0)  # E[log(high / low)^2] / sigma^2 of a driftless Brownian candle

ArrayOrFloat = Union[float, np.ndarray]  # one value for every path, or one per path


class VolState(NamedTuple):
    """Where a series stands after its last candle: what `decode_path` continues from."""

    last_close: float  # last valid close
    sigma: float  # volatility for the NEXT candle (includes the last candle's move)
    ewma_weight: float  # sum of the EWMA weights so far (1/alpha once converged)


@dataclass
class CandleFeatures:
    """Per-candle normalised features of one series; NaN where the token is special."""

    move_z: np.ndarray
    shape_z: np.ndarray
    special: np.ndarray  # int8: 0 for a real candle token, else MISSING_TOKEN / BOS_TOKEN
    state: Optional[VolState] = None


def ewma_alpha(halflife: float) -> float:
    """The EWMA's per-step weight: a past value's weight halves every `halflife` steps."""
    return 1.0 - 0.5 ** (1.0 / halflife)


def vol_readings(log_close: np.ndarray, log_high: np.ndarray, log_low: np.ndarray, estimator: str) -> np.ndarray:
    """The EWMA's reading of each candle after the first, from the valid candles' log prices
    (high and low: the extremes of open, high, low and close): len(log_close) - 1 values."""
    r = np.diff(log_close)
    if estimator == "close":
        return r * r
    prev = log_close[:-1]
    tr = np.maximum(log_high[1:], prev) - np.minimum(log_low[1:], prev)
    return tr * tr / _PARKINSON


def candle_features(
    candles: CandleInput,
    asset: str,
    timestamps: Optional[Sequence],
    vol_halflife: float,
    vol_warmup: int,
    want_state: bool = False,
    vol_estimator: str = "close",
) -> CandleFeatures:
    """move/sigma and shape/sigma of each candle; the first vol_warmup + 1 valid candles are BOS,
    invalid ones MISSING. want_state: also the VolState after the last candle."""
    o, h, low, c, timestamps = price_arrays(candles, asset, timestamps)
    n = len(c)
    check_positive(o, h, low, c, asset, timestamps)
    valid = np.isfinite(o) & np.isfinite(h) & np.isfinite(low) & np.isfinite(c)
    vi = np.flatnonzero(valid)  # the valid candles, in order; gaps simply drop out
    m = len(vi)

    special = np.where(valid, 0, MISSING_TOKEN).astype(np.int8)
    special[vi[: vol_warmup + 1]] = BOS_TOKEN
    move_z = np.full(n, np.nan)
    shape_z = np.full(n, np.nan)
    if m == 0:
        return CandleFeatures(move_z, shape_z, special)

    log_close = np.log(c[vi])
    r = np.diff(log_close)  # r[j]: move of valid candle j+1 from valid candle j
    hi = np.maximum(np.maximum(o[vi], h[vi]), np.maximum(low[vi], c[vi]))
    lo = np.minimum(np.minimum(o[vi], h[vi]), np.minimum(low[vi], c[vi]))
    # var[j]: EWMA of the readings of valid candles 1..j+1, i.e. what is known once j+1 has closed.
    var = ewma(vol_readings(log_close, np.log(hi), np.log(lo), vol_estimator), vol_halflife)
    k = np.arange(vol_warmup + 1, m)  # warm valid candles: at least vol_warmup past returns
    if len(k):
        sigma = np.maximum(np.sqrt(var[k - 2]), SIGMA_FLOOR)  # returns strictly before candle k
        rows = vi[k]
        move_z[rows] = r[k - 1] / sigma
        shape_z[rows] = np.log(hi[k] / lo[k]) / sigma  # hi == lo gives exactly 0

    state = None
    if want_state:
        alpha = ewma_alpha(vol_halflife)
        last_var = float(var[-1]) if len(var) else 0.0
        weight = (1.0 - (1.0 - alpha) ** len(r)) / alpha  # closed form of the weight sum
        state = VolState(last_close=float(c[vi[-1]]), sigma=max(math.sqrt(last_var), SIGMA_FLOOR), ewma_weight=weight)
    return CandleFeatures(move_z, shape_z, special, state)


def walk(
    move_z: np.ndarray,
    last_close: ArrayOrFloat,
    sigma: ArrayOrFloat,
    ewma_weight: Optional[ArrayOrFloat],
    alpha: float,
    shape_z: Optional[np.ndarray] = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(log close, log close before the step, sigma used), each (P, H), of P paths of H scaled
    moves move_z (P, H), NaN where a step has no candle (NaN move: nothing changes).

    Each move multiplies the close by exp(move_z * sigma), then updates sigma with the EWMA
    (weight alpha); without ewma_weight the EWMA is taken as converged (weight 1/alpha).
    shape_z (P, H), the candles' scaled ranges: the EWMA reads their true ranges (vol_estimator
    "range"); None: their squared moves ("close").
    """
    P, H = move_z.shape
    close0 = np.broadcast_to(np.asarray(last_close, dtype=np.float64), (P,))
    if not (np.all(close0 > 0) and np.all(np.isfinite(close0))):
        raise UserError(f"decode_path: last_close must be a positive price, got {last_close}")
    weight = np.broadcast_to(
        np.asarray(1.0 / alpha if ewma_weight is None else ewma_weight, dtype=np.float64), (P,)
    ).copy()
    var = np.broadcast_to(np.asarray(sigma, dtype=np.float64) ** 2, (P,)).copy()
    log_close = np.log(close0)
    out, before, sig = np.full((P, H), np.nan), np.full((P, H), np.nan), np.full((P, H), np.nan)
    decay = 1.0 - alpha
    for i in range(H):  # sequential over steps: sigma depends on the moves so far
        ok = ~np.isnan(move_z[:, i])  # special token: no candle, nothing changes
        s = np.maximum(np.sqrt(var), SIGMA_FLOOR)
        r = np.where(ok, move_z[:, i] * s, 0.0)
        before[ok, i] = log_close[ok]
        log_close = log_close + r
        out[ok, i], sig[ok, i] = log_close[ok], s[ok]
        if shape_z is None:
            reading = r * r
        else:  # the candle opens at the previous close: its true range is max(range, |move|)
            tr = np.maximum(np.where(ok, shape_z[:, i], 0.0) * s, np.abs(r))
            reading = tr * tr / _PARKINSON
        new_weight = decay * weight + 1.0  # bias-corrected EWMA, as pandas ewm(adjust=True)
        var = np.where(ok, var + (reading - var) / new_weight, var)
        weight = np.where(ok, new_weight, weight)
    return out, before, sig


def ewma(x: np.ndarray, halflife: float) -> np.ndarray:
    """Bias-corrected EWMA of x (pandas' cython loop: fast, no Python per-element loop)."""
    if len(x) == 0:
        return x
    return pd.Series(x, copy=False).ewm(halflife=halflife, adjust=True).mean().to_numpy()
