"""Price-space baselines: forecasters of the H-step log return that every model is scored beside.

A forecaster is any callable `forecast_fn(histories, horizon, n_samples, seed)` returning
sampled paths: an (len(histories), n_samples, horizon) array whose [:, :, h - 1] is the log
return from the origin's close to the close h bars later (so one call at the longest horizon
serves every shorter one; a 2-D (len(histories), n_samples) array of H-step log returns is
accepted too, and then the scorecard calls once per horizon). The histories are
the Forecaster's own `common.forecasting.forecast_io.History` (symbol, candles): the scorecard builds each from
a COPY of one asset's candles up to and including its origin candle, and nothing else, so no
forecaster (these baselines or the model) can see a later candle.

- RandomWalkEWMA: zero drift, Gaussian, variance H * sigma^2 with sigma^2 the RiskMetrics EWMA
  of squared log returns (lambda 0.94 for daily bars; other bar lengths keep the same ~11-day
  half-life in calendar time, lambda = 0.94 ** (bar / 1 day): 0.9974 for 1h bars).
- HistoricalBootstrap: the sum of H draws, with replacement, from the asset's last 250 returns.
- GarchT: zero-mean GARCH(1,1) with standardized Student-t innovations, fitted per asset with
  the `arch` package on the TRAIN split's returns only; at each origin the variance is filtered
  through the history with those fixed parameters and H-step paths are simulated. An asset with
  fewer than MIN_GARCH_RETURNS train returns (or a fit that fails) gets the RiskMetrics IGARCH
  parameters (omega 0, alpha 1 - lambda, beta lambda, nu 1e6) and is listed in `fallback`.
- always-up (direction only) and the 20-period momentum rule (backtest) need no samples:
  `momentum_signal` reads the same histories.

Returns between valid closes only: NaN rows (the gaps of 24/7 markets) are skipped.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Iterable, Mapping, Protocol, Sequence

import numpy as np
import pandas as pd
from scipy.signal import lfilter

from common.forecasting.forecast_io import History
from common.markets import interval_step

__all__ = [
    "BOOTSTRAP_WINDOW",
    "GarchT",
    "HistoricalBootstrap",
    "ForecastFn",
    "MIN_GARCH_RETURNS",
    "RandomWalkEWMA",
    "ewma_lambda",
    "log_returns",
    "momentum_signal",
]

BOOTSTRAP_WINDOW = 250
MIN_GARCH_RETURNS = 250
RISKMETRICS_DAILY_LAMBDA = 0.94
_VAR_FLOOR = 1e-12  # a series that never moved still gets a positive variance


class ForecastFn(Protocol):
    def __call__(self, histories: Sequence[History], horizon: int, n_samples: int, seed: int) -> np.ndarray:
        """(len(histories), n_samples, horizon) cumulative log returns after each origin
        (or (len(histories), n_samples) H-step log returns)."""


def log_returns(candles: pd.DataFrame) -> np.ndarray:
    """Log returns between consecutive valid closes (NaN rows skipped)."""
    close = candles["close"].to_numpy(dtype=np.float64)
    close = close[np.isfinite(close) & (close > 0)]
    return np.diff(np.log(close))


def ewma_lambda(interval: str) -> float:
    """RiskMetrics lambda for a bar length: 0.94 daily, the same calendar half-life otherwise."""

    return RISKMETRICS_DAILY_LAMBDA ** (interval_step(interval) / pd.Timedelta(days=1))


def _ewma_next_variance(r: np.ndarray, lam: float) -> float:
    """sigma^2 for the bar after the last return: s2_t+1 = lam s2_t + (1 - lam) r_t^2, started at
    the mean square of the first 20 returns."""
    if len(r) == 0:
        return _VAR_FLOOR
    start = float(np.mean(r[:20] ** 2))
    out = lfilter([1 - lam], [1, -lam], r * r, zi=[lam * start])[0]
    return max(float(out[-1]), _VAR_FLOOR)


@dataclass
class RandomWalkEWMA:
    """Zero-drift Gaussian random walk with RiskMetrics EWMA volatility."""

    lam: float = RISKMETRICS_DAILY_LAMBDA
    drift = False  # its mean forecast is 0: no cross-sectional ranking to score

    def __call__(self, histories: Sequence[History], horizon: int, n_samples: int, seed: int) -> np.ndarray:
        sigma = np.sqrt([_ewma_next_variance(log_returns(h.candles), self.lam) for h in histories])
        z = np.random.default_rng(seed).standard_normal((len(histories), n_samples, horizon))
        return np.cumsum(z, axis=2) * sigma[:, None, None]


@dataclass
class HistoricalBootstrap:
    """Sum of H returns drawn with replacement from the asset's last `window` returns."""

    window: int = BOOTSTRAP_WINDOW
    drift = True  # the mean of the window's returns

    def __call__(self, histories: Sequence[History], horizon: int, n_samples: int, seed: int) -> np.ndarray:
        rng = np.random.default_rng(seed)
        out = np.zeros((len(histories), n_samples, horizon))
        for i, h in enumerate(histories):
            r = log_returns(h.candles)[-self.window :]
            if len(r):
                out[i] = np.cumsum(r[rng.integers(0, len(r), size=(n_samples, horizon))], axis=1)
        return out


@dataclass(frozen=True)
class GarchParams:
    omega: float  # log-return units (squared)
    alpha: float
    beta: float
    nu: float  # Student-t degrees of freedom


@dataclass
class GarchT:
    """Zero-mean GARCH(1,1)-t, one parameter set per asset fitted on its train returns."""

    params: dict[str, GarchParams]
    fallback_params: GarchParams
    fallback: list[str] = field(default_factory=list)  # assets that got the IGARCH fallback
    drift = False  # zero mean

    @classmethod
    def fit(
        cls,
        train_returns: Mapping[str, np.ndarray] | Iterable[tuple[str, np.ndarray]],
        lam: float = RISKMETRICS_DAILY_LAMBDA,
    ) -> "GarchT":
        """Fit every asset's GARCH(1,1)-t on its train-split log returns (and nothing later):
        symbol -> returns, or (symbol, returns) pairs made one at a time."""
        from arch import arch_model  # slow to import: only when GARCH is fitted

        fallback_params = GarchParams(0.0, 1 - lam, lam, 1e6)
        params, fallback = {}, []
        pairs = train_returns.items() if isinstance(train_returns, Mapping) else train_returns
        for symbol, r in pairs:
            r = np.asarray(r, dtype=np.float64)
            r = r[np.isfinite(r)]
            fitted = None
            if len(r) >= MIN_GARCH_RETURNS and r.std() > 0:
                # percent returns: the optimizer is tuned for values of order 1
                model = arch_model(100 * r, mean="Zero", vol="GARCH", p=1, q=1, dist="t", rescale=False)
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")  # convergence chatter; checked below
                    res = model.fit(disp="off", show_warning=False)
                p = res.params
                if res.convergence_flag == 0 and np.all(np.isfinite(p.to_numpy())):
                    fitted = GarchParams(
                        float(p["omega"]) / 1e4, float(p["alpha[1]"]), float(p["beta[1]"]), float(p["nu"])
                    )
            if fitted is None:
                fallback.append(symbol)
            params[symbol] = fitted or fallback_params
        return cls(params, fallback_params, fallback)

    def __call__(self, histories: Sequence[History], horizon: int, n_samples: int, seed: int) -> np.ndarray:
        rng = np.random.default_rng(seed)
        ps = [self.params.get(h.symbol, self.fallback_params) for h in histories]
        # every origin of the batch at once: (n, 1) parameter columns against (n, S) paths
        omega, alpha, beta, nu = (
            np.array([getattr(p, k) for p in ps])[:, None] for k in ("omega", "alpha", "beta", "nu")
        )
        var = np.array([self._next_variance(log_returns(h.candles), p) for h, p in zip(histories, ps)])[:, None]
        var = np.repeat(var, n_samples, axis=1)
        out = np.empty((len(histories), n_samples, horizon))
        ret = np.zeros((len(histories), n_samples))
        for step in range(horizon):
            eps = np.sqrt(var) * _standardized_t(rng, nu, n_samples)
            ret = ret + eps
            out[:, :, step] = ret
            var = omega + alpha * eps * eps + beta * var
        return out

    @staticmethod
    def _next_variance(r: np.ndarray, p: GarchParams) -> float:
        """s2_t+1 = omega + alpha r_t^2 + beta s2_t through the history, started at the
        unconditional variance when it exists, else at the first returns' mean square."""
        if len(r) == 0:
            return _VAR_FLOOR
        persistence = p.alpha + p.beta
        start = p.omega / (1 - persistence) if persistence < 1 and p.omega > 0 else float(np.mean(r[:20] ** 2))
        out = lfilter([1.0], [1, -p.beta], p.omega + p.alpha * r * r, zi=[p.beta * start])[0]
        return max(float(out[-1]), _VAR_FLOOR)


def _standardized_t(rng: np.random.Generator, nu: np.ndarray, n: int) -> np.ndarray:
    """(len(nu), n) Student-t draws scaled to unit variance, one row per nu (> 2); a row with a
    huge nu (the IGARCH fallback's 1e6) is normal."""
    nu = np.asarray(nu, dtype=np.float64).reshape(-1, 1)
    normal = nu > 1e4
    df = np.where(normal, 5.0, nu)  # any valid df for the rows replaced by normals below
    t = rng.standard_t(np.broadcast_to(df, (len(df), n))) * np.sqrt((df - 2) / df)
    return np.where(normal, rng.standard_normal((len(df), n)), t)


def momentum_signal(history: History, lookback: int = 20) -> float:
    """sign of the log return over the last `lookback` valid closes (0 without enough history)."""
    r = log_returns(history.candles)
    return float(np.sign(r[-lookback:].sum())) if len(r) >= lookback else 0.0
