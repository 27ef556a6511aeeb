"""The HAR-family baselines: the range variance, the recursion, the intraday hour factors, and
that on a HAR process they judge at least as well as GARCH (and not on a GARCH process)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from common.evaluation.asset_series import fit_price_baselines
from common.evaluation.har_baselines import HarFit, HarParams, HarRange, range_variance
from common.evaluation.scorecard import ScorecardSettings, make_scorecard
from common.forecasting.forecast_io import History

from scorecard_helpers import candles_from_returns, candles_from_variances, garch_candles, log_har_candles, split_series


def test_range_variance_is_garman_klass_plus_the_gap():
    frame = pd.DataFrame(
        {
            "open": [100, 101, np.nan, 99],
            "high": [102, 104, np.nan, 103],
            "low": [99, 100, np.nan, 98],
            "close": [101, 102, np.nan, 100],
        },
        index=pd.date_range("2020-01-01", periods=4, freq="D", tz="UTC"),
    )
    proxy, r, index = range_variance(frame)
    gk = lambda o, h, lo, c: 0.5 * math.log(h / lo) ** 2 - (2 * math.log(2) - 1) * math.log(c / o) ** 2  # noqa: E731
    assert len(index) == 3  # the gap row is skipped; the next candle's gap is from the last valid close
    assert proxy == pytest.approx(
        [
            gk(100, 102, 99, 101),
            gk(101, 104, 100, 102) + math.log(101 / 101) ** 2,
            gk(99, 103, 98, 100) + math.log(99 / 102) ** 2,
        ]
    )
    assert r == pytest.approx([0.0, math.log(102 / 101), math.log(100 / 102)])
    flat = candles_from_returns(np.array([0.01, -0.02]))  # no range: the squared return
    assert range_variance(flat)[0] == pytest.approx([0.0, 1e-4, 4e-4])


def test_variances_follow_the_har_recursion():
    p = HarParams((1e-5, 0.4, 0.3, 0.2), False, 1.0, 1e-12, 1e-4, None, np.array([-1.0, 1.0]))
    x = np.random.default_rng(0).uniform(1e-5, 3e-4, 40)
    r = np.sqrt(x)  # flat candles: the proxy is the squared return
    past = list(x[-22:])
    expected = []
    for _ in range(3):
        f = 1e-5 + 0.4 * past[-1] + 0.3 * np.mean(past[-5:]) + 0.2 * np.mean(past[-22:])
        past.append(f)
        expected.append(f)
    har = HarRange({"A": p}, False, "1d")
    assert har.variances(candles_from_returns(r), p, 3) == pytest.approx(expected)
    paths = har([History("A", candles_from_returns(r))], 3, 4000, seed=1)
    steps = np.diff(paths, axis=2, prepend=0.0)  # each step: +-1 draw times its forecast volatility
    assert np.allclose(np.abs(steps), np.sqrt(expected)) and abs(steps.mean()) < 1e-3


def test_the_fit_reads_the_train_split_only_and_short_series_fall_back():
    rng = np.random.default_rng(0)
    series = split_series([log_har_candles(600, rng), log_har_candles(150, rng)])
    before = fit_price_baselines(series, "1d")
    series[0].candles.iloc[series[0].test.start :, :4] *= 3.0  # a different test split: the same fit
    after = fit_price_baselines(series, "1d")
    for name in ("har", "log_har"):
        assert after[name].params["A0"].coef == before[name].params["A0"].coef
        assert before[name].fallback == ["A1"]  # 90 train candles: the 22-candle mean
    assert before["log_har"].params["A0"].log and before["log_har"].params["A0"].smear > 1
    # the fallback forecasts the mean proxy, of the history it has when that is under 22 candles
    flat = candles_from_returns(np.array([0.01, -0.03, 0.02]))
    var = before["har"].variances(flat, before["har"].params["A1"], 2)
    assert var == pytest.approx([(1e-4 + 9e-4 + 4e-4) / 3] * 2)


def test_intraday_hours_are_divided_out_and_forecast_back():
    rng = np.random.default_rng(1)
    n = 24 * 120
    loud = np.arange(n) % 24 < 8  # the first 8 hours of the day carry 4x the variance
    frame = candles_from_variances(np.where(loud, 4e-6, 1e-6), rng.standard_normal((n, 12)))
    frame.index = pd.date_range("2021-01-01", periods=n, freq="h", tz="UTC", name="timestamp")
    fit = HarFit("1h")
    fit.add("A", frame)
    p = fit.baselines()["har"].params["A"]
    assert p.season is not None and p.season[:8].mean() / p.season[8:].mean() == pytest.approx(4, rel=0.15)
    # the last candle is 23:00: the next 24 candles are 00:00-23:00
    var = fit.baselines()["har"].variances(frame.iloc[-200:], p, 24)
    assert var[:8].mean() / var[8:].mean() == pytest.approx(4, rel=0.2)


def _card(frames: list[pd.DataFrame]) -> dict:
    series = split_series(frames)
    baselines = fit_price_baselines(series, "1d")
    return make_scorecard(
        series,
        baselines["rw_ewma"],
        ScorecardSettings(interval="1d", horizons=(1,), stride=1, n_samples=200, n_boot=100),
        baselines={k: baselines[k] for k in ("garch", "har", "log_har")},
    )["horizons"]["1"]


def test_on_a_har_process_har_is_not_worse_than_garch_and_covers():
    rng = np.random.default_rng(0)
    hc = _card([log_har_candles(1500, rng) for _ in range(2)])
    for name in ("har", "log_har"):
        assert hc["crps"][name] <= hc["crps"]["garch"] * 1.002, hc["crps"]
        assert 0.85 <= hc["coverage"][name]["90"] <= 0.95, hc["coverage"]
    assert min(hc["crps"]["har"], hc["crps"]["log_har"]) < hc["crps"]["garch"]


def test_on_a_garch_process_garch_stays_ahead_or_level():
    rng = np.random.default_rng(0)
    hc = _card([garch_candles(1500, rng) for _ in range(2)])
    for name in ("har", "log_har"):
        assert hc["crps"]["garch"] <= hc["crps"][name] * 1.002, hc["crps"]
