"""Foundation-model baselines (common.evaluation.foundation_baselines): tiny randomly initialised
Chronos-Bolt, Chronos-2 and TimesFM 2.5 models built with the libraries' own classes, saved to a folder, and
run through the real adapter path into a scorecard, offline. CI installs the `foundation` extra."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from common.errors import UserError
from common.evaluation.foundation_baselines import load_foundation_baseline, paths_from_quantiles
from common.evaluation.price_baselines import RandomWalkEWMA
from common.evaluation.scorecard import ScorecardSettings, make_scorecard
from common.forecasting.forecast_io import History

from tests.foundation_helpers import tiny_chronos, tiny_chronos2, tiny_timesfm
from tests.scorecard_helpers import candles_from_returns, garch_returns, synthetic_series


@pytest.fixture(scope="module")
def chronos_dir(tmp_path_factory) -> str:
    return tiny_chronos(tmp_path_factory.mktemp("bolt"))


@pytest.fixture(scope="module")
def timesfm_dir(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:  # the tiny definition, while this module's tests load it
        yield tiny_timesfm(tmp_path_factory.mktemp("timesfm"), mp)


def test_paths_follow_the_quantiles_with_one_uniform_per_path():
    q = np.tile(100 * np.exp(np.linspace(-0.1, 0.1, 9)), (2, 3, 1))  # 2 origins, 3 steps
    q[:, 2] = 100 * np.exp(np.linspace(-0.3, 0.3, 9))  # a wider last step
    paths = paths_from_quantiles(q, np.array([100.0, 100.0]), n_samples=4000, seed=0)
    assert paths.shape == (2, 4000, 3)
    assert np.median(paths[0, :, 0]) == pytest.approx(0.0, abs=0.01)
    assert paths[..., 2].min() >= -0.3 - 1e-9 and paths[..., 2].max() <= 0.3 + 1e-9
    ranks = np.argsort(np.argsort(paths[0], axis=0), axis=0)
    assert (ranks[:, 0] == ranks[:, 2]).all()  # a path keeps its percentile across steps
    assert (paths == paths_from_quantiles(q, np.array([100.0, 100.0]), 4000, 0)).all()


def test_tiny_models_run_into_the_scorecard(chronos_dir, timesfm_dir, tmp_path):
    chronos = load_foundation_baseline("chronos", chronos_dir)
    chronos2 = load_foundation_baseline("chronos", tiny_chronos2(tmp_path / "chronos2"))
    tfm = load_foundation_baseline("timesfm", timesfm_dir)
    rng = np.random.default_rng(0)
    hist = [History("A0", candles_from_returns(garch_returns(100, rng))) for _ in range(3)]
    for fn in (chronos, chronos2, tfm):
        paths = fn(hist, 5, 20, 0)
        assert paths.shape == (3, 20, 5) and np.isfinite(paths).all()
    card = make_scorecard(
        synthetic_series([garch_returns(400, rng)]),
        RandomWalkEWMA(),
        ScorecardSettings(interval="1d", horizons=[1, 5], stride=40, n_samples=20, n_boot=50),
        baselines={"rw_ewma": RandomWalkEWMA(), "chronos": chronos, "chronos2": chronos2, "timesfm": tfm},
    )
    names = ("chronos", "chronos2", "timesfm")
    assert set(names) <= set(card["baselines"])
    assert all(np.isfinite(card["horizons"]["5"]["crps"][k]) for k in names)


def test_missing_weights_and_unknown_kind_are_user_errors(tmp_path):
    with pytest.raises(UserError, match="no such folder"):
        load_foundation_baseline("chronos", str(tmp_path / "nothing"))
    with pytest.raises(UserError, match="no such folder"):
        load_foundation_baseline("chronos", "nobody/not-cached-model")
    with pytest.raises(UserError, match="no such folder"):
        load_foundation_baseline("timesfm", "nobody/not-cached-model")
    with pytest.raises(UserError, match="unknown kind"):
        load_foundation_baseline("prophet", "x")


@pytest.mark.parametrize("kind, module", [("chronos", "chronos"), ("timesfm", "timesfm")])
def test_a_missing_extra_says_how_to_install_it(monkeypatch, kind, module):
    monkeypatch.setitem(sys.modules, module, None)  # import fails as if not installed
    with pytest.raises(UserError, match=r"pip install -e '\.\[foundation\]'"):
        load_foundation_baseline(kind, "x")


def test_nan_gaps_are_dropped_from_the_context(chronos_dir):
    frame = candles_from_returns(np.zeros(80))
    frame.iloc[10:20] = np.nan
    paths = load_foundation_baseline("chronos", chronos_dir)([History("A0", frame)], 2, 5, 0)
    assert np.isfinite(paths).all()
