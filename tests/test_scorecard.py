"""The walk-forward scorecard: no look-ahead, detectable skill, the oracle's optimum, its files."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from common.errors import UserError
from common.evaluation.asset_series import AssetSeries, fit_price_baselines
from common.evaluation.price_baselines import RandomWalkEWMA
from common.evaluation.scorecard import (
    ScorecardSettings,
    make_scorecard,
    run_scorecard,
    write_scorecard,
)
from common.evaluation.walk_forward import origin_indices
from common.forecasting.forecast_io import History
from common.run.files import SCORECARD_JSON, SCORECARD_PNG

from scorecard_helpers import garch_returns, synthetic_series

REPO = Path(__file__).resolve().parent.parent


class Recorder:
    """A forecaster that keeps every history it is given, and answers like the random walk."""

    def __init__(self) -> None:
        self.seen: list[tuple[int, History]] = []

    def __call__(self, histories, horizon, n_samples, seed):
        self.seen += [(horizon, h) for h in histories]
        return RandomWalkEWMA()(histories, horizon, n_samples, seed)


def test_an_origin_never_sees_a_candle_after_itself():
    rng = np.random.default_rng(0)
    series = synthetic_series([rng.normal(0, 0.01, 400) for _ in range(2)])
    rec = Recorder()
    card = make_scorecard(
        series,
        rec,
        ScorecardSettings(interval="1d", horizons=[1, 5], stride=3, n_samples=20, n_boot=50),
        baselines={"rw_ewma": RandomWalkEWMA()},
    )
    by_symbol = {s.symbol: s for s in series}
    # one call per batch at the longest horizon: its paths serve H=1 too
    assert len(rec.seen) == card["horizons"]["1"]["n"] and {horizon for horizon, _ in rec.seen} == {5}
    for _horizon, h in rec.seen:
        s = by_symbol[h.symbol]
        i = s.candles.index.get_loc(h.candles.index[-1])
        assert s.test.start <= i < s.test.stop - 1  # inside the test split, purge gap respected
        assert h.candles.equals(s.candles.iloc[: i + 1])  # exactly the candles up to the origin
        # a copy: no view whose base reaches the rows after the origin
        assert not np.shares_memory(h.candles["close"].to_numpy(), s.candles["close"].to_numpy())
    # and the origin dates are every 3rd test date
    dates = sorted({h.candles.index[-1] for _, h in rec.seen})
    assert dates == list(series[0].candles.index[series[0].test.start : series[0].test.stop - 1 : 3])


def test_origin_selection_strides_and_counts():
    rng = np.random.default_rng(0)
    series = synthetic_series([rng.normal(0, 0.01, 300) for _ in range(2)])
    origins, step = origin_indices(series, stride=10)
    assert step == 10 and origins["A0"].tolist() == list(range(series[0].test.start, 301, 10))
    origins, _ = origin_indices(series, n_origins=4)
    assert len(origins["A1"]) == 4 and origins["A1"][0] == series[1].test.start and origins["A1"][-1] == 300
    with pytest.raises(UserError, match="exactly one"):
        origin_indices(series, stride=2, n_origins=3)
    with pytest.raises(UserError, match="stride must be"):
        origin_indices(series, stride=0)
    empty = [AssetSeries("E", "x", series[0].candles, range(0, 10), range(301, 301))]
    with pytest.raises(UserError, match="no asset has a candle in its test split"):
        origin_indices(empty, stride=1)


def test_garch_beats_the_random_walk_on_garch_data():
    """The harness detects real skill: on GARCH(1,1)-t returns with fast mean reversion of
    volatility, the GARCH baseline (train-fitted) beats RiskMetrics EWMA in CRPS at H=1."""
    rng = np.random.default_rng(0)
    series = synthetic_series([garch_returns(2500, rng, omega=2.5e-5, alpha=0.25, beta=0.5, nu=4) for _ in range(3)])
    baselines = fit_price_baselines(series, "1d")
    card = make_scorecard(
        series,
        baselines["garch"],
        ScorecardSettings(interval="1d", horizons=[1], stride=1, n_samples=100, n_boot=500),
        baselines={"rw_ewma": baselines["rw_ewma"]},
    )
    skill = card["horizons"]["1"]["skill"]["crps"]["rw_ewma"]
    assert skill["verdict"] == "beats" and skill["ci95"][0] > 0, skill
    assert card["verdicts"][0].startswith("H=1: CRPS skill vs RW-EWMA +") and card["verdicts"][0].endswith("(beats)")
    dm = card["horizons"]["1"]["dm"]["crps"]["rw_ewma"]  # the one test of the family: Holm changes nothing
    assert dm["statistic"] < 0 and dm["p_holm"] == dm["p_value"] < 0.05 and dm["verdict"] == "beats"
    assert card["horizons"]["1"]["mcs"]["included"] == ["model"]  # the 90% set keeps GARCH alone


def test_an_oracle_reaches_the_optimal_crps_and_nominal_coverage():
    """iid N(0, s^2) returns: the true H-step distribution N(0, H s^2) has expected CRPS
    s sqrt(H) / sqrt(pi) and covers exactly its nominal share."""
    sigma = 0.01
    rng = np.random.default_rng(1)
    series = synthetic_series([rng.normal(0, sigma, 2600) for _ in range(4)], train_frac=0.2)

    def oracle(histories, horizon, n_samples, seed):
        return np.random.default_rng(seed).normal(0, sigma * math.sqrt(horizon), (len(histories), n_samples))

    card = make_scorecard(
        series,
        oracle,
        ScorecardSettings(interval="1d", horizons=[1, 5], stride=5, n_samples=200, n_boot=200),
        baselines={"rw_ewma": RandomWalkEWMA()},
    )
    for h in (1, 5):
        hc = card["horizons"][str(h)]
        n = hc["n"]
        optimum = sigma * math.sqrt(h) / math.sqrt(math.pi)
        # CRPS of the true normal has sd about 0.6 of its mean per origin: 4 standard errors
        assert hc["crps"]["model"] == pytest.approx(optimum, rel=4 * 0.6 / math.sqrt(n))
        for level in (50, 80, 90):
            p = level / 100
            assert hc["coverage"]["model"][str(level)] == pytest.approx(p, abs=4 * math.sqrt(p * (1 - p) / n))
        assert max(hc["pit"]["model"]) < 0.1 + 4 * math.sqrt(0.09 / n)
    assert card["calibration"]["coverage"] == card["horizons"]["1"]["coverage"]["model"]


def test_a_ceiling_is_scored_beside_the_baselines_but_is_not_one():
    """The best possible forecast (the observable oracle on a rich synthetic run) is forecast on the
    same origins and judged apart: the model's share of its edge over the best baseline, 1 for a
    model that forecasts as it does, 0 for one that forecasts as the best baseline."""
    sigma = 0.01
    rng = np.random.default_rng(3)
    series = synthetic_series([rng.normal(0, sigma, 1500) for _ in range(3)], train_frac=0.3)

    def truth(histories, horizon, n_samples, seed):  # the same draws whoever calls it
        return np.random.default_rng(len(histories[0].candles)).normal(
            0, sigma * math.sqrt(horizon), (len(histories), n_samples)
        )

    def ewma(histories, horizon, n_samples, seed):
        return RandomWalkEWMA()(histories, horizon, n_samples, 7)

    settings = ScorecardSettings(interval="1d", horizons=[1, 5], stride=5, n_samples=100, n_boot=200)
    for model, share in ((ewma, 0.0), (truth, 1.0)):
        card = make_scorecard(series, model, settings, baselines={"rw_ewma": ewma}, ceiling={"truth": truth})
        for h in ("1", "5"):
            hc = card["horizons"][h]
            assert "truth" not in hc["crps"] and "truth" not in hc["skill"]["crps"] and "truth" not in card["baselines"]
            c = hc["ceiling"]["truth"]
            assert c["best_baseline"] == "rw_ewma" and c["edge"] == pytest.approx(c["best_baseline_crps"] - c["crps"])
            assert c["model_share"] == pytest.approx(share, abs=1e-9)
            assert c["model_share_ci95"] == pytest.approx([share, share], abs=1e-9)
        assert len(card["ceiling_lines"]) == 2 and card["ceiling_lines"][0].startswith("truth at H=1: CRPS ")
        assert "the model holds " in card["ceiling_lines"][1] and card["ceiling_lines"][1].endswith(" (1 = the oracle)")
    assert "the model holds +1.00 [+1.00, +1.00] of that edge" in card["ceiling_lines"][0]


def test_the_ceiling_is_judged_across_assets_as_the_model_is():
    """A ceiling that knows each asset's drift, which flips every 10 days on a schedule no factor
    reads, ranks the assets far above every factor; scored as the model, it gets the same rank IC
    and the same edge over the best factor as it gets as the ceiling."""
    n, sigma, mu = 1500, 0.01, 0.004
    phase = np.arange(6)[:, None] * 3 + np.arange(n)[None, :] // 10
    drift = np.where(phase % 2 == 0, mu, -mu)  # drift[k, t]: the mean of asset k's return into day t
    rng = np.random.default_rng(5)
    series = synthetic_series(list(drift + rng.normal(0, sigma, (6, n))), train_frac=0.3)

    def truth(histories, horizon, n_samples, seed):  # the same draws whoever calls it
        rng = np.random.default_rng(len(histories[0].candles))
        means = [drift[int(h.symbol[1:]), len(h.candles) : len(h.candles) + horizon].sum() for h in histories]
        return np.asarray(means)[:, None] + rng.normal(0, sigma * math.sqrt(horizon), (len(histories), n_samples))

    settings = ScorecardSettings(interval="1d", horizons=[1, 5], stride=5, n_samples=100, n_boot=100)
    baselines = {"rw_ewma": RandomWalkEWMA()}
    as_model = make_scorecard(series, truth, settings, baselines=baselines)
    card = make_scorecard(series, RandomWalkEWMA(), settings, baselines=baselines, ceiling={"truth": truth})
    for h in ("1", "5"):
        c, model = card["horizons"][h]["ceiling"]["truth"], as_model["horizons"][h]
        over = c["over_best_factor"]
        assert over["best_factor"] == card["horizons"][h]["cross_section"]["edge"]["best_factor"]
        assert c["rank_ic"] == model["rank_ic"]["model"] and c["rank_ic"]["mean"] > 0.3
        assert over == model["cross_section"]["edge"] and over["model_minus_best"] > 0.3 and over["t_nw"] > 2
        assert abs(card["horizons"][h]["rank_ic"]["model"]["mean"]) < 0.1  # a random walk's mean ranks noise
    line = [x for x in card["ceiling_lines"] if x.startswith("truth at H=5 across assets: rank IC ")]
    assert len(line) == 1 and " dates)" in line[0]


def test_scorecard_files_read_with_jq(tmp_path):
    rng = np.random.default_rng(2)
    series = synthetic_series([rng.normal(0.0005, 0.01, 700) for _ in range(5)])
    card = make_scorecard(
        series, RandomWalkEWMA(), ScorecardSettings(interval="1d", horizons=[1, 5], stride=5, n_samples=50, n_boot=100)
    )
    json_path, png_path = write_scorecard(card, tmp_path)
    assert png_path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    loaded = json.loads(json_path.read_text())
    skill = loaded["horizons"]["1"]["skill"]["crps"]["garch"]
    assert set(skill) == {"value", "ci95", "verdict"} and len(skill["ci95"]) == 2
    assert loaded["horizons"]["1"]["crps"]["model"] > 0 and 0 <= loaded["calibration"]["coverage"]["90"] <= 1
    assert loaded["backtest"]["horizon"] == 5 and loaded["backtest"]["sharpe"] == card["backtest"]["sharpe"]
    best_factor = loaded["horizons"]["5"]["cross_section"]["edge"]["best_factor"]  # the backtest's horizon
    assert set(loaded["backtest"]["strategies"]) == {
        "model",
        "buy_and_hold",
        "momentum20",
        "model_long_short",
        f"{best_factor}_long_short",
    }
    ic = loaded["horizons"]["5"]["rank_ic"]
    assert set(ic) == {"model", "bootstrap"}  # the zero-mean baselines rank nothing
    assert loaded["horizons"]["1"]["direction"]["always_up"]["n"] > 0
    assert set(loaded["horizons"]["1"]["by_asset"]) == {f"A{k}" for k in range(5)}
    crps1 = loaded["horizons"]["1"]["crps"]
    baselines = ("rw_ewma", "bootstrap", "garch", "har", "log_har")
    best = min(baselines, key=crps1.get)
    dm_best = loaded["horizons"]["1"]["dm"]["crps"][best]
    assert loaded["headline"] == {
        "horizon": 1,
        "baseline": best,
        **loaded["horizons"]["1"]["skill"]["crps"][best],
        "verdict": dm_best["verdict"],
        "p_value": dm_best["p_value"],
        "p_holm": dm_best["p_holm"],
    }
    # the significance tests beside the skills: DM per baseline, Holm across the card, the 90% MCS
    tests = [(h, name, dm) for h in ("1", "5") for name, dm in loaded["horizons"][h]["dm"]["crps"].items()]
    assert {name for _, name, _ in tests} == set(baselines) and len(tests) == 10
    for h, name, dm in tests:
        assert {"statistic", "p_value", "p_holm", "mean_diff", "n_dates", "lags", "verdict"} <= set(dm)
        assert dm["n_dates"] == loaded["horizons"][h]["n_dates"] and dm["lags"] == 0  # H <= stride: no overlap
        assert 0 <= dm["p_value"] <= dm["p_holm"] <= 1
        assert np.sign(dm["mean_diff"]) == -np.sign(loaded["horizons"][h]["skill"]["crps"][name]["value"])
    smallest = min(dm["p_value"] for *_, dm in tests)
    assert min(dm["p_holm"] for *_, dm in tests) == pytest.approx(min(1.0, 10 * smallest))  # Holm's first step
    assert loaded["significance"] == {
        "test": "Diebold-Mariano with the Harvey-Leybourne-Newbold correction, per-date CRPS",
        "adjustment": "holm",
        "family_alpha": 0.05,
        "family": 10,
    }
    mcs = loaded["horizons"]["1"]["mcs"]
    assert mcs["alpha"] == 0.1 and set(mcs["pvalues"]) == {"model", *baselines}
    assert mcs["included"] == [k for k, p in mcs["pvalues"].items() if p > 0.1] and mcs["included"]
    assert [line.split(":")[0] for line in loaded["mcs_lines"]] == ["MCS 90% at H=1", "MCS 90% at H=5"]
    for h in ("1", "5"):  # coverage at 95% beside 50/80/90, a PIT uniformity test per forecaster
        hc = loaded["horizons"][h]
        assert set(hc["coverage"]["model"]) == {"50", "80", "90", "95"}
        assert set(hc["pit_test"]) == {"model", *baselines} and hc["pit_calibrated"] is None
        assert all(t["df"] == 4 and 0 <= t["p_value"] <= 1 for t in hc["pit_test"].values())
    assert loaded["calibration"]["pit_test"] == loaded["horizons"]["1"]["pit_test"]["model"]
    assert [line.split(":")[0] for line in loaded["pit_lines"]] == ["PIT uniform at H=1", "PIT uniform at H=5"]
    for h, best_h in loaded["headlines"].items():  # per horizon: the baseline with the lowest CRPS
        hc = loaded["horizons"][h]
        assert best_h["baseline"] == min(baselines, key=hc["crps"].get) == hc["best_baseline"]["baseline"]
        assert best_h["value"] == hc["skill"]["crps"][best_h["baseline"]]["value"]
    assert [line.split(":")[0] for line in loaded["headline_lines"]] == ["Best baseline at H=1", "Best baseline at H=5"]
    for line, (h, _name, dm) in zip(loaded["verdicts"], tests):
        assert line.startswith(f"H={h}: CRPS skill vs ") and ", DM p " in line and line.endswith(f"({dm['verdict']})")
    again = make_scorecard(
        series, RandomWalkEWMA(), ScorecardSettings(interval="1d", horizons=[1, 5], stride=5, n_samples=50, n_boot=100)
    )
    assert again["horizons"]["5"]["mcs"] == card["horizons"]["5"]["mcs"]  # seeded: the same set again
    if shutil.which("jq"):
        out = subprocess.run(
            ["jq", "-r", '.horizons["1"].skill.crps.garch.verdict', str(json_path)],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        assert out in {"beats", "no edge", "worse"}


def test_bad_forecasts_and_arguments_are_refused():
    rng = np.random.default_rng(3)
    series = synthetic_series([rng.normal(0, 0.01, 300)])
    base = {"rw_ewma": RandomWalkEWMA()}
    nan_fn = lambda histories, horizon, n, seed: np.full((len(histories), n), np.nan)  # noqa: E731
    with pytest.raises(ValueError, match="forecaster 'model' returned .* non-finite"):
        make_scorecard(series, nan_fn, ScorecardSettings(interval="1d", horizons=[1], n_samples=10), baselines=base)
    short = lambda histories, horizon, n, seed: np.zeros((len(histories), n - 1))  # noqa: E731
    with pytest.raises(ValueError, match="expected"):
        make_scorecard(series, short, ScorecardSettings(interval="1d", horizons=[1], n_samples=10), baselines=base)
    with pytest.raises(UserError, match="unknown assets ZZZ"):
        make_scorecard(series, RandomWalkEWMA(), ScorecardSettings(interval="1d", assets=["ZZZ"]), baselines=base)
    with pytest.raises(UserError, match="no origin .* 500 bars later"):
        make_scorecard(series, RandomWalkEWMA(), ScorecardSettings(interval="1d", horizons=[500]), baselines=base)


def test_run_scorecard_on_a_run_folder_of_the_shipped_sample(tmp_path):
    """series_from_run reads config.json and the token folder; the files land in the run folder."""
    from common.config import load_config, save_config
    from common.data.loading import load_market_data
    from common.data.prepare import prepare_data
    from common.tokens.token_set import TokenSet

    cfg = load_config(
        REPO / "case_c_crypto" / "configs" / "crypto_prototype.json", ["data.source=sample", "data.interval=1d"]
    )
    prepared = prepare_data(cfg.data, cfg.model.context_length, load_market_data(cfg.data, tmp_path))
    run = tmp_path / "case" / "checkpoints" / "run_20260101_000000"
    run.mkdir(parents=True)
    save_config(cfg, run / "config.json")
    symbols = [a.symbol for a in prepared.assets]
    n = {s: len(prepared.candles[s]) for s in symbols}
    splits = {s: prepared.splits[s] for s in symbols}
    TokenSet(
        symbols,
        {s: np.zeros(n[s], np.int16) for s in symbols},
        {s: np.zeros(n[s]) for s in symbols},
        {
            s: {k: (getattr(splits[s], k).start, getattr(splits[s], k).stop) for k in ("train", "val", "test")}
            for s in symbols
        },
    ).save(run / "tokens")
    with_test = [s for s in symbols if len(splits[s].test) > 40][:3]
    card = run_scorecard(
        run, RandomWalkEWMA(), ScorecardSettings(horizons=[1], stride=20, n_samples=20, assets=with_test)
    )
    assert (run / SCORECARD_JSON).is_file() and (run / SCORECARD_PNG).is_file()
    assert set(card["horizons"]["1"]["by_asset"]) == set(with_test) and card["interval"] == "1d"
    with pytest.raises(UserError, match="missing tokens"):
        shutil.rmtree(run / "tokens")
        run_scorecard(run, RandomWalkEWMA())


def test_a_forecaster_scores_through_forecaster_fn(tmp_path):
    """The wiring: a real Forecaster (an untrained tiny MarketGPT) through `forecaster_fn`; its
    H-step returns are those of the Forecaster's own paths and table."""
    import torch

    from common.config import load_config
    from common.data.universe import Asset
    from common.evaluation.scorecard import forecaster_fn
    from common.forecasting.forecaster import Forecaster
    from common.model.gpt import MarketGPT
    from common.tokens.ids import RunInfo
    from common.tokens.tokenizer import OHLCTokenizer

    torch.manual_seed(0)
    (tmp_path / "tiny.json").write_text(
        json.dumps(
            {
                "experiment": "tiny",
                "data": {"source": "sample", "interval": "1d"},
                "model": {
                    "vocab_size": 64,
                    "context_length": 16,
                    "d_model": 32,
                    "num_layers": 1,
                    "num_heads": 2,
                    "d_ff": 64,
                    "asset_embed_dim": 4,
                    "category_embed_dim": 4,
                },
            }
        )
    )
    cfg = load_config(tmp_path / "tiny.json")
    rng = np.random.default_rng(4)
    series = synthetic_series([rng.normal(0, 0.01, 300) for _ in range(2)], category="us_stock")
    tok = OHLCTokenizer(vocab_size=64).fit({s.symbol: s.candles.iloc[: s.train.stop] for s in series})
    fc = Forecaster(
        MarketGPT(cfg.model, num_assets=2, num_categories=1),
        tok,
        RunInfo.of_assets([Asset(s.symbol, "sample", "us_stock", s.symbol) for s in series]),
        cfg,
    )
    fn = forecaster_fn(fc)
    history = History("A0", series[0].candles.iloc[: series[0].test.start + 1])
    paths = fn([history], 3, 16, 5)
    result = fc.forecast([history], 3, 16, seed=5, return_paths=True)
    assert paths.shape == (1, 16, 3)
    np.testing.assert_allclose(
        paths[0, :, 2], np.log(result.paths["close"][0, :, 3] / history.candles["close"].iloc[-1])
    )
    assert result.table["mean_log_return"].to_numpy() == pytest.approx(paths[0].mean(0))

    card = make_scorecard(
        series,
        fn,
        ScorecardSettings(interval="1d", horizons=[1, 3], stride=20, n_samples=16, n_boot=50),
        baselines={"rw_ewma": RandomWalkEWMA()},
    )
    assert card["horizons"]["3"]["n"] > 0 and card["horizons"]["3"]["crps"]["model"] > 0


def test_garch_is_fitted_on_the_train_split_only(monkeypatch):
    from common.evaluation.price_baselines import GarchT

    rng = np.random.default_rng(5)
    series = synthetic_series([rng.normal(0, 0.01, 400), rng.normal(0, 0.02, 500)])
    seen = {}
    real_fit = GarchT.fit.__func__
    monkeypatch.setattr(
        GarchT, "fit", classmethod(lambda cls, train, lam=0.94: seen.update(train) or real_fit(cls, train, lam))
    )
    fit_price_baselines(series, "1d")
    for s in series:  # the train candles' returns, nothing from val or test
        np.testing.assert_array_equal(seen[s.symbol], np.diff(np.log(s.candles["close"].to_numpy()[: s.train.stop])))
