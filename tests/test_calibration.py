"""Split-conformal calibration: fitted on val only, nominal coverage on held-out test, applied by forecast."""

from __future__ import annotations

import json
import math
import shutil

import numpy as np
import pandas as pd
import pytest

from common.errors import UserError
from common.evaluation.asset_series import AssetSeries
from common.evaluation.calibration import (
    MIN_VAL_ORIGINS,
    cqr_adjustment,
    fit_calibration,
    val_series,
    write_calibration,
)
from common.evaluation.price_baselines import RandomWalkEWMA
from common.evaluation.scorecard import ScorecardSettings, make_scorecard
from common.forecasting.calibrated import calibrate_table, conformity_scores, load_calibration
from common.run.files import CALIBRATION_JSON

from scorecard_helpers import candles_from_returns

SIGMA = 0.01  # the returns' standard deviation


def t_returns(n: int, rng: np.random.Generator, nu: float = 4.0) -> np.ndarray:
    """iid Student-t returns scaled to standard deviation SIGMA: fat tails a normal misses."""
    return SIGMA * rng.standard_t(nu, n) * math.sqrt((nu - 2) / nu)


def three_way(returns: list[np.ndarray], purge: int = 30) -> list[AssetSeries]:
    """train 40%, purge, val 30%, purge, test: the run's split with its gaps."""
    out = []
    for k, r in enumerate(returns):
        frame = candles_from_returns(r)
        n = len(frame)
        c1, c2 = int(0.4 * n), int(0.7 * n)
        out.append(AssetSeries(f"A{k}", "synthetic", frame, range(0, c1), range(c2 + purge, n), range(c1 + purge, c2)))
    return out


class Overconfident:
    """Normal paths with half the true volatility, and a log of the last candle of each history."""

    def __init__(self) -> None:
        self.last_seen: list[pd.Timestamp] = []

    def __call__(self, histories, horizon, n_samples, seed):
        self.last_seen += [h.candles.index[-1] for h in histories]
        steps = np.random.default_rng(seed).normal(0, 0.5 * SIGMA, (len(histories), n_samples, horizon))
        return np.cumsum(steps, axis=2)


def test_cqr_rank_is_the_finite_sample_one():
    scores = np.arange(1.0, 20.0)  # n = 19: ceil(20 * 0.9) = 18th smallest
    assert cqr_adjustment(scores[::-1], 90) == 18.0
    assert cqr_adjustment(scores, 50) == 10.0  # ceil(20 * 0.5) = 10
    with pytest.raises(UserError, match="5 validation origins cannot calibrate a 90% interval"):
        cqr_adjustment(np.ones(5), 90)
    samples = np.tile(np.linspace(-1, 1, 101), (3, 1))  # the 90% interval is [-0.9, 0.9]
    s = conformity_scores(samples, np.array([0.0, 1.2, -0.9]))["90"]
    assert s == pytest.approx([-0.9, 0.3, 0.0])


def test_calibration_brings_an_overconfident_forecaster_to_nominal_coverage_on_test(tmp_path):
    rng = np.random.default_rng(0)
    series = three_way([t_returns(3000, rng) for _ in range(6)])
    fc = Overconfident()
    content = fit_calibration(series, fc, horizon=5, stride=5, n_samples=200, seed=1)
    assert content["horizons"] == [1, 2, 3, 4, 5] and content["split"] == "val"
    assert content["val_coverage_raw"]["1"]["90"] < 0.75  # over-confident on val
    assert all(content["adjustments"][str(h)]["90"] > 0 for h in range(1, 6))  # so the ends move out
    write_calibration(content, tmp_path)
    cal = load_calibration(tmp_path)
    card = make_scorecard(
        series,
        fc,
        ScorecardSettings(interval="1d", horizons=[1, 5], stride=5, n_samples=200, n_boot=20),
        baselines={"rw_ewma": RandomWalkEWMA()},
        calibration=cal,
    )
    for h in ("1", "5"):
        hc = card["horizons"][h]
        n = hc["n"]
        assert set(hc["coverage_calibrated"]) == {"50", "80", "90", "95"}
        for level in (50, 80, 90, 95):
            p = level / 100
            assert hc["coverage"]["model"][str(level)] < p - 0.1  # raw: well under
            # calibrated: nominal within 4 standard errors of the test share and of the val fit's
            tol = 4 * math.sqrt(p * (1 - p) * (1 / n + 1 / content["n_origins"][h]))
            assert hc["coverage_calibrated"][str(level)] == pytest.approx(p, abs=tol), (h, level)
    assert card["calibration"]["coverage_calibrated"] == card["horizons"]["1"]["coverage_calibrated"]
    assert card["calibration"]["calibrated_by"]["split"] == "val"
    assert json.loads(json.dumps(card))  # JSON-ready
    # no calibration: reported as null beside the raw coverage
    plain = make_scorecard(
        series,
        fc,
        ScorecardSettings(interval="1d", horizons=[1], stride=20, n_samples=20, n_boot=20),
        baselines={"rw_ewma": RandomWalkEWMA()},
    )
    assert plain["calibration"]["coverage_calibrated"] is None and plain["calibration"]["calibrated_by"] is None


def test_nothing_from_the_test_split_is_used():
    rng = np.random.default_rng(1)
    series = three_way([t_returns(600, rng) for _ in range(3)])
    fc = Overconfident()
    content = fit_calibration(series, fc, horizon=4, stride=2, n_samples=50, seed=0)
    val_end = min(s.candles.index[s.val.stop - 1] for s in series)
    test_start = min(s.candles.index[s.test.start] for s in series)
    # the spy: every history ends inside the val split, well before the test split
    assert fc.last_seen and max(fc.last_seen) <= val_end < test_start
    assert pd.Timestamp(content["dates"]["last_candle_read"]) <= val_end
    assert pd.Timestamp(content["test_starts"]) == test_start
    # by construction: the fit's candles stop at the val split's last row
    assert all(v.candles.index[-1] == s.candles.index[s.val.stop - 1] for v, s in zip(val_series(series), series))
    # and test candles replaced by garbage change nothing
    spoiled = []
    for s in series:
        frame = s.candles.copy()
        frame.iloc[s.val.stop :] = frame.iloc[s.val.stop :] * 50.0
        spoiled.append(AssetSeries(s.symbol, s.category, frame, s.train, s.test, s.val))
    again = fit_calibration(spoiled, Overconfident(), horizon=4, stride=2, n_samples=50, seed=0)
    assert again["adjustments"] == content["adjustments"] and again["n_origins"] == content["n_origins"]


def test_no_validation_split_or_too_few_origins_is_refused():
    rng = np.random.default_rng(2)
    series = three_way([t_returns(400, rng)])
    no_val = [AssetSeries(s.symbol, s.category, s.candles, s.train, s.test) for s in series]
    with pytest.raises(UserError, match="has no validation split .* data.val_ratio"):
        fit_calibration(no_val, Overconfident(), horizon=2, source="RUN")
    with pytest.raises(UserError, match=f"origins with a close 1 bars later, {MIN_VAL_ORIGINS} needed"):
        fit_calibration(series, Overconfident(), horizon=2, stride=10)  # 90 val rows: 9 origins


def table(p: dict[int, float], steps: int = 2) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "symbol": "A",
            "step": np.arange(1, steps + 1),
            "last_close": 100.0,
            **{f"p{k}": v for k, v in p.items()},
            "p_up": 0.5,
        }
    )


def write_cal(folder, adjustments: dict[int, dict[int, float]], **extra) -> None:
    (folder / CALIBRATION_JSON).write_text(
        json.dumps(
            {
                "horizons": sorted(adjustments),
                "levels": [50, 80, 90],
                "adjustments": {str(h): {str(k): v for k, v in a.items()} for h, a in adjustments.items()},
                "sampling": {"temperature": 1.0, "top_k": None, "top_p": None},
                **extra,
            }
        )
    )


def test_calibrate_table_moves_the_ends_and_keeps_the_quantiles_in_order(tmp_path):
    write_cal(tmp_path, {1: {50: 0.0, 80: 0.1, 90: 0.2}, 2: {50: 0.5, 80: -0.01, 90: 0.0}})
    cal = load_calibration(tmp_path)
    raw = table({5: 90.0, 10: 95.0, 25: 98.0, 50: 100.0, 75: 102.0, 90: 105.0, 95: 110.0})
    out = calibrate_table(raw, cal)
    row = out.iloc[0]
    assert row["p5"] == pytest.approx(90 * math.exp(-0.2)) and row["p95"] == pytest.approx(110 * math.exp(0.2))
    assert row["p10"] == pytest.approx(95 * math.exp(-0.1)) and row["p25"] == 98.0 and row["p50"] == 100.0
    # step 2: the 50% interval widened past the 80% one: sorted back into order
    cols = ["p5", "p10", "p25", "p50", "p75", "p90", "p95"]
    assert np.all(np.diff(out[cols].to_numpy(), axis=1) >= 0)
    assert out.iloc[1]["p5"] == pytest.approx(98 * math.exp(-0.5)) and out.iloc[1]["p10"] == 90.0
    assert raw.iloc[0]["p5"] == 90.0  # the input is not changed


def test_a_calibration_that_does_not_fit_the_forecast_is_refused(tmp_path):
    with pytest.raises(UserError, match="calibration.json not found; fit it .* `marketgpt calibrate"):
        load_calibration(tmp_path)
    (tmp_path / CALIBRATION_JSON).write_text("{not json")
    with pytest.raises(UserError, match="is damaged .*`marketgpt calibrate"):
        load_calibration(tmp_path)
    write_cal(tmp_path, {1: {50: 0.0, 80: 0.0, 90: 0.0}, 3: {50: 0.0, 80: 0.0, 90: 0.0}})  # step 2 missing
    with pytest.raises(UserError, match="is damaged"):
        load_calibration(tmp_path)
    write_cal(tmp_path, {1: {50: 0.0, 80: 0.0, 90: 0.1}}, checkpoint_sha256="a" * 64)
    cal = load_calibration(tmp_path)
    own = {"temperature": 1.0, "top_k": None, "top_p": None}
    cal.check_forecast(1, own, "a" * 64)
    with pytest.raises(UserError, match="covers steps 1..1, not --horizon 2"):
        cal.check_forecast(2, own, None)
    with pytest.raises(UserError, match="fitted with top_k None, not 5"):
        cal.check_forecast(1, {**own, "top_k": 5}, None)
    with pytest.raises(UserError, match="another best_model.pt"):
        cal.check_forecast(1, own, "b" * 64)


# ---------------------------------------------------------------------- the commands on a trained run


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    from test_forecast import TINY, train_tiny

    return train_tiny(tmp_path_factory.mktemp("cal"), TINY)[1]


def _main(capsys, *args) -> tuple[int, str, str]:
    from common.cli import main

    code = main([str(a) for a in args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _one_line(code: int, err: str, command: str, *needles: str) -> None:
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith(f"marketgpt {command}: error: "), err
    for needle in needles:
        assert needle in lines[0], lines[0]


def test_calibrate_then_forecast_calibrated_and_the_scorecard_reports_it(run_dir, tmp_path, capsys):
    code, out, err = _main(capsys, "forecast", run_dir, "--symbols", "AAPL", "--horizon", "3", "--calibrated")
    _one_line(code, err, "forecast", "calibration.json not found", f"marketgpt calibrate {run_dir}")

    code, out, err = _main(capsys, "calibrate", run_dir, "--horizon", "3", "--stride", "2", "--samples", "16")
    assert code == 0, err
    assert "Calibrated on the validation split" in out and "H=1: raw 90% interval covered" in out
    content = json.loads((run_dir / CALIBRATION_JSON).read_text())
    assert content["horizons"] == [1, 2, 3] and content["levels"] == [50, 80, 90, 95] and content["split"] == "val"
    assert len(content["checkpoint_sha256"]) == 64 and content["n_origins"]["3"] >= MIN_VAL_ORIGINS
    assert pd.Timestamp(content["dates"]["last_candle_read"]) < pd.Timestamp(content["test_starts"])

    args = ["forecast", run_dir, "--symbols", "AAPL", "--horizon", "3", "--samples", "32"]
    assert _main(capsys, *args, "--out", tmp_path / "raw")[0] == 0
    code, out, err = _main(capsys, *args, "--out", tmp_path / "cal", "--calibrated")
    assert code == 0, err
    raw, cal = (pd.read_parquet(tmp_path / d / "forecast.parquet") for d in ("raw", "cal"))
    expect = calibrate_table(raw, load_calibration(run_dir))
    pd.testing.assert_frame_equal(cal, expect)
    assert json.loads((tmp_path / "cal" / "forecast.json").read_text())["calibration"]["split"] == "val"
    code, _, err = _main(capsys, *args, "--horizon", "4", "--calibrated")
    _one_line(code, err, "forecast", "covers steps 1..3, not --horizon 4")
    code, _, err = _main(capsys, *args, "--top-k", "5", "--calibrated")
    assert code == 2 and "fitted with top_k None, not 5" in err

    code, out, err = _main(capsys, "scorecard", run_dir, "--horizons", "1,3", "--origins", "3", "--samples", "8")
    assert code == 0, err
    card = json.loads((run_dir / "scorecard.json").read_text())
    assert set(card["calibration"]["coverage_calibrated"]) == {"50", "80", "90", "95"}
    pit = card["calibration"]["pit_calibrated"]  # the calibrated PIT on its grid, beside the raw one's
    assert len(pit["calibrated"]) == len(pit["raw"]) == len(pit["expected"]) == 8
    assert abs(sum(pit["calibrated"]) - 1) < 1e-9
    assert card["calibration"]["calibrated_by"]["dates"] == content["dates"]


def test_calibrate_refuses_a_run_without_a_validation_split_or_too_few_origins(run_dir, tmp_path, capsys):
    code, _, err = _main(capsys, "calibrate", run_dir, "--horizon", "3", "--stride", "1000")
    _one_line(code, err, "calibrate", "origins with a close 1 bars later", f"{MIN_VAL_ORIGINS} needed")
    copy = run_dir.parent / "tiny_noval"
    shutil.copytree(run_dir, copy)
    (copy / CALIBRATION_JSON).unlink(missing_ok=True)  # the test before may have fitted one
    index = json.loads((copy / "tokens" / "index.json").read_text())
    index["ranges"] = [[train, [val[0], val[0]], test] for train, val, test in index["ranges"]]
    (copy / "tokens" / "index.json").write_text(json.dumps(index))
    code, _, err = _main(capsys, "calibrate", copy)
    _one_line(code, err, "calibrate", "has no validation split", "data.val_ratio")
    assert not (copy / CALIBRATION_JSON).exists()


def test_an_onnx_export_needs_the_runs_calibration_copied_in(tmp_path):
    from common.commands.forecast import ForecastRequest, _calibration

    req = ForecastRequest(run_dirs=(tmp_path,), backend="onnx", calibrated=True)
    with pytest.raises(UserError, match="has no calibration.json; copy the run's"):
        _calibration(req, [tmp_path], None)
    write_cal(tmp_path, {h: {50: 0.0, 80: 0.0, 90: 0.1} for h in range(1, 25)})
    assert _calibration(req, [tmp_path], type("Fc", (), {"checkpoint_sha256": None})()).horizons[-1] == 24
