"""`marketgpt scorecard RUN_DIR` end to end on a tiny trained run, and the small scorecard every
run writes at the end of training (training.scorecard_*): written before test_results.json,
recomputed by --resume auto when missing, switched off by training.scorecard_origins=0."""

from __future__ import annotations

import json

import pytest

from common.cli import main
from common.evaluation import scorecard
from common.run.folder import has_final_outputs

from foundation_helpers import tiny_chronos
from test_forecast import TINY as FORECAST_TINY, train_tiny

pytestmark = pytest.mark.filterwarnings("ignore:A test tried to use socket.socket")

# test_forecast's tiny run, with a small end-of-training scorecard on
TINY = json.loads(json.dumps(FORECAST_TINY))
TINY["training"].update(scorecard_origins=3, scorecard_samples=8)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    return train_tiny(tmp_path_factory.mktemp("sc"), TINY)


def _card(run) -> dict:
    return json.loads((run / "scorecard.json").read_text())


def test_training_ends_with_a_small_scorecard(trained):
    _, run = trained
    card = _card(run)
    assert card["samples"] == 8 and sorted(card["horizons"], key=int) == ["1", "5", "20"]
    assert card["horizons"]["1"]["n_dates"] <= 3 and (run / "scorecard.png").is_file()
    assert card["headline"]["horizon"] == 1 and card["headline"]["baseline"] in card["baselines"]
    assert card["precision"] == "fp32"  # the precision it trained in (the CPU's)
    assert "scorecard_error" not in json.loads((run / "test_results.json").read_text())
    # written before test_results.json, the output whose presence says the run is complete
    assert (run / "scorecard.json").stat().st_mtime_ns <= (run / "test_results.json").stat().st_mtime_ns


def test_cli_scores_the_run_and_prints_one_verdict_per_horizon_and_baseline(trained, capsys):
    _, run = trained
    code = main(
        [
            "scorecard",
            str(run),
            "--horizons",
            "1,3",
            "--origins",
            "4",
            "--samples",
            "16",
            "--assets",
            "AAPL,^GSPC",
            "--seed",
            "3",
            "--cost-bp",
            "5",
            "--precision",
            "bf16",
        ]
    )
    out, err = capsys.readouterr()
    assert code == 0, err
    verdicts = [line for line in out.splitlines() if line.startswith("H=")]
    assert len(verdicts) == 2 * 5 and all(v.endswith(("(beats)", "(no edge)", "(worse)")) for v in verdicts)
    assert "origins" in err  # progress goes to stderr, the verdicts alone to stdout
    card = _card(run)
    assert card["verdicts"] == verdicts and card["samples"] == 16 and card["seed"] == 3
    assert card["precision"] == "bf16"
    assert card["origins"]["assets"] == 2 and card["backtest"]["cost_bp"] == 5
    assert set(card["horizons"]["1"]["by_asset"]) <= {"AAPL", "^GSPC"}  # an origin date may be a holiday
    assert card["horizons"]["1"]["skill"]["crps"]["garch"]["verdict"] in ("beats", "no edge", "worse")


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--horizons", "1,x"], "--horizons '1,x'"),
        (["--horizons", "0"], "--horizons '0'"),
        (["--stride", "0"], "--stride 0: must be at least 1"),
        (["--stride", "2", "--origins", "3"], "not both"),
        (["--samples", "1"], "--samples 1"),
        (["--assets", "NOPE"], "unknown assets NOPE"),
        (["--cost-bp", "-1"], "--cost-bp -1"),
        (["--precision", "half"], "--precision 'half'"),
        (["--baseline", "prophet:x"], "--baseline 'prophet:x': expected KIND:ID_OR_PATH"),
        (["--baseline", "chronos"], "--baseline 'chronos': expected KIND:ID_OR_PATH"),
        (["--baseline", "chronos:/no/such/model"], "no such folder and not in the Hugging Face cache"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(trained, capsys, args, needle):
    _, run = trained
    before = (run / "scorecard.json").read_bytes()
    code = main(["scorecard", str(run), "--origins" if "--stride" not in args else "--seed", "2", *args])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith("marketgpt scorecard: error: "), err
    assert needle in err[0], err[0]
    assert (run / "scorecard.json").read_bytes() == before  # nothing half-written in its place


def test_foundation_baselines_join_the_fitted_ones(trained, tmp_path, capsys):
    _, run = trained
    model = tiny_chronos(tmp_path / "chronos-tiny")
    code = main(
        [
            "scorecard",
            str(run),
            "--horizons",
            "1,3",
            "--origins",
            "3",
            "--samples",
            "8",
            "--baseline",
            f"chronos:{model}",
        ]
    )
    out, err = capsys.readouterr()
    assert code == 0, err
    card = _card(run)
    assert set(card["baselines"]) == {"rw_ewma", "bootstrap", "garch", "har", "log_har", "chronos:chronos-tiny"}
    assert "chronos:chronos-tiny" in card["horizons"]["3"]["skill"]["crps"]
    assert any("chronos:chronos-tiny" in line for line in out.splitlines())


def test_a_folder_that_is_no_run_is_one_line(tmp_path, capsys):
    assert main(["scorecard", str(tmp_path / "nope")]) == 2
    assert "no such run folder" in capsys.readouterr().err


def test_resume_recomputes_a_missing_scorecard_or_skips_it_when_switched_off(trained, capsys):
    config, run = trained
    for name in ("scorecard.json", "scorecard.png", "test_results.json"):  # killed in the final outputs
        (run / name).unlink()
    assert not has_final_outputs(run)
    assert main(["train", "--config", str(config), "--resume", "auto"]) == 0
    assert _card(run)["samples"] == 8 and has_final_outputs(run)
    assert "Scorecard (3 origin dates, 8 samples" in capsys.readouterr().out

    for name in ("scorecard.json", "scorecard.png", "test_results.json"):
        (run / name).unlink()
    assert main(["train", "--config", str(config), "--resume", "auto", "--set", "training.scorecard_origins=0"]) == 0
    assert has_final_outputs(run) and not (run / "scorecard.json").exists()


def test_a_failing_scorecard_is_recorded_and_does_not_fail_the_run(trained, monkeypatch, capsys):
    config, run = trained
    (run / "test_results.json").unlink()

    def broken(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(scorecard, "run_scorecard", broken)
    assert main(["train", "--config", str(config), "--resume", "auto"]) == 0
    results = json.loads((run / "test_results.json").read_text())
    assert results["scorecard_error"] == "OSError: disk full"
    assert "scorecard.json not written (OSError: disk full)" in capsys.readouterr().err
    assert has_final_outputs(run)  # so --resume auto does not retry it forever


def test_the_end_of_training_scorecard_reports_progress_and_keeps_to_its_budget(trained, capsys):
    import io

    import torch

    from common.config import load_config
    from common.evaluation.final_scorecard import end_of_training_scorecard

    _, run = trained
    cfg = load_config(run / "config.json", ["training.scorecard_budget=5"])
    log = io.StringIO()
    assert end_of_training_scorecard(cfg.training, run, torch.device("cpu"), out=log) is None
    lines = log.getvalue().splitlines()
    card = _card(run)
    assert card["origins"]["budget"] == 5 and card["horizons"]["1"]["n"] <= 5
    # the progress lines in the job log (stdout), as the standalone command writes them on stderr
    assert any(x.startswith("Scorecard: origins 1-") for x in lines), lines
    assert any("forecasts over the budget of 5" in x for x in lines) and card["origins"]["drawn"] in log.getvalue()


def test_a_runs_series_read_their_candles_when_used_and_keep_only_the_last_few(trained, monkeypatch):
    """The scorecard of a 10^8-candle run must not hold every asset's candles: each series reads
    and cleans its asset when used (equal to training's cleaned frames) and the run keeps the last
    ones up to LazyCandles.KEPT_ROWS candles (here one asset and a half), the last one always."""
    import pandas as pd

    from common.config import load_config
    from common.data.loading import load_market_data
    from common.data.prepare import prepare_data
    from common.evaluation.asset_series import LazyCandles, series_from_run

    _, run = trained
    cfg = load_config(run / "config.json")
    prepared = prepare_data(cfg.data, cfg.model.context_length, load_market_data(cfg.data, run.parent.parent))
    series, _ = series_from_run(run)
    assert len(series) == len(prepared.assets) >= 2
    default = LazyCandles.KEPT_ROWS
    bound = len(prepared.candles[series[0].symbol]) * 3 // 2
    monkeypatch.setattr(LazyCandles, "KEPT_ROWS", bound)
    recent = series[0].candles._recent
    assert len(recent) == 0  # nothing read yet
    for s in series:
        pd.testing.assert_frame_equal(s.candles.iloc[:], prepared.candles[s.symbol])
        assert len(s.candles) == len(prepared.candles[s.symbol])
        assert sum(len(f) for f in recent.values()) <= bound or len(recent) == 1
        assert list(recent)[-1] == s.symbol
    assert len(recent) < len(series)
    # under the default bound a small run's assets are each read once, whatever the passes over them
    reads: list[str] = []
    series, _ = series_from_run(run)
    monkeypatch.setattr(LazyCandles, "KEPT_ROWS", default)
    for s in series:
        load = s.candles._load
        s.candles._load = lambda load=load, name=s.symbol: reads.append(name) or load()
    for _ in range(3):
        for s in series:
            s.candles["close"]
    assert sorted(reads) == sorted(s.symbol for s in series)


def test_forecast_batches_hold_at_most_so_many_candles(monkeypatch):
    import numpy as np

    from common.evaluation import walk_forward

    monkeypatch.setattr(walk_forward, "_BATCH", 3)
    monkeypatch.setattr(walk_forward, "_BATCH_CANDLES", 10)
    lengths = np.array([4, 4, 4, 1, 1, 1, 1, 30, 2])
    every = np.arange(len(lengths))  # each origin its own date
    assert walk_forward._batches(lengths, every) == [(0, 2), (2, 5), (5, 7), (7, 8), (8, 9)]
    assert walk_forward._batches(np.array([1] * 7), np.arange(7)) == [(0, 3), (3, 6), (6, 7)]  # the count cap alone
    # a date's origins stay together past the count cap, but not past the candle bound
    dates = np.array([0, 1, 1, 1, 1, 2, 2])
    assert walk_forward._batches(np.array([1] * 7), dates) == [(0, 5), (5, 7)]
    assert walk_forward._batches(np.array([1, 3, 3, 3, 3, 1, 1]), dates) == [(0, 1), (1, 4), (4, 7)]


def test_the_assets_of_a_date_are_forecast_in_one_call_and_scored_in_their_own_order(monkeypatch):
    """forecast_all calls each forecaster date by date (the draws a forecast shares across a
    date's assets need them in one call); the stats come back in the origins' asset order, each
    origin's the same as when forecast alone."""
    import numpy as np
    import pandas as pd

    from common.evaluation import walk_forward
    from common.evaluation.asset_series import AssetSeries

    monkeypatch.setattr(walk_forward, "_BATCH", 2)
    stamps = pd.date_range("2024-01-01", periods=60, freq="D")
    rng = np.random.default_rng(0)
    series = [
        AssetSeries(
            sym,
            "crypto",
            pd.DataFrame({"close": 100 * np.exp(np.cumsum(rng.normal(0, 0.01, 60)))}, index=stamps),
            train=range(0, 15),
            test=range(20, 60),
        )
        for sym in ("A", "B", "C")
    ]
    o = walk_forward.all_origins(series, {s.symbol: np.arange(20, 55, 5) for s in series}, [1, 3])
    calls = []

    def fn(histories, horizon, n_samples, seed):  # each origin's samples from its own history alone
        calls.append({(h.symbol, h.candles.index[-1]) for h in histories})
        keys = [int(h.candles["close"].iloc[-1] * 1e6) for h in histories]
        return np.stack([np.random.default_rng(k).normal(0, 0.01, (n_samples, horizon)) for k in keys])

    stats, _ = walk_forward.forecast_all(series, o, {"model": fn}, [1, 3], 16, 0, lambda m: None)
    for call in calls:  # whole dates in every call: 3 assets, past the cap of 2
        assert {d for _, d in call} and all(sum(d == e for _, e in call) == 3 for _, d in call)
    assert sum(len(c) for c in calls) == len(o.index) == 21
    alone = np.concatenate(
        [fn([walk_forward._history(series[k], i)], 3, 16, 0)[:, :, 0] for k, i in zip(o.series, o.index)]
    )
    assert np.array_equal(stats[1]["model"]["mean"], alone.mean(axis=1))  # asset order, per origin


def test_candles_that_changed_since_training_are_one_line_when_read(trained, monkeypatch):
    import dataclasses

    from common.config import load_config
    from common.data.loading import load_market_data
    from common.errors import UserError
    from common.evaluation import asset_series

    _, run = trained
    cfg = load_config(run / "config.json")
    market = load_market_data(cfg.data, run.parent.parent)
    symbol = market.assets[0].symbol
    shorter = dataclasses.replace(
        market,
        candles={
            **{a.symbol: market.candles[a.symbol] for a in market.assets},
            symbol: market.candles[symbol].iloc[:-50],
        },
    )
    monkeypatch.setattr(asset_series, "load_market_data", lambda data, case: shorter)
    series, _ = asset_series.series_from_run(run)
    with pytest.raises(UserError, match=f"the candles of {symbol} are no longer those the run was trained on"):
        series[0].candles["close"]
