"""The signal backtest against hand-computed returns, costs, turnover and hit rate."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from common.evaluation.backtest import backtest, decile_positions, periods_per_year, signal_positions

DATES = pd.date_range("2020-01-06", periods=3, freq="W-MON", tz="UTC")


def test_one_asset_by_hand():
    pos = pd.DataFrame({"A": [1.0, -1.0, 1.0]}, index=DATES)
    r = pd.DataFrame({"A": np.log([1.1, 0.9, 1.05])}, index=DATES)
    out = backtest(pos, r, cost_bp=10, annualization=52, n_boot=50)
    # gross 0.1, +0.1 (short a -10% move), 0.05; turnover 1 (entry), 2, 2 at 10 bp per side
    net = np.array([0.1 - 0.001, 0.1 - 0.002, 0.05 - 0.002])
    assert out["equity"] == pytest.approx(np.cumprod(1 + net).tolist())
    assert out["turnover"] == pytest.approx(5 / 3)
    assert out["hit_rate"] == 1.0 and out["max_drawdown"] == 0.0 and out["periods"] == 3
    assert out["sharpe"] == pytest.approx(net.mean() / net.std(ddof=1) * math.sqrt(52))
    assert out["annual_return"] == pytest.approx(np.prod(1 + net) ** (52 / 3) - 1)


def test_equal_weight_and_assets_not_held():
    pos = pd.DataFrame({"A": [1.0, 1.0], "B": [-1.0, np.nan]}, index=DATES[:2])
    r = pd.DataFrame({"A": np.log([1.02, 0.99]), "B": np.log([1.04, 1.5])}, index=DATES[:2])
    out = backtest(pos, r, cost_bp=0, annualization=52, n_boot=20)
    # date 1: half long A (+2%), half short B (-4%); date 2: B not held, all in A (-1%)
    assert out["equity"] == pytest.approx([1 + 0.5 * 0.02 - 0.5 * 0.04, (1 - 0.01) * (1 + 0.5 * 0.02 - 0.5 * 0.04)])
    assert out["hit_rate"] == pytest.approx(1 / 3)  # A right on date 1, B wrong, A wrong on date 2
    assert out["max_drawdown"] == pytest.approx(-(1 - (1 - 0.01) * (1 - 0.01)), rel=1e-9)


def test_a_closed_market_day_costs_nothing():
    # B has no origin on date 2 (a holiday there): it keeps its weight, nothing is traded for it
    pos = pd.DataFrame({"A": [1.0, 1.0, 1.0], "B": [1.0, np.nan, 1.0]}, index=DATES)
    r = pd.DataFrame({"A": [0.0, 0.0, 0.0], "B": [0.0, np.nan, 0.0]}, index=DATES)
    out = backtest(pos, r, cost_bp=10, annualization=52, n_boot=20)
    # entry: 1 (A 0.5, B 0.5); date 2: A goes to weight 1 (+0.5), B carried; date 3: A back to 0.5
    assert out["turnover"] == pytest.approx((1.0 + 0.5 + 0.5) / 3)


def test_sharpe_interval_brackets_a_steady_winner():
    dates = pd.date_range("2020-01-01", periods=200, freq="D", tz="UTC")
    r = np.random.default_rng(0).normal(0.002, 0.01, 200)
    out = backtest(pd.DataFrame({"A": np.ones(200)}, index=dates), pd.DataFrame({"A": r}, index=dates), cost_bp=0)
    lo, hi = out["sharpe_ci95"]
    assert lo < out["sharpe"] < hi and lo > 0
    assert out["periods_per_year"] == pytest.approx(199 / (199 / 365.25))


def test_signal_rules_and_bad_input():
    assert signal_positions(np.array([0.2, -0.1, 0.0]), None).tolist() == [1.0, -1.0, 0.0]
    assert signal_positions(None, np.array([0.9, 0.25, 0.5]), "prob") == pytest.approx([0.8, -0.5, 0.0])
    with pytest.raises(ValueError, match="signal rule"):
        signal_positions(np.zeros(1), np.zeros(1), "kelly")
    with pytest.raises(ValueError, match="same dates"):
        backtest(pd.DataFrame({"A": [1.0]}, index=DATES[:1]), pd.DataFrame({"B": [0.0]}, index=DATES[:1]))
    assert periods_per_year(pd.DatetimeIndex(DATES[:1])) == 1.0


def test_decile_positions_go_long_the_top_tenth_and_short_the_bottom():
    dates = np.array([0] * 20 + [1] * 3 + [2])
    signal = np.concatenate([np.arange(20.0), [0.5, np.nan, -0.5], [1.0]])
    pos = decile_positions(dates, signal)
    assert pos[:20].tolist() == [-1, -1] + [0] * 16 + [1, 1]  # 20 assets: 2 a side
    assert pos[20:23].tolist() == [1, 0, -1]  # a NaN signal ranks nowhere; 2 ranked: 1 a side
    assert pos[23] == 0  # one asset: no spread to trade
