"""The end-of-training scorecard's forecast budget (walk_forward.within_budget): at most `budget`
(asset, origin) forecasts, assets drawn per origin date, whatever the universe's size."""

from __future__ import annotations

import numpy as np
import pytest

from common.errors import UserError
from common.evaluation.price_baselines import RandomWalkEWMA
from common.evaluation.scorecard import ScorecardSettings, make_scorecard
from common.evaluation.walk_forward import Origins, within_budget

from scorecard_helpers import garch_returns, synthetic_series


def _grid(n_dates: int, n_assets: int) -> Origins:
    """Every asset on every date, in asset order (as all_origins builds them)."""
    series = np.repeat(np.arange(n_assets), n_dates)
    index = np.tile(np.arange(n_dates), n_assets) + 100
    y = np.arange(n_dates * n_assets, dtype=float)
    return Origins(series, index, index.astype(np.int64) * 86_400 * 10**9, {1: y, 5: -y})


def test_over_the_budget_each_date_draws_its_own_assets():
    o = _grid(30, 40)
    kept, stride, line = within_budget(o, 90, stride=5, seed=1)
    assert len(kept.index) == 90 and stride == 5 and "1200 forecasts over the budget of 90" in line
    per_date = [kept.series[kept.dates == d] for d in np.unique(o.dates)]
    assert all(len(a) == 3 and len(set(a)) == 3 for a in per_date)  # 90 // 30 distinct assets on every date
    assert len({tuple(sorted(a)) for a in per_date}) > 1  # drawn per date, not one fixed subset
    # the rows stay whole: each kept origin's targets are its own
    flat = kept.series * 30 + (kept.index - 100)
    assert (kept.y[1] == o.y[1][flat]).all() and (kept.y[5] == o.y[5][flat]).all()
    again, _, _ = within_budget(o, 90, stride=5, seed=1)
    assert (again.series == kept.series).all()  # seeded
    other, _, _ = within_budget(o, 90, stride=5, seed=2)
    assert not (other.series == kept.series).all()


def test_fewer_forecasts_than_dates_spread_one_asset_over_fewer_dates():
    kept, stride, line = within_budget(_grid(30, 4), 10, stride=5, seed=0)
    assert len(kept.index) == 10 and len(np.unique(kept.dates)) == 10 and stride == 15
    assert line is not None


def test_within_the_budget_nothing_changes():
    o = _grid(10, 3)
    kept, stride, line = within_budget(o, 30, stride=2, seed=0)
    assert kept is o and stride == 2 and line is None
    with pytest.raises(UserError, match="at least 1"):
        within_budget(o, 0, stride=2, seed=0)


def test_the_cost_of_a_card_stays_within_its_budget_as_the_universe_grows():
    rng = np.random.default_rng(0)
    calls = []

    def counted(histories, horizon, n_samples, seed):
        calls.append(len(histories))
        return RandomWalkEWMA(0.94)(histories, horizon, n_samples, seed)

    for n_assets in (2, 12):  # 16 forecasts: all of them; 96: 16 drawn
        calls.clear()
        series = synthetic_series([garch_returns(400, rng) for _ in range(n_assets)])
        said = []
        card = make_scorecard(
            series,
            counted,
            ScorecardSettings(
                interval="1d", horizons=[1, 5], stride=None, n_origins=8, n_samples=8, n_boot=20, budget=16
            ),
            baselines={"rw_ewma": RandomWalkEWMA(0.94)},
            progress=said.append,
        )
        assert sum(calls) <= 16 and card["horizons"]["1"]["n"] <= 16
        assert (card["origins"]["drawn"] is None) == (n_assets * 8 <= 16)
        assert (card["origins"]["drawn"] in said) or card["origins"]["drawn"] is None


def test_a_card_on_microsecond_candles_has_real_dates_and_draws(tmp_path):
    """Frames indexed in microseconds (pandas' date_range default): the origins' dates stay int64 ns,
    so the backtest's dates are the candles' (not 1970) and scorecard.png draws at stride 1."""
    from common.evaluation.scorecard import write_scorecard

    rng = np.random.default_rng(1)
    series = synthetic_series([garch_returns(300, rng) for _ in range(2)])
    series[0].candles.index = series[0].candles.index.as_unit("us")
    series[1].candles.index = series[1].candles.index.as_unit("us")
    card = make_scorecard(
        series,
        RandomWalkEWMA(0.94),
        ScorecardSettings(interval="1d", horizons=[1, 5], stride=1, n_samples=8, n_boot=20),
        baselines={"rw_ewma": RandomWalkEWMA(0.94)},
    )
    first = card["backtest"]["strategies"]["model"]["dates"][0]
    assert first[:4] == str(series[0].candles.index[series[0].test.start].year)
    card["horizons"]["1"]["coverage_calibrated"] = {"50": 0.5, "80": 0.8, "90": 0.9}  # drawn beside the raw
    card["barrier_lines"] = ["Barrier +5.0%/-3.0% at H=5 (n=10): Brier model 0.500"]
    _, png = write_scorecard(card, tmp_path)
    assert png.stat().st_size > 0


def test_under_a_budget_only_the_assets_drawn_are_fitted_and_the_card_is_the_same(monkeypatch):
    """Each asset's GARCH and HAR fit is its own: fitting only the assets with an origin to forecast
    (not the whole universe) leaves every score as it was with all of them fitted."""
    import common.evaluation.scorecard as scorecard_module
    from common.evaluation.asset_series import fit_price_baselines

    rng = np.random.default_rng(3)
    series = synthetic_series([garch_returns(400, rng) for _ in range(12)])
    settings = ScorecardSettings(
        interval="1d", horizons=[1, 5], stride=None, n_origins=3, n_samples=8, n_boot=20, budget=6
    )
    fitted: list[list[str]] = []

    def spy(chosen, interval):
        fitted.append([s.symbol for s in chosen])
        return fit_price_baselines(chosen, interval)

    monkeypatch.setattr(scorecard_module, "fit_price_baselines", spy)
    keep: dict = {}
    card = make_scorecard(series, RandomWalkEWMA(0.94), settings, keep=keep)
    drawn = {series[k].symbol for k in keep["origins"].series}
    assert len(fitted) == 1 and set(fitted[0]) == drawn and len(drawn) < len(series)
    everyone = make_scorecard(series, RandomWalkEWMA(0.94), settings, baselines=fit_price_baselines(series, "1d"))
    for h in ("1", "5"):
        assert card["horizons"][h]["crps"] == everyone["horizons"][h]["crps"]
