"""Run folders made by an earlier version (tests/fixtures/runs, trained on the sample with the tiny
model of test_forecast.TINY: one interval with its last epoch checkpoint, and two intervals) still
resume, forecast, score and export, and the exports that version made of the one-interval run
(tests/fixtures/exports: hf and onnx, by commit 9deb47c) still load and forecast: what the library
reads of a run folder or an export stays readable."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from common.cli import main
from common.paths import REPO_ROOT

RUNS = REPO_ROOT / "tests" / "fixtures" / "runs"


@pytest.fixture
def old_run(tmp_path, request) -> Path:
    copy = tmp_path / request.param
    shutil.copytree(RUNS / request.param, copy)
    return copy


@pytest.mark.parametrize("old_run", ["one_interval"], indirect=True)
def test_an_old_run_resumes_from_its_checkpoint(old_run, capsys):
    assert main(["train", "--resume", str(old_run), "--set", "training.epochs=3"]) == 0
    out = capsys.readouterr().out
    assert "Resuming" in out and "Epoch 3/3" in out and "Epoch 2/3" not in out
    log = json.loads((old_run / "training_log.json").read_text())
    assert [e["epoch"] for e in log["epochs"]] == [1, 2, 3] and len(log["resumes"]) == 1


@pytest.mark.parametrize(
    ("old_run", "symbol", "interval"),
    [("one_interval", "AAPL", None), ("two_intervals", "AAPL", "1d"), ("two_intervals", "BTC-USD", "1h")],
    indirect=["old_run"],
)
def test_an_old_run_forecasts(old_run, symbol, interval, tmp_path):
    args = ["forecast", str(old_run), "--symbols", symbol, "--horizon", "3", "--samples", "16"]
    assert main([*args, *(["--interval", interval] if interval else []), "--out", str(tmp_path / "fc")]) == 0
    table = json.loads((tmp_path / "fc" / "forecast.json").read_text())
    assert table["horizon"] == 3 and symbol in json.dumps(table)


@pytest.mark.parametrize("old_run", ["one_interval", "two_intervals"], indirect=True)
def test_an_old_run_scores_and_exports(old_run, tmp_path):
    assert main(["scorecard", str(old_run), "--origins", "2", "--samples", "16", "--horizons", "1"]) == 0
    assert json.loads((old_run / "scorecard.json").read_text())["horizons"]["1"]["n"] > 0
    assert main(["export", str(old_run), "--out", str(tmp_path / "onnx")]) == 0
    assert (tmp_path / "onnx" / "model.onnx").is_file()


EXPORTS = REPO_ROOT / "tests" / "fixtures" / "exports"  # the one_interval run, exported by that version


def _forecast(folder: Path, out: Path, *flags: str) -> tuple[dict, str]:
    """(forecast.json, forecast.csv) of `marketgpt forecast FOLDER` for AAPL, 3 candles ahead."""
    args = ["forecast", str(folder), "--symbols", "AAPL", "--horizon", "3", "--samples", "16", "--precision", "fp32"]
    assert main([*args, *flags, "--out", str(out)]) == 0
    return json.loads((out / "forecast.json").read_text()), (out / "forecast.csv").read_text()


def test_old_exports_load_and_forecast_as_their_run(tmp_path):
    run, run_table = _forecast(RUNS / "one_interval", tmp_path / "run")
    hf, hf_table = _forecast(EXPORTS / "hf", tmp_path / "hf")  # Forecaster.from_pretrained: same weights and sampler
    assert hf_table == run_table and hf["origins"] == run["origins"] and len(run_table.splitlines()) == 4
    onnx, onnx_table = _forecast(EXPORTS / "onnx", tmp_path / "onnx", "--backend", "onnx")  # onnxruntime's arithmetic
    assert onnx["backend"] == "onnx" and onnx["origins"] == run["origins"]
    assert len(onnx_table.splitlines()) == len(run_table.splitlines())


def test_an_onnx_export_passed_as_a_run_folder_says_so(capsys):
    assert main(["forecast", str(EXPORTS / "onnx"), "--symbols", "AAPL", "--horizon", "3"]) == 2
    assert "is an ONNX export folder" in capsys.readouterr().err
