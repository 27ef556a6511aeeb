"""The observable oracle of the rich market (common/evaluation/observable_oracle.py): calibrated on the tokens
the market makes, between the full-information oracle and the unigram, strictly causal."""

from __future__ import annotations

import dataclasses
import json
import math
import sys

import numpy as np
import pytest

import common.commands.train  # noqa: F401  (at collection: its import chain probes a socket)
from common.config.synthetic import SyntheticSpec
from common.data.synthetic import generate_asset
from common.data.synthetic_rich import regimes
from common.evaluation import observable_oracle
from common.forecasting.forecast_io import History
from common.paths import REPO_ROOT
from common.special_tokens import NUM_SPECIAL_TOKENS
from common.tokens.tokenizer import OHLCTokenizer

sys.path.insert(0, str(REPO_ROOT / "bench"))
import sweep_floor  # noqa: E402

import scaling_floors  # noqa: E402

SPEC = SyntheticSpec(assets=2, candles=3000, interval="1h", categories=("crypto",), process="rich", daily_vol=0.04)


def test_the_transition_matrix_is_the_chains():
    spec = SyntheticSpec(process="rich", p_stress=0.2, p_calm=0.3)
    flips = np.random.default_rng(0).random(200_000)
    levels = regimes(spec, flips)
    state = np.searchsorted(np.unique(levels), levels)
    counts = np.zeros((3, 3))
    np.add.at(counts, (state[:-1], state[1:]), 1)
    trans = observable_oracle.transition_matrix(spec)
    np.testing.assert_allclose(trans.sum(axis=1), 1.0)
    np.testing.assert_allclose(counts / counts.sum(axis=1, keepdims=True), trans, atol=0.01)


def test_the_pair_density_has_student_t_marginals():
    corr, marginal = observable_oracle.pair_correction(5.0, 0.5)
    z = observable_oracle.Z_KNOTS
    exact = math.lgamma(3) - math.lgamma(2.5) - 0.5 * math.log(5 * math.pi) - 3 * np.log1p(z * z / 5)
    np.testing.assert_allclose(marginal, exact, atol=1e-6)
    assert corr[150, 90] < 0 < corr[150, 150]  # z = 3 with 3 likelier than with -3: the shared factor
    assert np.abs(observable_oracle.pair_correction(5.0, 0.0)[0]).max() < 1e-9


def _tokens_and_truth():
    assets = [generate_asset(SPEC, i) for i in range(2)]
    tok = OHLCTokenizer(vocab_size=1024, ret_bins=16).fit({a.symbol: a.candles.iloc[:2000] for a in assets})
    rows = np.arange(2000, 3000)
    out = []
    for a in assets:
        tokens, (move_z, _) = tok.encode(a.candles), tok.features(a.candles)
        log_close = np.log(a.candles["close"].to_numpy())
        s_e = (log_close[rows] - log_close[rows - 1]) / move_z[rows]
        y = tokens[rows].astype(np.int64) - NUM_SPECIAL_TOKENS
        sigma = a.truth["sigma"].to_numpy()[rows - 1]
        train = tokens[50:2000].astype(np.int64) - NUM_SPECIAL_TOKENS
        out.append({"asset": a, "s_e": s_e, "y": y, "log_rho": np.log(sigma / s_e), "train": train})
        out[-1]["m"] = a.truth["mu"].to_numpy()[rows - 1] / sigma
    return tok, rows, out


def test_the_observable_oracle_is_calibrated_and_lies_between_the_oracle_and_the_unigram():
    # tokens drawn by the generator: the mean NLL equals the mean entropy of the predictions when
    # they are the true predictive distributions; knowing less than the full oracle, it loses more
    tok, rows, data = _tokens_and_truth()
    edges = (tok.move_binning.edges, tok.shape_binning.edges)
    log_rho = np.concatenate([d["log_rho"] for d in data])
    mean = np.concatenate([d["m"] for d in data])
    cube = scaling_floors.observable_cube(SPEC, log_rho, mean, edges, grid=60, draws=20_000)
    for i, d in enumerate(data):  # the leader, then its follower (filtered with the leader)
        leader = data[0]["asset"].candles if i else None
        nll, entropy = [], []
        for r, w, log_sd, m in observable_oracle.components(
            SPEC, d["asset"].candles, rows, leader, particles=64, seed=i, chunk=100
        ):
            at = r - rows[0]
            p = scaling_floors.observable_probs(cube, w, log_sd, m, d["s_e"][at])
            np.testing.assert_allclose(p.sum(axis=1), 1.0)
            nll.append(-np.log(p[np.arange(len(at)), d["y"][at]]))
            entropy.append(-(p * np.log(p)).sum(axis=1))
            at_y = scaling_floors.observable_probs(cube, w, log_sd, m, d["s_e"][at], d["y"][at])
            np.testing.assert_allclose(at_y, p[np.arange(len(at)), d["y"][at]])
        nll, entropy = np.concatenate(nll), np.concatenate(entropy)
        assert abs(nll.mean() - entropy.mean()) < 3 * nll.std() / np.sqrt(len(nll))
        full = -np.log(
            scaling_floors.oracle_target_probs(np.exp(d["log_rho"]), d["y"], *edges, SPEC.nu, 40, 20_000, d["m"])
        )
        unigram = (np.bincount(d["train"], minlength=cube[0].shape[2]) + 0.5) / (len(d["train"]) + 0.5 * 256)
        assert full.mean() < nll.mean() < -np.log(unigram[d["y"]]).mean() - 0.05


def test_the_observable_oracle_is_causal():
    # a forecast for candle t reads candles < t only: rewrite every candle from 800 on (the
    # follower's and its leader's) and the forecasts for 500 and 800 are the same bits
    follower, leader = generate_asset(SPEC, 1).candles, generate_asset(SPEC, 0).candles
    rows = np.array([500, 800, 1000])

    def forecasts(candles, lead):
        return [x for chunk in observable_oracle.components(SPEC, candles, rows, lead, particles=32) for x in chunk]

    changed = [frame.copy() for frame in (follower, leader)]
    rng = np.random.default_rng(1)
    for frame in changed:
        frame.iloc[800:, :4] = frame.iloc[800:, :4].to_numpy() * np.exp(rng.normal(0, 0.05, (len(frame) - 800, 1)))
    before, after = forecasts(follower, leader), forecasts(*changed)
    np.testing.assert_array_equal(before[0], after[0])
    for b, a in zip(before[1:], after[1:]):
        np.testing.assert_array_equal(b[:2], a[:2])  # rows 500 and 800
        assert not np.array_equal(b[2], a[2])  # row 1000 saw the change


def test_the_scorecards_oracle_forecasts_each_origin_from_the_candles_before_it():
    spec = dataclasses.replace(SPEC, candles=400)
    gen = {i: generate_asset(spec, i).candles for i in range(2)}
    fn = observable_oracle.forecaster(spec, particles=16)

    def history(i, n):
        return History(spec.symbol(i), gen[i].iloc[:n])

    out = fn([history(1, 300), history(0, 250), history(1, 200)], 3, 8, 1)
    assert out.shape == (3, 8, 3) and np.isfinite(out).all()
    # the follower's origins: its filter (over its candles and its leader's) is seeded by its index, 1
    follower = observable_oracle.paths(spec, gen[1], np.array([200, 300]), 3, 8, gen[0], 16, 1)
    np.testing.assert_array_equal(out[0], follower[300])
    np.testing.assert_array_equal(out[2], follower[200])
    # asked alone, after its filter has passed the origin: the same bits
    np.testing.assert_array_equal(fn([history(1, 200)], 3, 8, 1)[0], out[2])
    np.testing.assert_array_equal(fn([history(0, 250)], 3, 8, 1)[0], out[1])
    # causal: every candle from the origin on rewritten, the follower's and its leader's: the same forecast
    changed = {i: frame.copy() for i, frame in gen.items()}
    rng = np.random.default_rng(1)
    for frame in changed.values():
        frame.iloc[300:, :4] = frame.iloc[300:, :4].to_numpy() * np.exp(rng.normal(0, 0.05, (len(frame) - 300, 1)))
    again = observable_oracle.forecaster(spec, particles=16, candles=changed)(
        [history(1, 300), history(1, 350)], 3, 8, 1
    )
    np.testing.assert_array_equal(again[0], out[0])
    assert not np.array_equal(again[1], fn([history(1, 350)], 3, 8, 1)[0])  # an origin after the change sees it
    with pytest.raises(ValueError, match="end before the horizon"):
        fn([history(0, 399)], 3, 8, 1)


def test_a_rich_runs_scorecard_has_the_oracle_as_its_ceiling(tmp_path):
    from common.evaluation.scorecard import observable_ceiling

    doc = json.loads((REPO_ROOT / "case_c_crypto" / "configs" / "sweep_rich.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps(doc))
    assert list(observable_ceiling(tmp_path, "1h")) == ["observable_oracle"]
    assert observable_ceiling(tmp_path, "4h") == {}  # another interval is the market aggregated: not modelled
    doc["data"]["synthetic"]["process"] = "garch"
    (tmp_path / "config.json").write_text(json.dumps(doc))
    assert observable_ceiling(tmp_path, "1h") == {}


def test_marketgpt_scorecard_of_a_rich_run_holds_the_model_against_the_oracle(tmp_path, capsys):
    from common.cli import main

    (tmp_path / "configs").mkdir()
    config = tmp_path / "configs" / "rich.json"
    config.write_text((REPO_ROOT / "case_c_crypto" / "configs" / "sweep_rich.json").read_text())
    sets = [
        'data.synthetic={"assets": 2, "candles": 1200, "process": "rich", "categories": ["crypto"], "daily_vol": 0.04}',
        "model.d_model=16",
        "model.num_layers=1",
        "model.num_heads=1",
        "model.d_ff=32",
        "training.epochs=1",
        "training.max_steps_per_epoch=2",
        "training.eval_max_batches=1",
        'experiment="rich_toy"',
    ]
    assert main(["train", "--config", str(config), *[a for kv in sets for a in ("--set", kv)]]) == 0
    (run,) = (tmp_path / "checkpoints").glob("rich_toy_*")
    capsys.readouterr()
    assert main(["scorecard", str(run), "--origins", "3", "--samples", "20", "--horizons", "1,5"]) == 0
    out = capsys.readouterr().out
    assert "Observable oracle (the best forecast from the candles seen) at H=5: CRPS " in out
    card = json.loads((run / "scorecard.json").read_text())
    ceiling = card["horizons"]["1"]["ceiling"]["observable_oracle"]
    assert ceiling["best_baseline"] in card["baselines"] and "observable_oracle" not in card["baselines"]
    assert ceiling["crps"] > 0 and card["ceiling_lines"][0] in out


def test_a_market_the_oracle_does_not_model_is_refused():
    with pytest.raises(ValueError, match="without gaps"):
        next(observable_oracle.components(SyntheticSpec(process="garch"), generate_asset(SPEC, 0).candles, [5]))
    with pytest.raises(ValueError, match="without gaps"):
        observable_oracle.forecaster(dataclasses.replace(SPEC, gap_prob=0.1))


def test_the_floor_gives_the_share_of_the_gap_to_the_observable_oracle():
    point = {
        "point": "p",
        "parameters": 1,
        "train_tokens": 1,
        "test_loss": 4.8,
        "skill_vs_unigram": 0.04,
        "skill_vs_unigram_ci95": [0.03, 0.05],
        "still_improving": False,
    }
    row = sweep_floor.gap_closed(point, 4.6, 4.7)
    unigram = 4.8 / 0.96
    assert row["gap_closed"] == pytest.approx((unigram - 4.8) / (unigram - 4.6))
    assert row["gap_closed_observable"] == pytest.approx((unigram - 4.8) / (unigram - 4.7))
    assert row["unreachable_share"] == pytest.approx(0.1 / (unigram - 4.6))
    assert row["gap_closed_observable_ci95"][0] < row["gap_closed_observable"] < row["gap_closed_observable_ci95"][1]
    assert "gap_closed_observable" not in sweep_floor.gap_closed(point, 4.6)


def test_the_oracle_paths_are_calibrated_at_every_horizon_and_causal():
    """paths(): simulated from the filtered state, the realized 1- and 5-candle returns of the
    leader and of its follower fall in the paths' 90% bands about 90% of the time, their PIT
    centred; and a rewrite of the candles from a row on changes none of that row's paths."""
    leader, follower = generate_asset(SPEC, 0).candles, generate_asset(SPEC, 1).candles
    rows = np.arange(400, 2900, 10)
    for candles, lead in ((leader, None), (follower, leader)):
        drawn = observable_oracle.paths(SPEC, candles, rows, 5, 400, lead, particles=64, seed=2)
        log_close = np.log(candles["close"].to_numpy())
        for h in (1, 5):
            y = log_close[rows - 1 + h] - log_close[rows - 1]
            pit = np.array([(drawn[r][:, h - 1] < y[i]).mean() for i, r in enumerate(rows)])
            inside = ((pit > 0.05) & (pit < 0.95)).mean()
            assert abs(inside - 0.9) < 0.05 and abs(pit.mean() - 0.5) < 0.06, (h, inside, pit.mean())
    changed = follower.copy()
    changed.iloc[1000:, :4] = changed.iloc[1000:, :4].to_numpy() * 1.3
    before = observable_oracle.paths(SPEC, follower, np.array([1000]), 5, 50, leader, particles=32)
    after = observable_oracle.paths(SPEC, changed, np.array([1000]), 5, 50, leader, particles=32)
    np.testing.assert_array_equal(before[1000], after[1000])


def test_the_scorecard_share_is_one_at_the_oracle_and_zero_at_the_best_baseline():
    import bench_oracle_scorecard as card

    rng = np.random.default_rng(0)
    n = 200
    best, oracle = rng.uniform(1.0, 2.0, n), rng.uniform(0.5, 1.0, n)
    dates = np.repeat(np.arange(50), 4)

    def seed(model):
        crps = {"model": model, "garch": best, "har": best + 0.3, card.ORACLE: oracle}
        return {"dates": {h: dates.tolist() for h in card.HORIZONS}, "crps": {h: crps for h in card.HORIZONS}}

    for model, want in ((oracle, 1.0), (best, 0.0), ((best + oracle) / 2, 0.5)):
        r = card.shares([seed(model), seed(model)], n_boot=50)[1]
        assert r["best_baseline"] == "garch" and r["share"] == pytest.approx(want)
        assert r["ci95"][0] <= want + 1e-9 and r["ci95"][1] >= want - 1e-9 and r["origins"] == 2 * n
