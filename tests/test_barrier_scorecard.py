"""The scorecard's barrier part: Brier scores of P(upper first), P(lower first), P(neither)."""

from __future__ import annotations

import numpy as np
import pytest

from common.cli import main
from common.evaluation.price_baselines import RandomWalkEWMA
from common.evaluation.scorecard import ScorecardSettings, make_scorecard

from scorecard_helpers import synthetic_series

SIGMA = 0.01


def _walk(scale: float):
    """A forecaster of iid normal log-return paths with sd scale * SIGMA per step."""

    def fn(histories, horizon, n_samples, seed):
        steps = np.random.default_rng(seed).normal(0, scale * SIGMA, (len(histories), n_samples, horizon))
        return np.cumsum(steps, axis=2)

    return fn


def _series(seed: int = 0):
    rng = np.random.default_rng(seed)
    return synthetic_series([rng.normal(0, SIGMA, 1500) for _ in range(3)], train_frac=0.3)


def test_a_forecaster_that_never_moves_scores_two_wherever_a_barrier_was_touched():
    flat = lambda histories, horizon, n_samples, seed: np.zeros((len(histories), n_samples, horizon))  # noqa: E731
    card = make_scorecard(
        _series(),
        flat,
        ScorecardSettings(interval="1d", horizons=[1, 5], stride=5, n_samples=10, n_boot=50, barrier=(0.01, -0.01)),
        baselines={"rw_ewma": RandomWalkEWMA()},
    )
    bc = card["barrier"]
    assert bc["prices"] == "close" and bc["upper"] == 0.01 and bc["lower"] == -0.01
    for h in ("1", "5"):
        hc = bc["horizons"][h]
        r = hc["realized"]
        assert r["upper_first"] + r["lower_first"] + r["neither"] == pytest.approx(1)
        assert 0 < r["neither"] < 1
        # P(neither) = 1 for every origin: 0 where neither happened, 2 where one did
        assert hc["brier"]["model"] == pytest.approx(2 * (1 - r["neither"]))
        assert hc["skill"]["rw_ewma"]["value"] < 0  # the random walk's spread does better
    assert card["horizons"]["5"]["n"] == bc["horizons"]["5"]["n"]  # no gap rows here: every origin scored
    assert any("Barrier +1.0%/-1.0% at H=5" in line for line in card["barrier_lines"])


def test_the_true_process_beats_an_overdispersed_one_and_no_barrier_means_no_card():
    series = _series(1)
    card = make_scorecard(
        series,
        _walk(1.0),
        ScorecardSettings(interval="1d", horizons=[5], stride=3, n_samples=200, n_boot=200, barrier=(0.02, -0.015)),
        baselines={"wide": _walk(3.0)},
    )
    hc = card["barrier"]["horizons"]["5"]
    assert hc["brier"]["model"] < hc["brier"]["wide"]
    assert hc["skill"]["wide"]["verdict"] == "beats"
    plain = make_scorecard(
        series,
        _walk(1.0),
        ScorecardSettings(interval="1d", horizons=[5], stride=3, n_samples=20, n_boot=20),
        baselines={"wide": _walk(3.0)},
    )
    assert "barrier" not in plain and "barrier_lines" not in plain


@pytest.mark.parametrize("text, needle", [("-3%,+5%", "above 0%"), ("5,-3", "two percentages")])
def test_scorecard_refuses_a_bad_barrier_in_one_line(tmp_path, capsys, text, needle):
    assert main(["scorecard", str(tmp_path), f"--barrier={text}"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and needle in err[0] and "--barrier" in err[0]
