"""PIT uniformity per forecaster and horizon (a Wald test with a block-bootstrap covariance over
dates, for overlapping horizons and assets that move together) and the calibrated forecaster's PIT."""

from __future__ import annotations

import json

import numpy as np
from scipy.stats import norm

from common.evaluation.calibration import calibrated_pit_card
from common.evaluation.pit import GRID_EDGES, TEST_BINS, calibrated_grid_bins, grid_bins, pit_bins, pit_uniformity
from common.forecasting.calibrated import conformity_scores, load_calibration


def _overlapping(seed: int, n_dates: int = 300, n_assets: int = 4, horizon: int = 5):
    """(dates, y) of H-step returns at EVERY date (origins overlap H - 1 days) of assets sharing a
    market factor; each day's return is N(0, 1), so y ~ N(0, H)."""
    rng = np.random.default_rng(seed)
    market = rng.standard_normal(n_dates + horizon)
    daily = 0.6 * market[:, None] + 0.8 * rng.standard_normal((n_dates + horizon, n_assets))
    y = np.stack([daily[t + 1 : t + 1 + horizon].sum(0) for t in range(n_dates - 1)])  # (dates, assets)
    dates = np.repeat(np.arange(n_dates - 1), n_assets)
    return dates, y.ravel()


def _test(pit: np.ndarray, dates: np.ndarray) -> dict:
    out = pit_uniformity(pit_bins(pit, TEST_BINS), np.full(TEST_BINS, 1 / TEST_BINS), dates, horizon=5, stride=1)
    assert out is not None and out["df"] == TEST_BINS - 1 and out["every"] == 5  # horizons that do not overlap
    return out


def test_a_calibrated_forecaster_passes_and_an_over_confident_one_fails():
    passed, failed = 0, 0
    for seed in range(40):  # a 5% test: a calibrated forecaster still fails about 1 card in 20
        dates, y = _overlapping(seed)
        passed += _test(norm.cdf(y / np.sqrt(5)), dates)["uniform"]  # the true distribution
        failed += not _test(norm.cdf(y / (0.7 * np.sqrt(5))), dates)["uniform"]  # 30% too narrow
    assert passed >= 34 and failed >= 38, (passed, failed)


def test_too_few_dates_give_no_test():
    assert pit_uniformity(np.zeros(9, int), np.full(10, 0.1), np.arange(9), horizon=1, stride=1) is None


def test_the_calibrated_grid_reads_which_intervals_leave_the_outcome_out():
    assert grid_bins(np.array([0.01, 0.05, 0.3, 0.6, 0.97, 1.0])).tolist() == [0, 1, 3, 4, 7, 7]
    scores = {90: np.array([0.2, -0.1, -0.5, 0.3]), 80: np.array([0.3, 0.1, -0.4, 0.4]), 50: np.array([1, 1, -0.1, 1])}
    bins = calibrated_grid_bins(scores, {90: 0.0, 80: 0.0, 50: 0.0}, np.array([False, False, True, True]))
    assert bins.tolist() == [0, 1, 4, 7]  # out of all, inside 90 only, inside 50 above, out of all above
    assert calibrated_grid_bins(scores, {90: 0.25, 80: 0.35, 50: 1.0}, np.array([False] * 4)).tolist() == [3, 3, 3, 1]


def test_the_calibration_makes_an_over_confident_forecasters_pit_uniform(tmp_path):
    # the CQR adjustment that fixes a forecaster 30% too narrow: each end moves out by the gap
    # between the true and the narrow quantile
    q = {lv: float(norm.ppf((1 + lv / 100) / 2) * 0.3 * np.sqrt(5)) for lv in (50, 80, 90)}
    (tmp_path / "calibration.json").write_text(
        json.dumps(
            {
                "horizons": [1, 2, 3, 4, 5],
                "levels": [50, 80, 90],
                "adjustments": {str(h): {str(k): v for k, v in q.items()} for h in range(1, 6)},
                "sampling": {"temperature": 1.0, "top_k": None, "top_p": None},
            }
        )
    )
    cal = load_calibration(tmp_path)
    passed, failed = 0, 0
    for seed in range(10):
        dates, y = _overlapping(seed)
        samples = np.random.default_rng(seed).standard_normal((len(y), 200)) * 0.7 * np.sqrt(5)
        stats = {
            "pit": (samples < y[:, None]).mean(1),
            "median": np.median(samples, 1),
            **{f"score{k}": v for k, v in conformity_scores(samples, y).items()},
        }
        card = calibrated_pit_card(cal, stats, y, dates, horizon=5, stride=1)
        assert card is not None and card["edges"] == list(GRID_EDGES) and abs(sum(card["calibrated"]) - 1) < 1e-9
        assert card["raw"][0] + card["raw"][-1] > 0.15  # the raw ends are hit far more than 5% + 5%
        passed += card["test_calibrated"]["uniform"]
        failed += not card["test_raw"]["uniform"]
    assert passed >= 8 and failed >= 9, (passed, failed)
    assert calibrated_pit_card(None, stats, y, dates, horizon=5, stride=1) is None
