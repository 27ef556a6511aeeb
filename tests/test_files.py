"""data.source = "files": the user's own CSV/parquet candles, good and bad files, and `marketgpt
train` on them end to end (fixtures in tests/fixtures/files/)."""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from common.cli import main
from common.config import Config
from common.data.files import load_files, read_candle_file
from common.data.loading import load_market_data
from common.data.prepare import prepare_data
from common.errors import UserError

FILES = Path(__file__).parent / "fixtures" / "files"


def files_config(
    files_dir: Path, universe: str = "files", interval: str = "1d", category: str | None = "us_stock"
) -> Config:
    cfg = Config()
    cfg.model.context_length = 8
    cfg.data.source, cfg.data.files_dir, cfg.data.universe = "files", str(files_dir), universe
    cfg.data.interval, cfg.data.default_category = interval, category
    return cfg


def test_folder_of_files_every_file_an_asset():
    market = load_market_data(files_config(FILES / "good_folder").data, Path("."))
    assert [a.symbol for a in market.assets] == ["AAA", "BBB", "CCC"]
    assert {a.category for a in market.assets} == {"us_stock"}
    aaa, bbb = market.candles["AAA"], market.candles["BBB"]
    # naive dates are UTC midnight; New York midnight (parquet, tz-aware) is 05:00 UTC in winter
    assert aaa.index[0] == pd.Timestamp("2020-01-01", tz="UTC")
    assert bbb.index[0] == pd.Timestamp("2020-01-01 05:00", tz="UTC")
    assert list(aaa.columns) == ["open", "high", "low", "close", "volume"] and len(aaa) == 160
    raw = pd.read_csv(FILES / "good_folder" / "AAA.csv")
    assert aaa["close"].tolist() == raw["Close"].tolist()


def test_naive_timestamps_are_noted_once(capsys):
    market = load_files(files_config(FILES / "good_folder").data, Path("."))
    assert "taken as UTC" not in capsys.readouterr().err  # nothing read yet
    for symbol in ("BBB", "AAA", "CCC"):
        market.candles[symbol]
    err = capsys.readouterr().err
    assert "AAA.csv (and any other file without one)" in err and "taken as UTC" in err and "BBB" not in err
    assert err.count("taken as UTC") == 1


def test_messy_file_is_cleaned_and_every_count_reported(capsys):
    cfg = files_config(FILES / "good_folder")
    prepared = prepare_data(cfg.data, cfg.model.context_length, load_files(cfg.data, Path(".")))
    record = prepared.info["assets"]["CCC"]
    # CCC.csv: 2 duplicated rows, 1 zero close, 2 unparsable dates, 3 13:00 rows among daily ones
    fixes = record["fixes"]
    assert (fixes["duplicates"], fixes["nonpositive_price"]) == (2, 1)
    assert (fixes["unparsable_timestamp"], fixes["off_interval"]) == (2, 3)
    assert record["raw_rows"] == len(pd.read_csv(FILES / "good_folder" / "CCC.csv")) == 165
    assert record["rows"] == 165 - 2 - 1 - 2 - 3
    assert record["file"].endswith("CCC.csv")
    assert prepared.info["totals"]["fixes"]["off_interval"] == 3
    assert prepared.info["assets"]["AAA"]["fixes"]["off_interval"] == 0
    err = capsys.readouterr().err
    line = next(x for x in err.splitlines() if x.startswith("cleaned") and "CCC.csv" in x)
    assert "2 duplicates" in line and "3 off interval" in line and "2 unparsable timestamp" in line
    assert not any("AAA.csv" in x for x in err.splitlines() if x.startswith("cleaned"))


def test_long_file_with_symbol_column_and_epoch_seconds():
    cfg = files_config(FILES / "long_hourly.csv", interval="1h", category="crypto")
    market = load_market_data(cfg.data, Path("."))
    assert [a.symbol for a in market.assets] == ["BTC-USD", "ETH-USD"]
    btc = market.candles["BTC-USD"]
    assert btc.index[0] == pd.Timestamp("2023-01-01", tz="UTC") and len(btc) == 300
    assert (np.diff(btc.index.asi8) == 3600 * 10**9).all()
    prepared = prepare_data(cfg.data, cfg.model.context_length, market)
    assert prepared.info["source"] == "files" and prepared.info["num_assets"] == 2


def test_universe_csv_picks_and_categorises_files(tmp_path):
    (tmp_path / "universe.csv").write_text("symbol,source,category,name\nBTC/USD,ccxt,crypto,Bitcoin\n")
    cfg = files_config(FILES / "long_hourly.csv", universe="universe.csv", interval="1h", category=None)
    market = load_files(cfg.data, tmp_path)
    # BTC/USD in the universe finds the BTC-USD candles; ETH-USD is not listed, so it is left out
    assert [(a.symbol, a.category) for a in market.assets] == [("BTC/USD", "crypto")]
    assert len(market.candles["BTC/USD"]) == 300


def test_universe_symbol_without_a_file_is_named(tmp_path):
    (tmp_path / "universe.csv").write_text(
        "symbol,source,category,name\nAAA,yfinance,us_stock,A\nZZZ,yfinance,us_stock,Z\n"
    )
    cfg = files_config(FILES / "good_folder", universe="universe.csv", category=None)
    with pytest.raises(UserError, match=r"no candles for 1 universe symbol\(s\): ZZZ"):
        load_files(cfg.data, tmp_path)


BAD = {
    "empty.csv": "the file is empty",
    "header_only.csv": "the file is empty",
    "missing_columns.csv": "missing column(s) high, low, volume (found: date, open, close)",
    "unparsable_timestamps.csv": "no timestamp in column 'date' parses (first: 'yesterday')",
    "hourly_as_daily.csv": "candles are mostly 1h apart, 1/24 of the configured data.interval = '1d'",
    "not_a_table.parquet": "cannot read the file",
}


def test_every_bad_file_has_an_expectation():
    assert {p.name for p in (FILES / "bad").iterdir()} == set(BAD)


@pytest.mark.parametrize("name", sorted(BAD))
def test_bad_file_is_one_line_naming_the_file(name):
    path = FILES / "bad" / name
    with pytest.raises(UserError) as err:
        read_candle_file(path, "1d")
    message = str(err.value)
    assert message.startswith(str(path)) and "\n" not in message
    assert BAD[name] in message


def test_daily_file_under_an_hourly_config_says_how_far_off(tmp_path):
    with pytest.raises(UserError, match=r"AAA.csv: candles are mostly 1d apart, 24x as long as .* '1h'"):
        read_candle_file(FILES / "good_folder" / "AAA.csv", "1h")


def test_bad_folder_and_paths(tmp_path):
    with pytest.raises(UserError, match="does not exist"):
        load_files(files_config(tmp_path / "nowhere").data, Path("."))
    (tmp_path / "notes.txt").write_text("not candles")
    with pytest.raises(UserError, match=r"no candle files \(\*.csv"):
        load_files(files_config(tmp_path).data, Path("."))
    shutil.copy(FILES / "good_folder" / "AAA.csv", tmp_path / "AAA.csv")
    pd.read_csv(tmp_path / "AAA.csv").to_parquet(tmp_path / "AAA.parquet")
    with pytest.raises(UserError, match="two files for symbol AAA"):
        load_files(files_config(tmp_path).data, Path("."))


def test_long_file_with_empty_symbol_is_refused(tmp_path):
    frame = pd.read_csv(FILES / "long_hourly.csv")
    frame.loc[5, "Symbol"] = None
    frame.to_csv(tmp_path / "long.csv", index=False)
    with pytest.raises(UserError, match=r"long.csv: 1 row\(s\) have an empty symbol"):
        read_candle_file(tmp_path / "long.csv", "1h", symbol_column=True)


TINY = {
    "experiment": "own",
    "model": {
        "vocab_size": 64,
        "context_length": 8,
        "d_model": 32,
        "num_layers": 1,
        "num_heads": 2,
        "d_ff": 64,
        "asset_embed_dim": 4,
        "category_embed_dim": 4,
    },
    "training": {
        "batch_size": 8,
        "epochs": 1,
        "max_steps_per_epoch": 2,
        "eval_max_batches": 1,
        "warmup_steps": 1,
        "device": "cpu",
        "scorecard_origins": 0,
        "vol_reversion": False,
    },
    "data": {
        "source": "files",
        "files_dir": "my_candles",
        "universe": "files",
        "default_category": "us_stock",
        "interval": "1d",
    },
}


def _case(tmp_path: Path, files: Path) -> Path:
    config = tmp_path / "case" / "configs" / "own.json"
    config.parent.mkdir(parents=True)
    shutil.copytree(files, tmp_path / "case" / "my_candles")
    config.write_text(json.dumps(TINY))
    return config


def test_train_on_own_files_end_to_end(tmp_path):
    config = _case(tmp_path, FILES / "good_folder")
    assert main(["train", "--config", str(config)]) == 0
    (run,) = (config.parent.parent / "checkpoints").glob("own_*")
    info = json.loads((run / "data_info.json").read_text())
    assert info["source"] == "files" and set(info["assets"]) == {"AAA", "BBB", "CCC"}
    assert info["assets"]["CCC"]["fixes"]["off_interval"] == 3
    assets = json.loads((run / "asset_info.json").read_text())
    assert [a["source"] for a in assets["assets"]] == ["files"] * 3
    assert (run / "test_results.json").is_file()


def test_train_on_a_bad_file_exits_2_with_one_line(tmp_path, capsys):
    config = _case(tmp_path, FILES / "good_folder")
    shutil.copy(FILES / "bad" / "missing_columns.csv", tmp_path / "case" / "my_candles" / "DDD.csv")
    assert main(["train", "--config", str(config)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert any("DDD.csv: missing column(s) high, low, volume" in line for line in err)
    assert not list((config.parent.parent / "checkpoints").glob("own_*/config.json"))


def test_data_check_reads_own_files(tmp_path, capsys):
    config = _case(tmp_path, FILES / "good_folder")
    assert main(["data", "check", "--case", str(tmp_path / "case"), "--config", str(config)]) == 0
    out = capsys.readouterr().out
    assert "3 of 3 assets" in out and "off_interval 3" in out and "unparsable_timestamp 2" in out
    shutil.copy(FILES / "bad" / "empty.csv", tmp_path / "case" / "my_candles" / "DDD.csv")
    assert main(["data", "check", "--case", str(tmp_path / "case"), "--config", str(config)]) == 2
    assert "DDD.csv: the file is empty" in capsys.readouterr().out


def _count_reads(monkeypatch) -> list[str]:
    """The file names the files source reads, in order."""
    import common.data.files as files

    reads: list[str] = []
    real = files._read_table

    def counted(path: Path, *args, **kwargs):
        reads.append(Path(path).name)
        return real(path, *args, **kwargs)

    monkeypatch.setattr(files, "_read_table", counted)
    return reads


def test_a_file_is_read_when_its_asset_is_asked_for(monkeypatch, tmp_path):
    reads = _count_reads(monkeypatch)
    market = load_market_data(files_config(FILES / "good_folder").data, Path("."))
    universe = tmp_path / "universe.csv"
    universe.write_text("symbol,source,category,name\nccc,yfinance,us_stock,C\n")
    picked = load_market_data(files_config(FILES / "good_folder", universe=str(universe)).data, Path("."))
    assert reads == [] and [a.symbol for a in picked.assets] == ["ccc"]
    assert len(market.candles["BBB"]) and market.fixes.get("BBB") == {"unparsable_timestamp": 0, "off_interval": 0}
    assert reads == ["BBB.parquet"]  # the drop counts come with the candles' read
    assert picked.fixes.get("ccc")["off_interval"] == 3 and reads == ["BBB.parquet", "CCC.csv"]


def test_a_preparation_task_reads_only_its_own_files(monkeypatch, tmp_path):
    from common.tokens.shard_stages import prepare_stage

    reads = _count_reads(monkeypatch)
    cfg = files_config((FILES / "good_folder").resolve())
    prepare_stage(cfg, tmp_path, "clean", task=1, tasks=3, out=io.StringIO())
    assert reads == ["BBB.parquet"]


def test_plan_reads_only_the_timestamps_of_own_files(monkeypatch):
    import common.data.files as files
    from common.commands.plan_data import data_figures

    columns: list[tuple[str, ...]] = []
    real = files._read_table
    monkeypatch.setattr(files, "_read_table", lambda path, only=(): columns.append(only) or real(path, only))
    cfg = files_config(FILES / "good_folder")
    data = data_figures(cfg, Path("."))
    assert len(columns) == 3 and all("timestamp" in only and "close" not in only for only in columns)
    assert data.basis.startswith("estimated from the timestamps in your files")
    prepared = prepare_data(cfg.data, cfg.model.context_length, load_files(cfg.data, Path(".")))
    exact = sum(len(s.train) for s in prepared.splits.values())
    # the one row CCC.csv loses to a zero close is still counted; nothing else differs
    assert exact <= data.candles["train"] <= exact + 1
