"""Ensembles: several runs (seeds) pooled as an equal-weight mixture in `marketgpt forecast` and
`marketgpt scorecard`, and runs whose tokenizers differ refused."""

from __future__ import annotations

import json

import numpy as np
import pytest

from common.cli import main
from common.errors import UserError
from common.forecasting.ensemble import Ensemble
from common.forecasting.forecast_io import summarize_paths
from common.forecasting.forecaster import Forecaster

TINY = {
    "model": {
        "vocab_size": 64,
        "context_length": 16,
        "d_model": 32,
        "num_layers": 1,
        "num_heads": 2,
        "d_ff": 64,
        "asset_embed_dim": 4,
        "category_embed_dim": 4,
    },
    "training": {
        "batch_size": 16,
        "epochs": 1,
        "max_steps_per_epoch": 3,
        "eval_max_batches": 2,
        "warmup_steps": 1,
        "device": "cpu",
        "scorecard_origins": 0,
        "vol_reversion": False,
    },
    "data": {"source": "sample", "interval": "1d"},
}


def _train(root, name: str, **sections) -> object:
    raw = json.loads(json.dumps(TINY))
    raw["experiment"] = name
    for section, values in sections.items():
        raw.setdefault(section, {}).update(values)
    config = root / "case" / "configs" / f"{name}.json"
    config.parent.mkdir(parents=True, exist_ok=True)
    config.write_text(json.dumps(raw))
    assert main(["train", "--config", str(config)]) == 0
    (run,) = (root / "case" / "checkpoints").glob(f"{name}_*")
    return run


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("ens")
    return (
        _train(root, "seed1", training={"seed": 1}),
        _train(root, "seed2", training={"seed": 2}),
        _train(root, "coarse", tokenizer={"shape_bins": 4}),
    )


def test_pooled_paths_are_each_runs_share_and_the_table_reads_them_all(runs):
    a, b = Forecaster.from_run(runs[0]), Forecaster.from_run(runs[1])
    ens = Ensemble([a, b])
    histories = a.load_history(["AAPL", "IBM"], as_of="2012-06-01")
    result = ens.forecast(histories, horizon=5, samples=7, seed=3, return_paths=True)
    assert result.paths["close"].shape == (2, 7, 6) and result.tokens.shape == (2, 7, 5)
    own_a = a.forecast(histories, 5, 4, seed=3, return_paths=True)  # 7 paths: 4 from the first run, 3 from the second
    own_b = b.forecast(histories, 5, 3, seed=3 + 1_000_003, return_paths=True)
    assert np.array_equal(result.paths["close"][:, :4], own_a.paths["close"])
    assert np.array_equal(result.paths["close"][:, 4:], own_b.paths["close"])
    pooled = summarize_paths(result.paths["close"][1], result.paths["high"][1], result.paths["low"][1])
    rows = result.table[result.table["symbol"] == "IBM"]
    for column, values in pooled.items():
        assert np.allclose(rows[column].to_numpy(dtype=float), values, equal_nan=True), column
    assert not np.array_equal(own_a.paths["close"][:, :3], own_b.paths["close"])  # two different models
    assert ens.precision == "fp32"
    assert Ensemble([a, Forecaster.from_run(runs[1], precision="bf16")]).precision == "bf16+fp32"  # as each samples


def test_runs_with_another_tokenizer_are_refused(runs):
    with pytest.raises(UserError, match=r"coarse_.*tokenizer differs from .*seed1_"):
        Ensemble.from_runs([runs[0], runs[2]])
    with pytest.raises(UserError, match="at least one path per run"):
        Ensemble.from_runs(runs[:2]).check_request(5, 1)


def test_forecast_cli_with_two_runs(runs, tmp_path, capsys):
    out = tmp_path / "out"
    assert (
        main(
            [
                "forecast",
                str(runs[0]),
                str(runs[1]),
                "--symbols",
                "AAPL",
                "--horizon",
                "3",
                "--samples",
                "8",
                "--as-of",
                "2012-06-01",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    meta = json.loads((out / "forecast.json").read_text())
    assert [m["run"] for m in meta["ensemble"]] == [str(runs[0]), str(runs[1])]
    assert main(["forecast", str(runs[0]), str(runs[2]), "--symbols", "AAPL", "--horizon", "3"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "tokenizer differs" in err[0]


def test_scorecard_cli_with_two_runs_writes_beside_the_first(runs, capsys):
    assert main(["scorecard", str(runs[0]), str(runs[1]), "--horizons", "1", "--origins", "2", "--samples", "4"]) == 0
    folder = runs[0] / "ensemble_2"
    card = json.loads((folder / "scorecard.json").read_text())
    assert card["verdicts"] and not (runs[0] / "scorecard.json").exists()  # the first run's own card untouched
    members = json.loads((folder / "ensemble.json").read_text())
    assert [m["run"] for m in members["runs"]] == [str(runs[0]), str(runs[1])] and members["weights"] == "equal"
    assert f"Wrote {folder / 'scorecard.json'}" in capsys.readouterr().out
