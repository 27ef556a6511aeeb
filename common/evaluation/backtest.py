"""A cost-aware signal backtest: one position per asset per origin date, equal weight.

    positions (dates x assets, in [-1, 1], NaN = not held) ──► weights pos / n_assets(date)
    net return(date) = sum_a w_a * (exp(r_a) - 1) - cost_bp / 1e4 * sum_a |w_a - w_a(prev date)|

`r_a` is the asset's log return from this origin date to its next one (the holding period), so
each position is entered at an origin's close and held to the next origin's close. Costs are in
basis points per side: going from +1 to -1 pays twice. Turnover is sum |delta w| per period; an
asset absent on a date (its market closed) keeps its last weight there, so it pays nothing.

Statistics come from `empyrical-reloaded` (annual return, Sharpe, max drawdown) with the
annualization taken from the dates themselves (periods per year); the Sharpe's 95% interval is
a circular block bootstrap over consecutive periods. Hit rate: the share of held positions
(pos != 0) whose sign matches the realized return's (zero returns left out).
"""

from __future__ import annotations

from typing import Optional

import empyrical
import numpy as np
import pandas as pd

from common.evaluation.metrics import block_bootstrap_indices

__all__ = ["DEFAULT_COST_BP", "backtest", "decile_positions", "periods_per_year", "signal_positions"]

DEFAULT_COST_BP = 10.0
_YEAR = pd.Timedelta(days=365.25)


def signal_positions(mean: np.ndarray, p_up: np.ndarray, rule: str = "sign") -> np.ndarray:
    """Positions from forecasts: "sign" = sign(mean); "prob" = 2 (P(up) - 0.5), clipped to [-1, 1]."""
    if rule == "sign":
        return np.sign(np.asarray(mean, dtype=np.float64))
    if rule == "prob":
        return np.clip(2 * (np.asarray(p_up, dtype=np.float64) - 0.5), -1.0, 1.0)
    raise ValueError(f"signal rule {rule!r}: expected 'sign' or 'prob'")


def decile_positions(dates: np.ndarray, signal: np.ndarray) -> np.ndarray:
    """Long-short decile positions: per date, +1 for the top tenth of the assets by signal and -1
    for the bottom tenth (at least one each, with 2 assets or more; NaN signals rank nowhere),
    0 for the rest. Weighted by 1 / assets held, as every strategy here, the gross exposure is
    about 0.2: the Sharpe does not depend on it, the annual return does."""
    signal = np.asarray(signal, dtype=np.float64)
    pos = np.zeros(len(signal))
    dates = np.asarray(dates)
    for d in np.unique(dates):
        rows = np.flatnonzero((dates == d) & np.isfinite(signal))
        if len(rows) < 2:
            continue
        k = max(1, len(rows) // 10)
        order = rows[np.argsort(signal[rows], kind="stable")]
        pos[order[:k]], pos[order[-k:]] = -1.0, 1.0
    return pos


def periods_per_year(dates: pd.DatetimeIndex) -> float:
    """Rebalancing periods per year, measured from the dates (n - 1 periods over their span)."""
    if len(dates) < 2:
        return 1.0
    span = (dates[-1] - dates[0]) / _YEAR
    return float((len(dates) - 1) / span) if span > 0 else 1.0


def backtest(
    positions: pd.DataFrame,
    log_returns: pd.DataFrame,
    cost_bp: float = DEFAULT_COST_BP,
    annualization: Optional[float] = None,
    n_boot: int = 1000,
    seed: int = 0,
) -> dict:
    """Statistics and the equity curve of one strategy.

    positions, log_returns: dates x assets (same labels); positions in [-1, 1], NaN where an asset
    has no origin that date; log_returns over each holding period (NaN where not held).
    """
    if not positions.index.equals(log_returns.index) or not positions.columns.equals(log_returns.columns):
        raise ValueError("positions and log_returns must have the same dates and assets")
    pos = positions.to_numpy(dtype=np.float64)
    held = np.isfinite(pos) & np.isfinite(log_returns.to_numpy(dtype=np.float64))
    pos = np.where(held, pos, 0.0)
    r = np.where(held, log_returns.to_numpy(dtype=np.float64), 0.0)
    n_assets = held.sum(1, keepdims=True)
    weights = np.divide(pos, n_assets, out=np.zeros_like(pos), where=n_assets > 0)
    # an asset with no origin on a date (another market's holiday) keeps its last weight for
    # the turnover: skipping a date is not selling and buying back
    carried = pd.DataFrame(np.where(held, weights, np.nan)).ffill().fillna(0.0).to_numpy()
    turnover = np.abs(np.diff(carried, axis=0, prepend=0.0)).sum(1)
    net = (weights * np.expm1(r)).sum(1) - cost_bp / 1e4 * turnover

    ppy = annualization or periods_per_year(pd.DatetimeIndex(positions.index))
    sharpe = _finite(empyrical.sharpe_ratio(net, annualization=ppy))
    lo = hi = None
    if len(net) >= 3:
        idx = block_bootstrap_indices(len(net), max(1, round(len(net) ** (1 / 3))), n_boot, np.random.default_rng(seed))
        boots = np.asarray(empyrical.sharpe_ratio(net[idx].T, annualization=ppy), dtype=np.float64)
        boots = boots[np.isfinite(boots)]
        if len(boots):
            lo, hi = (float(x) for x in np.percentile(boots, [2.5, 97.5]))
    taken = held & (pos != 0) & (r != 0)
    hits = int((np.sign(pos[taken]) == np.sign(r[taken])).sum())
    equity = np.cumprod(1 + net)
    return {
        "annual_return": _finite(empyrical.annual_return(net, annualization=ppy)),
        "sharpe": sharpe,
        "sharpe_ci95": [lo, hi],
        "max_drawdown": _finite(empyrical.max_drawdown(net)),
        "turnover": float(turnover.mean()) if len(turnover) else 0.0,  # per period
        "hit_rate": hits / int(taken.sum()) if taken.any() else None,
        "periods": int(len(net)),
        "periods_per_year": ppy,
        "cost_bp": float(cost_bp),
        "equity": equity.tolist(),
        "dates": [str(d) for d in positions.index],
    }


def _finite(x: object) -> Optional[float]:
    x = float(np.asarray(x, dtype=np.float64))
    return x if np.isfinite(x) else None
