"""Volatility reversion: the paths' spread pulled toward the long-run level, fitted on validation only,
applied by every forecast of the run and carried by its exports."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from common.errors import UserError
from common.evaluation.vol_reversion import FIT_HORIZONS, fit_reversion, write_reversion
from common.forecasting.reversion import (
    Reversion,
    load_reversion,
    long_run_variance,
    revert_paths,
    revert_returns,
)
from common.run.files import REVERSION_JSON

from test_calibration import SIGMA, three_way


def test_the_spread_moves_to_the_weighted_target_and_the_centre_stays():
    rng = np.random.default_rng(0)
    x = np.cumsum(rng.normal(0.001, 0.01, (3, 4000, 10)), axis=2)  # (origins, samples, steps)
    v_long = np.array([0.02**2, 0.005**2, np.nan])  # the last origin: no long-run level
    w = Reversion(tau=5.0).weights(10)
    assert w[0] == pytest.approx(1 / 6) and w[9] == pytest.approx(10 / 15)
    out = revert_returns(x, v_long, w)
    k = np.arange(1, 11)
    for i in range(2):
        target = (1 - w) * x[i].var(0) + w * k * v_long[i]
        np.testing.assert_allclose(out[i].var(0), target, rtol=1e-9)
        np.testing.assert_allclose(np.median(out[i], 0), np.median(x[i], 0), atol=1e-12)
    np.testing.assert_array_equal(out[2], x[2])
    assert out[0].var(0)[-1] > x[0].var(0)[-1] and out[1].var(0)[-1] < x[1].var(0)[-1]


def test_reverted_candles_keep_their_gaps_and_wicks():
    rng = np.random.default_rng(1)
    n, s, h = 2, 50, 6
    close = 100 * np.exp(np.concatenate([np.zeros((n, s, 1)), np.cumsum(rng.normal(0, 0.01, (n, s, h)), 2)], 2))
    open_ = close[:, :, :-1] * np.exp(rng.normal(0, 0.002, (n, s, h)))
    high = np.maximum(open_, close[:, :, 1:]) * np.exp(np.abs(rng.normal(0, 0.003, (n, s, h))))
    low = np.minimum(open_, close[:, :, 1:]) * np.exp(-np.abs(rng.normal(0, 0.003, (n, s, h))))
    ohlc = {"open": open_, "high": high, "low": low, "close": close[:, :, 1:]}
    new_close, new = revert_paths(close, ohlc, np.array([0.03**2, 0.03**2]), Reversion(2.0).weights(h))
    np.testing.assert_array_equal(new_close[:, :, 0], close[:, :, 0])  # the origin's close
    np.testing.assert_array_equal(new["close"], new_close[:, :, 1:])
    assert not np.allclose(new_close, close)
    np.testing.assert_allclose(new["open"] / new_close[:, :, :-1], open_ / close[:, :, :-1])  # the gap
    top, bottom = np.maximum(new["open"], new["close"]), np.minimum(new["open"], new["close"])
    np.testing.assert_allclose(new["high"] / top, high / np.maximum(open_, close[:, :, 1:]))
    np.testing.assert_allclose(new["low"] / bottom, low / np.minimum(open_, close[:, :, 1:]))
    assert np.all(new["high"] >= top) and np.all(new["low"] <= bottom)


def test_long_run_variance_reads_the_last_valid_closes():
    close = np.exp(np.cumsum(np.r_[np.full(100, 0.05), np.full(600, 0.0) + np.tile([0.01, -0.01], 300)]))
    assert long_run_variance(close) == pytest.approx(1e-4)  # only the last 500 returns: +-1%
    assert np.isnan(long_run_variance(np.array([1.0, np.nan])))


def test_reversion_json_absent_off_damaged_or_for_another_model(tmp_path, capsys):
    assert load_reversion(tmp_path) is None and load_reversion(None) is None
    write_reversion({"tau": 40.0, "long_run": 500, "checkpoint_sha256": "ab" * 32}, tmp_path)
    assert load_reversion(tmp_path, "ab" * 32) == Reversion(40.0, 500)
    assert load_reversion(tmp_path, "cd" * 32) is None
    assert "fitted for another best_model.pt" in capsys.readouterr().err
    write_reversion({"tau": None, "long_run": 500}, tmp_path)
    assert load_reversion(tmp_path) is None  # the fit chose the paths as sampled
    for bad in ('{"tau": -3, "long_run": 500}', '{"long_run": 500}', "{not json"):
        (tmp_path / REVERSION_JSON).write_text(bad)
        with pytest.raises(UserError, match="reversion.json is damaged.*delete it"):
            load_reversion(tmp_path)


class TooCalm:
    """Normal paths whose k-step spread grows as sqrt(k) from a volatility `scale` x the true one:
    too narrow at every horizon when scale < 1; the truth when scale = 1."""

    def __init__(self, scale: float) -> None:
        self.scale = scale
        self.last_seen: list = []

    def __call__(self, histories, horizon, n_samples, seed):
        self.last_seen += [h.candles.index[-1] for h in histories]
        steps = np.random.default_rng(seed).normal(0, self.scale * SIGMA, (len(histories), n_samples, horizon))
        return np.cumsum(steps, axis=2)


def _series(n: int = 1500, seed: int = 0):
    rng = np.random.default_rng(seed)
    return three_way([SIGMA * rng.standard_normal(n) for _ in range(3)])


def test_the_fit_pulls_a_too_calm_model_and_leaves_the_truth_alone():
    series = _series()
    calm = TooCalm(0.6)
    fit = fit_reversion(series, calm, n_samples=64, seed=0)
    assert fit["tau"] is not None and fit["weights"]["20"] > 0.3
    skill = fit["val_crps_skill_vs_raw"]
    assert set(skill) == {"raw", *(f"tau{t:g}" for t in (400, 200, 100, 50, 25, 12))}
    assert all(skill[f"tau{fit['tau']:g}"][str(h)] > 0 for h in FIT_HORIZONS)
    # validation only: no candle after any asset's last validation row reached the model
    assert max(calm.last_seen) < min(s.candles.index[s.val.stop] for s in series)
    # the long-run level here is the truth's: pulling toward it changes little, and a model
    # already right gains nothing worth a pull at one step
    truth = fit_reversion(series, TooCalm(1.0), n_samples=64, seed=0)
    assert truth["val_crps_skill_vs_raw"]["tau12"]["20"] < fit["val_crps_skill_vs_raw"]["tau12"]["20"]


def test_a_model_right_against_a_misleading_long_run_level_is_left_as_sampled():
    rng = np.random.default_rng(2)
    # five times wilder in the first 550 candles (train), calm after (val from 610, test): the last
    # 500 returns up to an early val origin are mostly wild, so the pull points the wrong way
    returns = [np.r_[5 * SIGMA * rng.standard_normal(550), SIGMA * rng.standard_normal(950)] for _ in range(3)]
    series = three_way(returns, purge=10)
    fit = fit_reversion(series, TooCalm(1.0), n_samples=64, seed=0)
    assert fit["tau"] is None and fit["weights"] == {"1": 0.0, "5": 0.0, "20": 0.0}


def test_no_validation_split_or_too_few_origins_is_a_clear_error():
    series = _series()
    no_val = [s.__class__(s.symbol, s.category, s.candles, s.train, s.test, range(0)) for s in series]
    with pytest.raises(UserError, match="no validation split.*vol_reversion false"):
        fit_reversion(no_val, TooCalm(1.0))
    short = three_way([SIGMA * np.ones(120)], purge=2)
    with pytest.raises(UserError, match="origins with a close 20 bars later, 20 needed"):
        fit_reversion(short, TooCalm(1.0))


# ---------------------------------------------------------------------- a trained run


@pytest.fixture(scope="module")
def reverted_run(tmp_path_factory):
    from test_forecast import TINY, train_tiny

    spec = json.loads(json.dumps(TINY))
    spec["training"].update(vol_reversion=True, scorecard_samples=8)
    return train_tiny(tmp_path_factory.mktemp("rev"), spec)[1]


def test_training_fits_it_and_every_forecast_of_the_run_reads_it(reverted_run, tmp_path):
    from common.forecasting.forecaster import Forecaster

    fit = json.loads((reverted_run / REVERSION_JSON).read_text())
    assert fit["split"] == "val" and fit["samples"] == 8 and len(fit["checkpoint_sha256"]) == 64
    fc = Forecaster.from_run(reverted_run)
    # a fit that chose no pull forecasts the paths as sampled; give this run a strong one to see it
    write_reversion({**fit, "tau": 3.0}, tmp_path)
    shutil.copy2(tmp_path / REVERSION_JSON, reverted_run / REVERSION_JSON)
    fc = Forecaster.from_run(reverted_run)
    assert fc.reversion == Reversion(3.0, interval="1d")
    history = fc.load_history(["AAPL"], as_of="2012-06-01")
    pulled = fc.forecast(history, horizon=20, samples=200, seed=3, return_paths=True).paths["close"]
    fc.reversion = None
    raw = fc.forecast(history, horizon=20, samples=200, seed=3, return_paths=True).paths["close"]
    v_long = long_run_variance(history[0].candles["close"].to_numpy())
    spread = lambda c: np.log(c[0, :, -1] / c[0, :, 0]).var()  # noqa: E731
    assert spread(pulled) != pytest.approx(spread(raw))
    expected = (3 / 23) * spread(raw) + (20 / 23) * 20 * v_long
    assert spread(pulled) == pytest.approx(expected, rel=1e-9)


def test_an_ensemble_reads_each_member_s_file_once(reverted_run, tmp_path, capsys):
    from common.forecasting.ensemble import Ensemble
    from common.forecasting.forecaster import Forecaster

    fit = json.loads((reverted_run / REVERSION_JSON).read_text())
    write_reversion({**fit, "tau": 3.0, "checkpoint_sha256": "cd" * 32}, tmp_path)
    shutil.copy2(tmp_path / REVERSION_JSON, reverted_run / REVERSION_JSON)
    ensemble = Ensemble([Forecaster.from_run(reverted_run), Forecaster.from_run(reverted_run)])
    assert capsys.readouterr().err.count("fitted for another best_model.pt") == 2  # one line a member
    assert ensemble.reversion is None and ensemble.reversion_taus() == [None, None]
    assert ensemble.run_dir == reverted_run
    write_reversion({**fit, "tau": 3.0}, reverted_run)
    assert Ensemble([Forecaster.from_run(reverted_run)] * 2).reversion_taus() == [3.0, 3.0]


def test_an_onnx_export_carries_the_reversion_and_forecasts_as_its_run(reverted_run, tmp_path):
    from common.forecasting.export import export_run
    from common.forecasting.forecaster import Forecaster
    from common.forecasting.infer import ExportedForecaster

    fit = json.loads((reverted_run / REVERSION_JSON).read_text())
    (reverted_run / REVERSION_JSON).write_text(json.dumps({**fit, "tau": 3.0}))
    out = tmp_path / "onnx"
    export_run(reverted_run, "onnx", out)
    assert json.loads((out / REVERSION_JSON).read_text())["tau"] == 3.0
    run, exported = Forecaster.from_run(reverted_run), ExportedForecaster.from_export(out)
    assert exported.reversion == run.reversion == Reversion(3.0, interval="1d")
    # greedy tokens take the sampler's draws out (both backends pick the same ids); each candle's
    # move is still drawn within its bin, so the samples spread and the reversion acts on them
    history = run.load_history(["AAPL"], as_of="2012-06-01")
    paths = lambda fc: fc.forecast(history, 20, 50, seed=1, temperature=0.0, return_paths=True).paths  # noqa: E731
    a, b = paths(run), paths(exported)
    for key in ("close", "open", "high", "low"):
        np.testing.assert_allclose(a[key], b[key], rtol=1e-9)
    run.reversion = None
    assert not np.allclose(paths(run)["close"], a["close"])
    hf = export_run(reverted_run, "hf", tmp_path / "hf")  # the model folder carries it too
    assert Forecaster.from_pretrained(hf).reversion == Reversion(3.0, interval="1d")


def test_calibrate_reversion_fits_it_for_a_run_trained_without(reverted_run, capsys):
    from common.cli import main

    (reverted_run / REVERSION_JSON).unlink()
    assert main(["calibrate", str(reverted_run), "--reversion", "--samples", "8", "--seed", "5"]) == 0
    out = capsys.readouterr().out
    fit = json.loads((reverted_run / REVERSION_JSON).read_text())
    assert fit["samples"] == 8 and fit["seed"] == 5
    assert "Volatility reversion on validation: " in out and f"Wrote {reverted_run / REVERSION_JSON}" in out
    (reverted_run / REVERSION_JSON).write_text("{broken")
    assert main(["forecast", str(reverted_run), "--symbols", "AAPL", "--horizon", "3", "--samples", "4"]) == 2
    assert "reversion.json is damaged" in capsys.readouterr().err


def test_the_scorecard_and_forecast_json_record_each_run_s_reversion(reverted_run, tmp_path):
    from common.cli import main

    write_reversion({"tau": 7.0, "long_run": 500}, reverted_run)  # the run's file, whatever earlier tests left
    out = tmp_path / "fc"
    assert (
        main(
            ["forecast", str(reverted_run), "--symbols", "AAPL", "--horizon", "3", "--samples", "8", "--out", str(out)]
        )
        == 0
    )
    assert json.loads((out / "forecast.json").read_text())["reversion_tau"] == [7.0]
    args = ["scorecard", str(reverted_run), "--origins", "3", "--samples", "8", "--horizons", "1,5"]
    assert main(args) == 0
    assert json.loads((reverted_run / "scorecard.json").read_text())["reversion_tau"] == [7.0]


def test_a_failing_fit_is_recorded_and_does_not_fail_the_run(reverted_run, monkeypatch, capsys):
    from common.cli import main
    from common.evaluation import vol_reversion

    config = reverted_run.parent.parent / "configs" / "tiny.json"
    (reverted_run / "test_results.json").unlink()

    def broken(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(vol_reversion, "fit_run_reversion", broken)
    assert main(["train", "--config", str(config), "--resume", "auto"]) == 0
    results = json.loads((reverted_run / "test_results.json").read_text())
    assert results["reversion_error"] == "OSError: disk full" and "scorecard_error" not in results
    assert "reversion.json not written (OSError: disk full)" in capsys.readouterr().err


def test_a_run_of_two_intervals_reverts_the_interval_it_was_fitted_on_only(tmp_path):
    from common.forecasting.forecaster import Forecaster
    from common.paths import REPO_ROOT

    run = tmp_path / "two_intervals"
    shutil.copytree(REPO_ROOT / "tests" / "fixtures" / "runs" / "two_intervals", run)
    write_reversion({"tau": 3.0, "long_run": 500, "interval": "1d"}, run)
    daily, hourly = Forecaster.from_run(run), Forecaster.from_run(run, interval="1h")
    assert daily.reversion_taus() == [3.0] and hourly.reversion_taus() == [None]
    history = hourly.load_history(["BTC-USD"])
    got = hourly.forecast(history, 5, 40, seed=2, return_paths=True).paths["close"]
    hourly.reversion = None
    np.testing.assert_array_equal(got, hourly.forecast(history, 5, 40, seed=2, return_paths=True).paths["close"])
