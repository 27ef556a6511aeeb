"""The cross-section judged: factor rank ICs beside the model's, and the model's edge over the best."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from common.evaluation.backtest import backtest, decile_positions
from common.evaluation.factors import factor_card, factor_signals
from common.evaluation.price_baselines import HistoricalBootstrap, log_returns
from common.evaluation.scorecard import ScorecardSettings, make_scorecard
from common.evaluation.walk_forward import all_origins, origin_indices

from scorecard_helpers import candles_from_returns, synthetic_series


def _cross_section(seed: int, reversal: float, n_assets: int = 30, n_days: int = 400) -> list[np.ndarray]:
    """Returns with r_t+1 = -reversal * r_t + noise, per asset (a planted short-term reversal)."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n_assets):
        e = rng.normal(0, 0.01, n_days)
        r = np.empty(n_days)
        r[0] = e[0]
        for t in range(1, n_days):
            r[t] = -reversal * r[t - 1] + e[t]
        out.append(r)
    return out


def _factor_card(returns: list[np.ndarray], model_mean=None) -> dict:
    series = synthetic_series(returns, train_frac=0.3, purge=5)
    origins, step = origin_indices(series, stride=1)
    o = all_origins(series, origins, [1])
    mean = model_mean(series, o) if model_mean else np.zeros(len(o.index))
    return factor_card(o.dates, o.y[1], mean, factor_signals(series, o), 1, step)


def test_factor_signals_read_the_candles_up_to_the_origin_only():
    r = np.random.default_rng(0).normal(0, 0.01, 300)
    frame = candles_from_returns(r)
    frame["high"], frame["low"] = frame["close"] * 1.01, frame["close"] * 0.97  # close 3/4 up the range
    series = synthetic_series([r])
    series[0].candles = frame
    origins, _ = origin_indices(series, stride=7)
    o = all_origins(series, origins, [1])
    sig = factor_signals(series, o)
    for j, i in enumerate(o.index[:5]):
        past = log_returns(frame.iloc[: i + 1])  # everything up to the origin
        assert sig["reversal"][j] == pytest.approx(-past[-1])
        assert sig["momentum20"][j] == pytest.approx(past[-21:-1].sum())
        assert sig["low_vol"][j] == pytest.approx(-past[-20:].std())
        assert sig["range_reversal"][j] == pytest.approx(-((1 / 0.97 - 1) / (1.01 / 0.97 - 1) - 0.5))
    assert np.isnan(sig["momentum250"][0]) == (np.searchsorted(np.arange(301), o.index[0]) < 251)


def test_a_planted_reversal_is_found_and_a_forecaster_that_knows_it_has_no_edge_over_it():
    returns = _cross_section(0, reversal=0.25)

    def knows(series, o):  # model-free: the planted rule itself, read with a little noise
        last = np.array([log_returns(series[k].candles.iloc[: i + 1])[-1] for k, i in zip(o.series, o.index)])
        return -0.25 * last + np.random.default_rng(1).normal(0, 0.0005, len(last))

    card = _factor_card(returns, knows)
    rev = card["factors"]["reversal"]
    assert rev["mean"] > 0.1 and rev["t_nw"] > 2
    assert card["edge"]["best_factor"] == "reversal" and abs(card["edge"]["t_nw"]) < 2


def test_on_noise_no_factor_ranks():
    small, tested, reversal = 0, 0, 0
    for seed in range(4):
        card = _factor_card(_cross_section(seed, reversal=0.0, n_days=250))
        ts = [f["t_nw"] for f in card["factors"].values() if f is not None]
        small, tested = small + sum(abs(t) < 2 for t in ts), tested + len(ts)
        reversal += abs(card["factors"]["reversal"]["t_nw"]) < 2
    # flat candles have no range, and 250 days no 250-candle momentum: 3 factors a seed
    assert tested == 12 and small >= 10 and reversal >= 3


def test_the_card_carries_the_cross_section_and_its_line():
    rng = np.random.default_rng(1)
    series = synthetic_series([rng.normal(0, 0.01, 400) for _ in range(6)], train_frac=0.4, purge=5)
    card = make_scorecard(
        series,
        HistoricalBootstrap(),
        ScorecardSettings(interval="1d", horizons=[1], stride=2, n_samples=20, n_boot=50),
        baselines={"bootstrap": HistoricalBootstrap(window=50)},
    )
    cs = card["horizons"]["1"]["cross_section"]
    assert set(cs["factors"]) == {"reversal", "range_reversal", "momentum20", "momentum250", "low_vol"}
    assert cs["model_p_up"]["n_dates"] > 10 and -1 <= cs["model_p_up"]["mean"] <= 1  # P(up) ranked too
    assert cs["edge"]["n_dates"] > 10 and card["cross_section_lines"][0].startswith("Rank IC at H=1: model ")


def test_the_reversal_decile_portfolio_earns_the_planted_reversal():
    series = synthetic_series(_cross_section(2, reversal=0.25), train_frac=0.3, purge=5)
    o = all_origins(series, origin_indices(series, stride=1)[0], [1])
    frame = pd.DataFrame(
        {
            "date": pd.to_datetime(o.dates, utc=True),
            "symbol": o.series,
            "r": o.y[1],  # held one candle: to the next origin
            "pos": decile_positions(o.dates, factor_signals(series, o)["reversal"]),
        }
    )
    wide = lambda col: frame.pivot(index="date", columns="symbol", values=col)  # noqa: E731
    planted = backtest(wide("pos"), wide("r"), cost_bp=0.0, n_boot=50)
    shuffled = backtest(
        wide("pos").sample(frac=1.0, random_state=0).set_axis(wide("r").index), wide("r"), 0.0, n_boot=50
    )
    assert planted["sharpe"] > 3 and planted["hit_rate"] > 0.55 and abs(shuffled["sharpe"]) < planted["sharpe"] / 2
