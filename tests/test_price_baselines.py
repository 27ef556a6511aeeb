"""The price-space baselines: hand-checked recursions, train-only GARCH fits, sample scales."""

from __future__ import annotations

import math

import numpy as np
import pytest

from common.evaluation.price_baselines import (
    GarchParams,
    GarchT,
    HistoricalBootstrap,
    RandomWalkEWMA,
    ewma_lambda,
    log_returns,
    momentum_signal,
)
from common.forecasting.forecast_io import History

from scorecard_helpers import candles_from_returns, garch_returns


def _history(r: np.ndarray) -> History:
    return History("A", candles_from_returns(r))


def test_log_returns_skip_missing_closes():
    frame = candles_from_returns(np.array([0.1, 0.2, -0.05]))
    frame.iloc[2, :] = np.nan  # a gap row: the next return is measured from the last valid close
    assert log_returns(frame) == pytest.approx([0.1, 0.15])


def test_ewma_lambda_keeps_the_calendar_half_life():
    assert ewma_lambda("1d") == pytest.approx(0.94)
    assert ewma_lambda("1h") == pytest.approx(0.94 ** (1 / 24))


def test_rw_ewma_variance_is_the_riskmetrics_recursion():
    r = np.random.default_rng(0).normal(0, 0.01, 300)
    lam, var = 0.94, np.mean(r[:20] ** 2)
    for x in r:
        var = lam * var + (1 - lam) * x * x
    paths = RandomWalkEWMA(lam)([_history(r)], 4, 40000, seed=1)
    assert paths.shape == (1, 40000, 4)
    for h in (1, 4):  # the h-step return of a path: variance h sigma^2
        assert paths[..., h - 1].std() == pytest.approx(math.sqrt(h * var), rel=0.02)
    assert abs(paths[..., -1].mean()) < 5 * math.sqrt(4 * var / 40000)


def test_bootstrap_draws_only_from_the_last_250_returns():
    r = np.concatenate([np.full(500, 0.5), np.where(np.arange(250) % 2, 0.01, 0.02)])
    h1 = HistoricalBootstrap()([_history(r)], 1, 1000, seed=0)
    assert set(np.round(h1.ravel(), 12)) == {0.01, 0.02}  # never the older 0.5 returns
    h3 = HistoricalBootstrap()([_history(r)], 3, 1000, seed=0)
    steps = np.diff(h3, axis=2, prepend=0.0)  # each step of a path is one drawn return
    assert h3.shape == (1, 1000, 3) and set(np.round(steps.ravel(), 12)) == {0.01, 0.02}
    assert h3[..., -1].min() >= 0.03 - 1e-12 and h3[..., -1].max() <= 0.06 + 1e-12


def test_garch_fit_recovers_the_generating_parameters():
    r = garch_returns(4000, np.random.default_rng(3), omega=2e-5, alpha=0.1, beta=0.8, nu=5)
    p = GarchT.fit({"A": r}).params["A"]
    assert p.alpha == pytest.approx(0.1, abs=0.05) and p.beta == pytest.approx(0.8, abs=0.08)
    assert 3 < p.nu < 9 and p.omega / (1 - p.alpha - p.beta) == pytest.approx(2e-5 / 0.1, rel=0.25)


def test_garch_short_train_falls_back_to_riskmetrics():
    g = GarchT.fit({"short": np.random.default_rng(0).normal(0, 0.01, 100)})
    assert g.fallback == ["short"] and g.params["short"] == GarchParams(0.0, 1 - 0.94, 0.94, 1e6)


def test_garch_samples_follow_the_filtered_variance():
    p = GarchParams(omega=1e-5, alpha=0.1, beta=0.85, nu=6.0)
    r = np.random.default_rng(1).normal(0, 0.01, 200)
    var = p.omega / (1 - p.alpha - p.beta)
    for x in r:
        var = p.omega + p.alpha * x * x + p.beta * var
    g = GarchT({"A": p}, p)
    paths = g([_history(r)], 2, 40000, seed=2)
    assert paths.shape == (1, 40000, 2) and paths[..., 0].var() == pytest.approx(var, rel=0.05)
    # two steps: var + (omega + (alpha + beta) var), the expected variance of the second step
    assert paths[..., 1].var() == pytest.approx(var + p.omega + (p.alpha + p.beta) * var, rel=0.06)
    # a batch mixing a fitted asset and one on the normal IGARCH fallback: each row its own model
    fallback = GarchParams(0.0, 0.06, 0.94, 1e6)
    mixed = GarchT({"A": p}, fallback)([_history(r), History("B", candles_from_returns(r))], 1, 40000, seed=3)
    assert mixed[0, :, 0].var() == pytest.approx(var, rel=0.05)
    assert mixed[1, :, 0].var() == pytest.approx(GarchT._next_variance(r, fallback), rel=0.05)
    kurtosis = lambda x: ((x - x.mean()) ** 4).mean() / x.var() ** 2  # noqa: E731
    assert kurtosis(mixed[0, :, 0]) > 4 and kurtosis(mixed[1, :, 0]) == pytest.approx(3, abs=0.2)  # t(6) vs normal


def test_momentum_signal_reads_the_last_20_returns():
    up = np.concatenate([np.full(30, -0.01), np.full(20, 0.01)])
    assert momentum_signal(_history(up)) == 1.0
    assert momentum_signal(_history(-up)) == -1.0
    assert momentum_signal(_history(np.full(10, 0.01))) == 0.0  # not enough history
