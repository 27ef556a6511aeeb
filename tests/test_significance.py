"""The scorecard's significance tests: Diebold-Mariano with the HLN correction (size near nominal on
the scorecard's own design, power where one forecaster is better, the formula by hand and against
statsmodels), Holm's adjustment, and arch's model confidence set on constructed losses."""

from __future__ import annotations

import math

import numpy as np
import pytest

from common.evaluation.significance import (
    MCS_MIN_DATES,
    date_sums,
    diebold_mariano,
    family_verdict,
    hln_factor,
    holm,
    long_run_variance,
    model_confidence_set,
    overlap_steps,
)

from tests.scorecard_helpers import garch_returns


def _scorecard_design(rng: np.random.Generator, skill: float, n: int = 150, h: int = 20, stride: int = 5):
    """test_metrics' scorecard-like design: 20-step horizons every 5th candle of GARCH(1,1)-t returns,
    a model whose loss ratio to the baseline's moves with the shared steps; expected loss ratio 1 - skill."""
    sd = 0.2
    origins = np.arange(n) * stride
    path = np.concatenate([[0.0], np.cumsum(garch_returns(n * stride + h, rng))])
    noise = np.concatenate([[0.0], np.cumsum(rng.normal(size=n * stride + h))])
    base = np.abs(path[origins + h] - path[origins]) + 0.005  # a CRPS-like loss of the H-step return
    eta = (noise[origins + h] - noise[origins]) / math.sqrt(h) * sd  # N(0, sd^2), overlapping like the returns
    return (1 - skill) * base * np.exp(eta - sd**2 / 2), base


def test_hln_factor_and_statistic_by_hand():
    assert hln_factor(10, 3) == pytest.approx(math.sqrt((10 + 1 - 6 + 3 * 2 / 10) / 10))  # sqrt(0.56)
    assert hln_factor(10, 1) == pytest.approx(math.sqrt(1 - 1 / 10))  # h = 1: sqrt((n - 1) / n)
    assert hln_factor(3, 3) is None  # n + 1 - 2h + h(h-1)/n = 0: too short for the horizon
    d = np.array([1.0, 2.0, 3.0, 3.0, 0.5])  # model minus baseline: mean 1.9, deviations -0.9 0.1 1.1 1.1 -1.4
    g0 = (0.81 + 0.01 + 1.21 + 1.21 + 1.96) / 5  # 1.04
    g1 = (-0.9 * 0.1 + 0.1 * 1.1 + 1.1 * 1.1 + 1.1 * -1.4) / 5  # -0.062
    v = g0 + 2 * g1  # h = 2: one autocovariance, full weight
    assert long_run_variance(d, 1) == pytest.approx(v)
    assert long_run_variance(d, 1, "bartlett") == pytest.approx(g0 + g1)  # weight 1 - 1/2
    dm_hand = 1.9 / math.sqrt(v / 5) * math.sqrt((5 + 1 - 4 + 2 / 5) / 5)
    from scipy.stats import t

    out = diebold_mariano(d, np.zeros(5), 2)
    assert out["statistic"] == pytest.approx(dm_hand) and out["p_value"] == pytest.approx(2 * t.sf(dm_hand, 4))
    assert out["lags"] == 1 and out["n_dates"] == 5 and out["mean_diff"] == pytest.approx(1.9)


def test_dm_variance_matches_statsmodels_hac():
    import statsmodels.api as sm  # the reference; installed with arch

    rng = np.random.default_rng(0)
    d = 0.1 + np.convolve(rng.normal(size=204), np.ones(5), "valid")  # MA(4): a 5-step horizon's overlap
    for h in (1, 3, 5):
        ref = sm.OLS(d, np.ones(len(d))).fit(
            cov_type="HAC", cov_kwds={"maxlags": h - 1, "kernel": "uniform", "use_correction": False}
        )
        out = diebold_mariano(d, np.zeros(len(d)), h)
        assert out["statistic"] == pytest.approx(ref.tvalues[0] * hln_factor(len(d), h), rel=1e-9)


def test_dm_falls_back_to_newey_west_when_the_truncated_variance_is_not_positive():
    d = np.tile([1.0, -1.0], 10) + 0.1  # alternating: a strongly negative first autocovariance
    assert long_run_variance(d, 1) < 0
    out = diebold_mariano(d, np.zeros(len(d)), 2)
    assert out["variance"] == "bartlett" and out["statistic"] > 0 and out["p_value"] is not None
    assert diebold_mariano(np.ones(5), np.ones(5), 1)["p_value"] is None  # no difference: untestable
    assert diebold_mariano(np.ones(1), np.zeros(1), 1)["statistic"] is None


def test_dm_size_is_near_nominal_on_the_scorecard_design():
    """Equal expected loss: the p-values are about uniform, rejections near 5%. Newey-West (Bartlett)
    weights with the same lags would under-count the overlap and reject more often."""
    rng = np.random.default_rng(0)
    h = overlap_steps(20, 5)
    p, p_bartlett = [], []
    for _ in range(300):
        model, base = _scorecard_design(rng, 0.0)
        p.append(diebold_mariano(model, base, h)["p_value"])
        d = model - base
        stat = d.mean() / math.sqrt(long_run_variance(d, h - 1, "bartlett") / len(d)) * hln_factor(len(d), h)
        from scipy.stats import t

        p_bartlett.append(2 * t.sf(abs(stat), len(d) - 1))
    p, p_bartlett = np.array(p), np.array(p_bartlett)
    assert 0.02 <= (p < 0.05).mean() <= 0.09, (p < 0.05).mean()  # 0.047 here; 0.043 to 0.073 with seeds 1, 2
    assert 0.05 <= (p < 0.10).mean() <= 0.16 and 0.35 <= np.median(p) <= 0.65
    assert (p_bartlett < 0.05).mean() > (p < 0.05).mean()


def test_dm_finds_a_clearly_better_forecaster():
    rng = np.random.default_rng(1)
    h = overlap_steps(20, 5)
    for _ in range(10):
        model, base = _scorecard_design(rng, 0.30)  # 30% lower expected loss
        out = diebold_mariano(model, base, h)
        assert out["statistic"] < 0 and out["p_value"] < 0.01, out
        worse = diebold_mariano(base, model, h)  # swapped: the same test, the other sign
        assert worse["statistic"] == pytest.approx(-out["statistic"]) and worse["p_value"] == pytest.approx(
            out["p_value"]
        )
    p10 = np.array([diebold_mariano(*_scorecard_design(rng, 0.10), h)["p_value"] for _ in range(50)])
    assert (p10 < 0.05).mean() > 0.5  # 10% lower loss: found most of the time (74 of 100 with seed 1)
    assert family_verdict(-1.0, 0.01) == "beats" and family_verdict(1.0, 0.01) == "worse"
    assert family_verdict(-1.0, 0.2) == "no edge" and family_verdict(None, None) == "no edge"


def test_holm_matches_statsmodels():
    from statsmodels.stats.multitest import multipletests

    p = [0.01, 0.04, 0.03, 0.20, 0.005, 0.049]
    assert holm(p) == pytest.approx(list(multipletests(p, method="holm")[1]))
    assert holm([0.01, None, 0.02]) == pytest.approx([0.02, None, 0.02])  # None: not in the family
    assert holm([]) == []


def test_overlap_and_date_sums():
    assert (
        overlap_steps(20, 5) == 4 and overlap_steps(5, 5) == 1 and overlap_steps(5, 1) == 5 and overlap_steps(1, 7) == 1
    )
    np.testing.assert_allclose(date_sums(np.array([1.0, 2.0, 3.0, 4.0]), np.array([20, 10, 20, 30])), [2.0, 4.0, 4.0])


def test_the_model_confidence_set_keeps_the_best():
    rng = np.random.default_rng(2)
    n = 300
    common = rng.gamma(2.0, 1.0, n)  # losses move together, as on shared dates
    losses = {
        "best": common + rng.normal(0, 0.3, n),
        "near": common + 0.02 + rng.normal(0, 0.3, n),
        "worse": common + 0.4 + rng.normal(0, 0.3, n),
        "worst": common + 0.8 + rng.normal(0, 0.3, n),
    }
    out = model_confidence_set(losses, block=3, reps=500, seed=0)
    assert "best" in out["included"] and not {"worse", "worst"} & set(out["included"]), out
    assert out["pvalues"]["best"] > 0.1 and out["pvalues"]["worst"] < 0.1 and out["alpha"] == 0.1
    assert model_confidence_set(losses, block=3, reps=500, seed=0) == out  # seeded: reproducible
    short = model_confidence_set({k: v[: MCS_MIN_DATES - 1] for k, v in losses.items()}, block=3, reps=50, seed=0)
    assert short["included"] is None and "too few" in short["note"]
    twins = model_confidence_set(
        {"a": losses["best"], "b": losses["best"].copy(), "c": losses["near"]}, block=3, reps=50, seed=0
    )
    assert twins["included"] is None and "constant" in twins["note"]
