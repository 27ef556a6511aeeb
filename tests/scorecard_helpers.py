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
