"""Synthetic candle series with a known generating process, for the scorecard tests."""

from __future__ import annotations

import numpy as np
import pandas as pd

from common.evaluation.asset_series import AssetSeries


def garch_returns(
    n: int, rng: np.random.Generator, omega: float = 1e-5, alpha: float = 0.15, beta: float = 0.75, nu: float = 5.0
) -> np.ndarray:
    """n log returns of a zero-mean GARCH(1,1) with standardized Student-t innovations."""
    z = rng.standard_t(nu, n) * np.sqrt((nu - 2) / nu)
    r = np.empty(n)
    var = omega / (1 - alpha - beta)
    for t in range(n):
        r[t] = np.sqrt(var) * z[t]
        var = omega + alpha * r[t] ** 2 + beta * var
    return r


def candles_from_returns(r: np.ndarray, start: str = "2000-01-01") -> pd.DataFrame:
    """A daily candle frame whose closes have log returns `r` (open = high = low = close)."""
    close = 100 * np.exp(np.concatenate([[0.0], np.cumsum(r)]))
    index = pd.date_range(start, periods=len(close), freq="D", tz="UTC", name="timestamp")
    return pd.DataFrame(
        {"open": close, "high": close, "low": close, "close": close, "volume": np.ones(len(close))}, index=index
    )


def synthetic_series(
    returns: list[np.ndarray], train_frac: float = 0.6, purge: int = 50, category: str = "synthetic"
) -> list[AssetSeries]:
    """One AssetSeries per return array, all on the same dates: train, a purge gap, then test."""
    out = []
    for k, r in enumerate(returns):
        frame = candles_from_returns(r)
        n_train = int(len(frame) * train_frac)
        out.append(AssetSeries(f"A{k}", category, frame, range(0, n_train), range(n_train + purge, len(frame))))
    return out


def candles_from_variances(variance: np.ndarray, unit: np.ndarray, start: str = "2000-01-01") -> pd.DataFrame:
    """Daily candles of a driftless Brownian price: day t walks the sub-steps unit[t] (standard
    normals, (n, steps)) scaled to a day's variance variance[t], from the previous close (open =
    previous close), its high and low the extremes of the walk: the range carries the variance."""
    n, steps = unit.shape
    walk = np.cumsum(unit * np.sqrt(variance / steps)[:, None], axis=1)
    log_open = np.concatenate([[0.0], np.cumsum(walk[:, -1])[:-1]])
    path = log_open[:, None] + walk
    logs = {
        "open": log_open,
        "high": np.maximum(path.max(1), log_open),
        "low": np.minimum(path.min(1), log_open),
        "close": path[:, -1],
    }
    index = pd.date_range(start, periods=n, freq="D", tz="UTC", name="timestamp")
    return pd.DataFrame({**{k: 100 * np.exp(v) for k, v in logs.items()}, "volume": np.ones(n)}, index=index)


def log_har_candles(n: int, rng: np.random.Generator, mean: float = 1e-4, steps: int = 24) -> pd.DataFrame:
    """Candles whose daily variance follows a log-HAR process:
    log v_t = c + 0.35 log v_t-1 + 0.35 mean(log v, 5) + 0.2 mean(log v, 22) + 0.6 e_t."""
    b1, b5, b22, s = 0.35, 0.35, 0.2, 0.6
    mu = np.log(mean)
    logv = np.full(n + 22, mu)
    e = rng.standard_normal(n + 22) * s
    for t in range(22, n + 22):
        logv[t] = mu * (1 - b1 - b5 - b22) + b1 * logv[t - 1] + b5 * logv[t - 5 : t].mean()
        logv[t] += b22 * logv[t - 22 : t].mean() + e[t]
    return candles_from_variances(np.exp(logv[22:]), rng.standard_normal((n, steps)))


def garch_candles(
    n: int, rng: np.random.Generator, omega: float = 1e-5, alpha: float = 0.15, beta: float = 0.8, steps: int = 24
) -> pd.DataFrame:
    """Candles of a GARCH(1,1): day t walks Brownian sub-steps with its conditional variance (so
    its range carries that variance), and the next variance follows the day's close-to-close return."""
    unit = rng.standard_normal((n, steps))
    var, days = omega / (1 - alpha - beta), np.empty(n)
    for t in range(n):
        days[t] = var
        r2 = var * unit[t].sum() ** 2 / steps
        var = omega + alpha * r2 + beta * var
    return candles_from_variances(days, unit)


def split_series(frames: list[pd.DataFrame], train_frac: float = 0.6, purge: int = 50) -> list[AssetSeries]:
    """One AssetSeries per candle frame: train, a purge gap, then test."""
    out = []
    for k, frame in enumerate(frames):
        n_train = int(len(frame) * train_frac)
        out.append(AssetSeries(f"A{k}", "synthetic", frame, range(0, n_train), range(n_train + purge, len(frame))))
    return out
