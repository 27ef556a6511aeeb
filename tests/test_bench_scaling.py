"""The scaling study: bench_scaling's toy grid writes its JSON and PNG, its oracle is the true
token distribution of the synthetic market, the fit finds a known optimum, and model.size =
"auto" trains the fitted shape and says so in training_log.json."""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import numpy as np
import pytest

import common.commands.train as train  # at collection: its import chain (requests) probes a socket
from common.config import ConfigError, load_config
from common.errors import UserError
from common.evaluation import range_density
from common.model.scaling_fit import SHAPES, ScalingFit, _predict, best_shape, corpus_of, fit_points
from common.paths import REPO_ROOT

sys.path.insert(0, str(REPO_ROOT / "bench"))
import bench_scaling  # noqa: E402
import scaling_floors  # noqa: E402

CASE_C = REPO_ROOT / "case_c_crypto" / "configs" / "crypto_prototype.json"
TRUE = {"E": 0.02, "A": 0.01, "a": 0.5, "B": 0.005, "b": 0.35, "C": 0.003, "c": 0.6}


def test_smoke_grid_writes_points_with_the_gap_to_the_oracle_and_a_png(tmp_path):
    # two points in two worker processes (--jobs): a corpus of 2 assets and a larger one of 3
    assert bench_scaling.main(["--smoke", "--jobs", "2", "--out", str(tmp_path)]) == 0
    doc = json.loads((tmp_path / "scaling_smoke.json").read_text())
    assert len(doc["points"]) == 2
    point, larger = sorted(doc["points"], key=lambda r: r["train_tokens"])
    assert larger["train_tokens"] > point["train_tokens"] and larger["scored_assets"] == point["scored_assets"] == 2
    assert larger["test"]["loss"]["oracle"] == pytest.approx(point["test"]["loss"]["oracle"], abs=0.05)  # same candles
    test = point["test"]
    loss = test["loss"]
    assert loss["oracle"] < loss["unigram"]  # the true distribution beats the train split's token frequencies
    gap = (loss["unigram"] - loss["model"]) / (loss["unigram"] - loss["oracle"])
    assert test["gap_closed"] == pytest.approx(gap)
    low, high = test["skill_vs_unigram"]["ci95"]
    assert low <= loss["unigram"] - loss["model"] <= high
    assert point["parameters"] > 0 and point["best_epoch"] >= 1 and point["train_tokens"] > 0
    # the floors: a filter of the past candles reaches less than the oracle, and of their tokens less still
    assert loss["oracle"] < loss["filter"] < loss["filter_tokens"] < loss["unigram"]
    assert 0 < test["filter_tokens_gap_closed"] < test["filter_gap_closed"] < 1
    assert (tmp_path / "scaling_smoke.png").stat().st_size > 1000


def test_the_oracle_is_calibrated_on_the_market_it_describes():
    # tokens drawn by the generator: the mean NLL of what happened equals the mean entropy of the
    # predicted distributions when (and only when) they are the true ones
    from common.config.synthetic import SyntheticSpec
    from common.data.synthetic import generate_asset
    from common.special_tokens import NUM_SPECIAL_TOKENS
    from common.tokens.tokenizer import OHLCTokenizer

    spec = SyntheticSpec(assets=2, candles=6000, interval="1h", seasonality=0.0, categories=("crypto",))
    assets = [generate_asset(spec, i) for i in range(2)]
    tok = OHLCTokenizer(vocab_size=1024, ret_bins=16).fit({a.symbol: a.candles.iloc[:4000] for a in assets})
    rho, y = [], []
    for a in assets:
        tokens, (move_z, _) = tok.encode(a.candles), tok.features(a.candles)
        rows = np.arange(4000, 6000)
        log_close = np.log(a.candles["close"].to_numpy())
        r = log_close[rows] - log_close[rows - 1]
        rho.append(a.truth["sigma"].to_numpy()[rows - 1] * move_z[rows] / r)
        y.append(tokens[rows].astype(np.int64) - NUM_SPECIAL_TOKENS)
    rho, y = np.concatenate(rho), np.concatenate(y)
    p = bench_scaling.oracle_probs(rho, tok.move_binning.edges, tok.shape_binning.edges, spec.nu, grid=40, draws=20_000)
    nll = -np.log(p[np.arange(len(y)), y])
    entropy = -(p * np.log(p)).sum(axis=1)
    assert abs(nll.mean() - entropy.mean()) < 3 * nll.std() / np.sqrt(len(y))
    unigram = np.bincount(y, minlength=p.shape[1]) / len(y)
    assert nll.mean() < -np.log(unigram[y]).mean() - 0.03  # in-sample unigram, still worse


def test_the_oracle_with_a_mean_is_calibrated_on_the_rich_market():
    # the rich market's mean moves every candle (m = mu / s up to about +-1): the oracle that
    # interpolates in m is calibrated (NLL = entropy); the one that ignores m is worse
    from common.config.synthetic import SyntheticSpec
    from common.data.synthetic import generate_asset
    from common.special_tokens import NUM_SPECIAL_TOKENS
    from common.tokens.tokenizer import OHLCTokenizer

    spec = SyntheticSpec(assets=2, candles=5000, interval="1h", seasonality=0.0, categories=("crypto",), process="rich")
    assets = [generate_asset(spec, i) for i in range(2)]
    tok = OHLCTokenizer(vocab_size=1024, ret_bins=16).fit({a.symbol: a.candles.iloc[:3000] for a in assets})
    rho, mean, y = [], [], []
    for a in assets:
        tokens, (move_z, _) = tok.encode(a.candles), tok.features(a.candles)
        rows = np.arange(3000, 5000)
        log_close = np.log(a.candles["close"].to_numpy())
        r = log_close[rows] - log_close[rows - 1]
        sigma = a.truth["sigma"].to_numpy()[rows - 1]
        rho.append(sigma * move_z[rows] / r)
        mean.append(a.truth["mu"].to_numpy()[rows - 1] / sigma)
        y.append(tokens[rows].astype(np.int64) - NUM_SPECIAL_TOKENS)
    rho, mean, y = np.concatenate(rho), np.concatenate(mean), np.concatenate(y)
    assert np.abs(mean).max() > 0.3
    edges = (tok.move_binning.edges, tok.shape_binning.edges)
    p = bench_scaling.oracle_probs(rho, *edges, spec.nu, grid=40, draws=20_000, mean=mean)
    nll = -np.log(p[np.arange(len(y)), y])
    entropy = -(p * np.log(p)).sum(axis=1)
    assert abs(nll.mean() - entropy.mean()) < 3 * nll.std() / np.sqrt(len(y))
    blind = bench_scaling.oracle_probs(rho, *edges, spec.nu, grid=40, draws=20_000)
    assert nll.mean() < -np.log(blind[np.arange(len(y)), y]).mean() - 0.005


@pytest.mark.parametrize("with_mean", [False, True])
def test_the_oracle_gathers_each_targets_probability_in_chunks_as_from_its_full_distribution(with_mean):
    # the loss path reads each target's column from the table, 7 targets at a time: the same bits
    # as the full rows of oracle_probs, over all the chunks (the last one short)
    rng = np.random.default_rng(3)
    n = 50
    rho = np.exp(rng.normal(0, 0.4, n))
    mean = rng.normal(0, 0.5, n) if with_mean else None
    edges = (np.linspace(-2.5, 2.5, 7), np.linspace(0.5, 4.0, 3))
    y = rng.integers(0, 8 * 4, n)
    full = bench_scaling.oracle_probs(rho, *edges, 4.0, grid=12, draws=2000, mean=mean)
    gathered = scaling_floors.oracle_target_probs(rho, y, *edges, 4.0, grid=12, draws=2000, mean=mean, chunk=7)
    np.testing.assert_array_equal(gathered, full[np.arange(n), y])


def test_fit_recovers_a_known_optimum_and_its_form():
    n = np.array([0.17, 0.93, 5.0, 25.7] * 4) * 1e6
    d = np.repeat([0.038, 0.1, 0.3, 1.0], 4) * 1e6
    y = _predict(TRUE, n / 1e6, d / 1e6) + np.random.default_rng(1).normal(0, 2e-4, len(n))
    fit = fit_points(n, d, y, n_boot=3)
    assert fit.terms == ["A", "B", "C"]
    a, c = TRUE["a"], TRUE["c"]
    true_opt = 1e6 * (a * TRUE["A"] / (c * TRUE["C"])) ** (1 / (a + c)) * 0.1 ** (c / (a + c))
    assert fit.optimal_parameters(1e5) == pytest.approx(true_opt, rel=0.25)
    assert fit.optimal_parameters(1e7) > 3 * fit.optimal_parameters(1e5)  # more data, a larger model
    flat = fit_points(n, d, 0.3 + 0.01 * (d / 1e6) ** -0.3, n_boot=3)  # size does not matter
    assert "A" not in flat.terms and "C" not in flat.terms and flat.optimal_parameters(1e5) is None


def test_best_shape_follows_the_fit_and_prefers_the_smaller_of_equals():
    cfg = load_config(CASE_C)
    fit = ScalingFit(
        terms=["A", "B", "C"], coef=dict(TRUE), n_range=[1.5e5, 3e7], d_range=[3.8e4, 1e6], rmse=0.0, points=16
    )
    small, large = best_shape(cfg.model, cfg.data, 4e4, fit), best_shape(cfg.model, cfg.data, 1e6, fit)
    assert small["parameters"] < large["parameters"]
    assert (small["d_model"], small["num_layers"], small["num_heads"], small["d_ff"]) in SHAPES
    flat = ScalingFit(
        terms=["B"], coef={**TRUE, "A": 0.0, "C": 0.0}, n_range=[1.5e5, 3e7], d_range=[3.8e4, 1e6], rmse=0.0, points=16
    )
    # size does not matter: the smallest shape
    assert best_shape(cfg.model, cfg.data, 1e5, flat)["d_model"] == SHAPES[0][0]
    assert "extrapolated" in best_shape(cfg.model, cfg.data, 1e8, fit)["why"]


def test_size_auto_is_refused_for_fine_tuning():
    with pytest.raises(ConfigError, match="model.size"):
        load_config(CASE_C, ['model.size="auto"', 'training.init_from="somewhere"'])


def test_size_auto_trains_the_fitted_shape_and_logs_it(tmp_path, monkeypatch):
    import shutil

    fit = ScalingFit(
        terms=["A", "B", "C"],
        coef=dict(TRUE),
        n_range=[1.5e5, 3e7],
        d_range=[3.8e4, 1e6],
        rmse=0.0,
        points=16,
        source="a test fit",
        draws=[dict(TRUE)] * 40,
    )
    (tmp_path / "configs").mkdir()
    shutil.copy(CASE_C, tmp_path / "configs" / CASE_C.name)
    spec = {"assets": 2, "candles": 1500, "categories": ["crypto"], "seasonality": 0.0}
    sets = [
        'data.source="synthetic"',
        f"data.synthetic={json.dumps(spec)}",
        'data.interval="1h"',
        'data.start_date="2020-01-01"',
        "data.universe_counts={}",
        "model.context_length=32",
        'model.size="auto"',
        f'model.size_fit="{tmp_path / "sweep.json"}"',
        "tokenizer.ret_bins=16",
        "training.epochs=1",
        "training.max_steps_per_epoch=1",
        "training.eval_max_batches=1",
        "training.scorecard_origins=0",
        "training.vol_reversion=false",
        'training.device="cpu"',
        'experiment="auto"',
    ]
    missing = sets[:-1] + ['experiment="nofit"', "model.size_fit=null"]
    with pytest.raises(UserError, match="model.size_fit"):  # auto without a fit of this corpus
        train.run_training(tmp_path / "configs" / CASE_C.name, missing, out=open(tmp_path / "out.txt", "w"))
    cfg = load_config(CASE_C, sets)
    fit.corpus = corpus_of(cfg.model, cfg.data)
    (tmp_path / "sweep.json").write_text(json.dumps({"points": [], "fit": fit.to_dict()}))
    assert train.run_training(tmp_path / "configs" / CASE_C.name, sets, out=open(tmp_path / "out.txt", "w")) == 0
    (run,) = (tmp_path / "checkpoints").glob("auto_*")
    chosen = json.loads((run / "training_log.json").read_text())["model_size"]
    expected = best_shape(cfg.model, cfg.data, chosen["train_tokens"], fit, 2, 1)
    assert {k: chosen[k] for k in ("d_model", "num_layers", "parameters")} == {
        k: expected[k] for k in ("d_model", "num_layers", "parameters")
    }
    saved = load_config(run / "config.json")
    assert (saved.model.d_model, saved.model.num_layers) == (chosen["d_model"], chosen["num_layers"])
    assert "model.size = auto" in (tmp_path / "out.txt").read_text()


def test_plan_suggests_the_fitted_shape_in_one_line():
    import common.commands.plan as plan
    from common.commands.plan_figures import DataFigures

    cfg = load_config(CASE_C)
    fit = ScalingFit(
        terms=["A", "B", "C"],
        coef=dict(TRUE),
        n_range=[1.5e5, 3e7],
        d_range=[3.8e4, 1e6],
        rmse=0.0,
        points=16,
        draws=[dict(TRUE)] * 40,
    )
    data = DataFigures({"train": 38_000, "val": 8_000, "test": 8_000}, 37_000, 2_300, "exact (a test)", 13, 4)
    p = plan.build_plan(cfg, data)
    # and how to make one
    assert "no scaling fit for this corpus" in plan.scaling_suggestion(cfg.model, cfg.data, p, None)
    line = plan.scaling_suggestion(cfg.model, cfg.data, p, fit, Path("sweep.json"))
    chosen = best_shape(cfg.model, cfg.data, 38_000, fit, 13, 4)
    assert "\n" not in line and f"d_model {chosen['d_model']}," in line and f"{p.parameters:,}" in line
    assert "model.size=auto" in line and "extrapolated" not in line


def test_fit_command_writes_a_fit_only_when_the_points_support_one(tmp_path):
    def point(size, n, d, excess):
        loss = {"model": 4.8 + excess, "unigram": 5.0, "oracle": 4.8}
        split = {
            "loss": loss,
            "skill_vs_unigram": {"value": 5.0 - loss["model"], "ci95": [0.0, 0.3]},
            "gap_closed": (0.2 - excess) / 0.2,
            "gap_closed_ci95": [(0.1 - excess) / 0.2, (0.3 - excess) / 0.2],
        }
        return {
            "corpus": "synthetic",
            "size": size,
            "parameters": n,
            "train_tokens": d,
            "planned_steps": 200,
            "steps": 200,
            "best_epoch": 10,
            "epochs_run": 14,
            "wall_s": 1.0,
            "val": split,
            "test": split,
        }

    sizes = {"0.2M": 1.7e5, "0.9M": 9.3e5, "5.0M": 5.0e6, "26M": 2.6e7}
    grid = [point(s, n, d, 0.05 + 0.02 * (n / 1e6) ** -0.5) for s, n in sizes.items() for d in (4e4, 1e5, 3e5)]
    # a point the budget stopped while still improving is an upper bound: left out of the fit
    grid.append({**point("26M", 2.6e7, 1e6, 0.5), "best_epoch": 40, "epochs_run": 40})
    results = tmp_path / "grid.json"
    results.write_text(json.dumps({"points": grid}))
    assert bench_scaling.write_fit([results], out=tmp_path / "fit.json") == 0
    fit = ScalingFit.from_dict(json.loads((tmp_path / "fit.json").read_text()))
    assert "A" in fit.terms and fit.loss(2.6e7, 1e5) < fit.loss(1.7e5, 1e5)  # bigger is better, as made
    assert fit.points == 12
    assert (tmp_path / "scaling_all.png").is_file()
    flat = tmp_path / "flat.json"
    flat.write_text(json.dumps({"points": [point(s, n, d, 0.1) for s, n in sizes.items() for d in (4e4, 1e5)]}))
    assert bench_scaling.write_fit([flat], out=tmp_path / "none.json") == 0
    assert not (tmp_path / "none.json").exists()  # no dependence: no fit to advise with


def test_nested_corpora_grow_by_assets_and_score_the_same_first_ones(tmp_path):
    """--nested: a larger synthetic corpus holds a smaller one's assets unchanged (more assets of
    one length), and every point is scored on the same first assets."""
    from common.config.synthetic import SyntheticSpec
    from common.data.synthetic import generate_asset

    def spec(tokens: int) -> SyntheticSpec:
        (text,) = [
            s.split("=", 1)[1]
            for s in bench_scaling._data_sets("synthetic", tokens, nested=True)
            if s.startswith("data.synthetic=")
        ]
        d = json.loads(text)
        return SyntheticSpec(**{**d, "categories": tuple(d["categories"])})

    small, large = spec(bench_scaling.SAMPLE_TRAIN), spec(10 * bench_scaling.SAMPLE_TRAIN)
    assert (small.assets, large.assets) == (8, 80) and small.candles == large.candles
    assert generate_asset(small, 7).candles.equals(generate_asset(large, 7).candles)
    # the smoke's sizes (300 test candles an asset, 2 scored): 3 assets trained, the first 2 scored
    point = bench_scaling.run_point(
        "synthetic", "toy", 3 * bench_scaling.NESTED_TRAIN, min_steps=4, max_steps=4, smoke=True, nested=True
    )
    assert point["nested"] and point["scored_assets"] == 2 and point["train_tokens"] > 2 * bench_scaling.NESTED_TRAIN
    assert point["test"]["targets"] == 2 * 300 and 2 * 290 < point["val"]["targets"] <= 2 * 300  # not 3 assets
    assert 0 < point["test"]["loss"]["oracle"] < point["test"]["loss"]["unigram"]


def test_the_committed_fit_loads_and_suggests_a_listed_shape():
    """common/model/scaling_fit.json (written by bench_scaling.py --fit from the CPU grid) is a
    fit that plan and model.size = "auto" can use: terms the points supported, a shape of SHAPES."""
    from common.model.scaling_fit import load_fit

    fit = load_fit()
    assert fit is not None and fit.terms and set(fit.terms) <= {"A", "B", "C"} and fit.points >= 4
    cfg = load_config(CASE_C)
    choice = best_shape(cfg.model, cfg.data, 1_090_000, fit, 20, 1)
    assert (choice["d_model"], choice["num_layers"], choice["num_heads"], choice["d_ff"]) in SHAPES
    assert "extrapolated" in choice["why"]  # case C's candles lie above the grid's largest corpus


def test_the_filter_finds_the_true_scale_when_there_is_no_regime_to_infer():
    """With stress_vol 1 the regimes are one, and the GARCH variance is a function of the past
    returns: the Kim filter's scale of each candle converges to the generator's."""
    from common.config.synthetic import SyntheticSpec
    from common.data.synthetic import generate_asset

    import scaling_floors

    spec = SyntheticSpec(
        assets=1, candles=3000, interval="1h", seasonality=0.0, gap_prob=0.0, stress_vol=1.0, categories=("crypto",)
    )
    asset = generate_asset(spec, 0)
    r2, loglik = scaling_floors._candle_observer(asset.candles, spec.nu, range_density.range_table(20_000))
    weights, scales = scaling_floors.kim_filter(r2, loglik, spec)
    truth = asset.truth["sigma"].to_numpy()[:-1]  # row t: the scale of candle t + 1
    assert np.allclose(weights[2:].sum(axis=1), 1.0)
    assert np.allclose(scales[1000:, 0], truth[999:], rtol=1e-3)
    # with regimes, it cannot know them: its scale errs, but it still tracks the truth
    stressed = dataclasses.replace(spec, stress_vol=2.0)
    asset = generate_asset(stressed, 0)
    r2, loglik = scaling_floors._candle_observer(asset.candles, spec.nu, range_density.range_table(20_000))
    weights, scales = scaling_floors.kim_filter(r2, loglik, stressed)
    mean_scale = (weights * scales)[1000:].sum(axis=1)
    truth = asset.truth["sigma"].to_numpy()[999:-1]
    assert not np.allclose(mean_scale, truth, rtol=1e-3)
    assert np.corrcoef(np.log(mean_scale), np.log(truth))[0, 1] > 0.8


def test_a_corpus_a_few_percent_outside_the_fitted_span_is_not_extrapolation():
    # the same corpus's training tokens move by a fraction of a percent with purge and context
    fit = ScalingFit(
        terms=["B"], coef={**TRUE, "A": 0.0, "C": 0.0}, n_range=[1.5e5, 3e7], d_range=[37_992, 1e6], rmse=0.0, points=10
    )
    assert fit.in_range(37_921) and fit.in_range(1.04e6) and fit.in_range(5e5)
    assert not fit.in_range(30_000) and not fit.in_range(1.2e6)
