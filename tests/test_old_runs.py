"""Run folders made by an earlier version (tests/fixtures/runs, trained on the sample with the tiny
model of test_forecast.TINY: one interval with its last epoch checkpoint, and two intervals) still
resume, forecast, score and export: what the library reads of a run folder stays readable."""

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
