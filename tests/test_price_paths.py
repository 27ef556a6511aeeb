"""common.forecasting.price_paths on constructed paths whose answers are known by hand."""

import numpy as np
import pytest

from common.errors import UserError
from common.forecasting.price_paths import (
    barrier_outcomes,
    barrier_probabilities,
    barrier_probability_table,
    brier_score,
    drawdown_summary,
    max_drawdown,
    parse_barriers,
    price_sequence,
)


def test_parse_barriers():
    assert parse_barriers("+5%,-3%") == pytest.approx((0.05, -0.03))
    assert parse_barriers(" 2.5% , -.5% ") == pytest.approx((0.025, -0.005))


@pytest.mark.parametrize(
    "text, needle",
    [
        ("-3%,+5%", "upper barrier must be above 0%"),
        ("+5%,+3%", "below 0%"),
        ("0%,-3%", "above 0%"),
        ("5,-3", "two percentages"),
        ("+5%", "two percentages"),
        ("+5%,-3%,1%", "two percentages"),
        ("abc", "two percentages"),
        ("+5%,-120%", "above -100%"),
    ],
)
def test_bad_barriers_say_what_to_pass(text, needle):
    with pytest.raises(UserError, match=needle):
        parse_barriers(text)


def test_closes_only_upper_first_lower_first_neither():
    close = np.array(
        [
            [100, 101, 105, 99, 97, 100],  # +5% at step 2, -3% at step 4: upper first
            [100, 99, 97, 106, 100, 100],  # -3% at step 2 first
            [100, 104.9, 97.1, 103, 98, 100],  # touches neither
            [100, 100, 100, 100, 100, 110],  # +10% at the last step
        ]
    )
    res = barrier_outcomes(close, 0.05, -0.03)
    assert res["outcome"].tolist() == [1, -1, 0, 1]
    assert res["step"].tolist() == [2, 2, 0, 5]
    assert not res["same_candle"].any()
    p = barrier_probabilities(res)
    assert p == {"p_upper_first": 0.5, "p_lower_first": 0.25, "p_neither": 0.25, "p_same_candle": 0.0}


def test_highs_and_lows_touch_what_the_closes_miss():
    close = np.array([[100, 101, 100]])
    high = np.array([[106, 101]])  # step 1 wick reaches +6%
    low = np.array([[99, 99]])
    assert barrier_outcomes(close, 0.05, -0.03)["outcome"].tolist() == [0]
    res = barrier_outcomes(close, 0.05, -0.03, high=high, low=low)
    assert res["outcome"].tolist() == [1] and res["step"].tolist() == [1]


def test_a_candle_spanning_both_barriers_is_ordered_by_its_direction():
    close = np.array([[100, 101], [100, 99]])
    high, low = np.array([[106], [106]]), np.array([[96], [96]])
    res = barrier_outcomes(close, 0.05, -0.03, high=high, low=low)
    # up candle: open -> low -> high -> close, so the lower barrier first; down candle the other way
    assert res["outcome"].tolist() == [-1, 1]
    assert res["same_candle"].tolist() == [True, True]
    assert price_sequence(close, high, low).tolist() == [[100, 96, 106, 101], [100, 106, 96, 99]]


def test_a_gap_open_counts_before_the_candles_range():
    close, high, low = np.array([[100, 95]]), np.array([[105.5]]), np.array([[95]])
    open_ = np.array([[105.5]])  # gapped up to +5.5%, then fell to a -5% close
    assert price_sequence(close, high, low, open_).tolist() == [[100, 105.5, 105.5, 95, 95]]
    assert barrier_outcomes(close, 0.05, -0.03, high=high, low=low, open_=open_)["outcome"].tolist() == [1]


def test_max_drawdown_from_the_running_peak():
    close = np.array(
        [
            [100, 110, 99, 120, 108],  # 110 -> 99: 10%; 120 -> 108: 10%
            [100, 90, 95, 80, 100],  # 100 -> 80: 20%
            [100, 101, 102, 103, 104],  # never falls
        ]
    )
    np.testing.assert_allclose(max_drawdown(close), [0.10, 0.20, 0.0])
    high = np.array([[125, 110, 120, 120]])  # a wick to 125 at step 1 makes the later 99 a 20.8% fall
    low = np.array([[100, 99, 99, 108]])
    np.testing.assert_allclose(max_drawdown(close[:1], high, low), [1 - 99 / 125])


def test_drawdown_summary():
    d = np.linspace(0, 0.3, 101)  # 0, 0.003, ..., 0.3
    s = drawdown_summary(d)
    assert s["mean"] == pytest.approx(0.15) and s["p50"] == pytest.approx(0.15)
    assert s["p90"] == pytest.approx(0.27) and s["p99"] == pytest.approx(0.297)
    assert s["p_gt_5pct"] == pytest.approx(84 / 101)  # d = 0.003 k > 0.05 for k = 17..100
    assert s["p_gt_20pct"] == pytest.approx(34 / 101)  # k = 67..100
    assert set(s) == {"mean", "p50", "p90", "p99", "p_gt_2pct", "p_gt_5pct", "p_gt_10pct", "p_gt_20pct"}


def test_barrier_probabilities_match_a_random_walk_simulation():
    # driftless symmetric walk of +-1% log steps: P(+5% before -5%) is 1/2 by symmetry
    rng = np.random.default_rng(0)
    steps = rng.choice([-0.01, 0.01], size=(20000, 400))
    close = 100 * np.exp(np.concatenate([np.zeros((20000, 1)), np.cumsum(steps, axis=1)], axis=1))
    p = barrier_probabilities(barrier_outcomes(close, np.exp(0.0499) - 1, np.exp(-0.0499) - 1))
    assert p["p_upper_first"] == pytest.approx(0.5, abs=0.02)
    assert p["p_upper_first"] + p["p_lower_first"] + p["p_neither"] == pytest.approx(1)


def test_barrier_probability_table_from_log_returns_and_its_brier_score():
    up, down, flat = np.log([1.01, 1.06, 1.0]), np.log([0.99, 0.96, 1.0]), np.log([1.01, 1.02, 1.01])
    r = np.array([[up, up, down, flat], [flat, flat, flat, flat]])  # (2 origins, 4 samples, 3 steps)
    probs = barrier_probability_table(r, 0.05, -0.03)
    np.testing.assert_allclose(probs, [[0.5, 0.25, 0.25], [0, 0, 1]])
    # origin 0 went up first: (0.5 - 1)^2 + 0.25^2 + 0.25^2; origin 1 touched neither: a perfect 0
    np.testing.assert_allclose(brier_score(probs, np.array([1, 0])), [0.375, 0.0])
    assert brier_score(np.array([[1.0, 0, 0]]), np.array([-1]))[0] == 2.0  # sure and wrong: the worst
