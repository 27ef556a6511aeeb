"""Several intervals in one model (data.intervals): the config, the series of the synthetic
market, the interval embedding, and a tiny run on three intervals that trains, resumes exactly
after kill -9, forecasts, scores and exports each interval (docs/data.md#several-intervals)."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from common.cli import main
from common.config import Config, ConfigError, at_interval, load_config
from common.data.loading import load_market_data
from common.data.prepare import prepare_data
from common.data.synthetic import aggregate
from common.data.universe import Asset
from common.errors import UserError
from common.model.gpt import MarketGPT
from common.paths import REPO_ROOT
from common.run.checkpoint import checkpoint_files, load_checkpoint
from common.run.folder import config_differences
from common.tokens.ids import RunInfo
from common.tokens.shard_paths import shard_folder

torch.set_num_threads(1)
pytestmark = pytest.mark.filterwarnings("ignore:A test tried to use socket.socket")

INTERVALS = ["15m", "1h", "4h"]
TINY = {
    "experiment": "multi",
    "model": {
        "vocab_size": 64,
        "context_length": 8,
        "d_model": 32,
        "num_layers": 2,
        "num_heads": 2,
        "d_ff": 64,
        "asset_embed_dim": 4,
        "category_embed_dim": 4,
        # as the case configs, multi-interval ones among them: the cross-section, rotary positions
        "positional": "rope",
        "market_context": True,
        "market_peer": True,
        "market_mask": 0.5,  # its random tails, drawn again after a kill, must be the straight run's
    },
    "training": {
        "batch_size": 16,
        "epochs": 2,
        "max_steps_per_epoch": 8,
        "eval_max_batches": 2,
        "warmup_steps": 2,
        "log_every_steps": 1,
        "scorecard_origins": 0,
        "vol_reversion": False,
        "checkpoint_every_minutes": 0.001,
    },
    "data": {
        "source": "synthetic",
        "interval": "15m",
        "intervals": INTERVALS,
        "start_date": "2024-01-01",
        "synthetic": {"assets": 2, "candles": 2000, "categories": ["crypto"]},
    },
}


def _case(root: Path, name: str) -> Path:
    path = root / name / "configs" / "multi.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(TINY))
    return path


def _run_dir(config: Path) -> Path:
    (run_dir,) = sorted((config.parent.parent / "checkpoints").glob("multi_*"))
    return run_dir


# --------------------------------------------------------------------------- config


@pytest.mark.parametrize(
    "data, fragment",
    [
        ({"intervals": ["1h"]}, "'data.intervals' must list at least two different intervals"),
        ({"intervals": ["1h", "1h"]}, "'data.intervals' must list at least two different intervals"),
        ({"intervals": ["1h", "1d"]}, "'data.interval' ('1d') must be data.intervals' first entry ('1h')"),
        ({"intervals": ["1d", "2h"], "interval": "1d"}, "'data.intervals' = '2h' is not one of"),
        ({"intervals": ["1d", "1h"], "source": "files", "files_dir": "x"}, "your own files hold one interval"),
    ],
)
def test_bad_intervals_name_the_key(tmp_path, data, fragment):
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"data": data}))
    with pytest.raises(ConfigError, match=None) as e:
        load_config(path)
    assert fragment in str(e.value)


def test_one_interval_configs_keep_their_shard_key_and_a_change_of_intervals_is_no_resume(tmp_path):
    one = Config()
    explicit = Config()
    explicit.data.intervals = []
    several = Config()
    several.data.intervals = ["1d", "1h"]
    for cfg in (one, explicit, several):
        cfg.data.source = "synthetic"  # no input files to stamp
    assert one.data.run_intervals() == ["1d"] and several.data.run_intervals() == ["1d", "1h"]
    key, inputs = shard_folder(one, tmp_path)
    assert "intervals" not in inputs["data"]  # a field added after the seed configs: not in their key
    assert shard_folder(explicit, tmp_path)[0] == key != shard_folder(several, tmp_path)[0]
    assert [d.split(":")[0] for d in config_differences(one, several)] == ["data.intervals"]
    view = at_interval(several.data, "1h")
    assert (view.interval, view.intervals, several.data.intervals) == ("1h", [], ["1d", "1h"])


# --------------------------------------------------------------------------- data


def test_aggregate_makes_exchange_candles_from_finer_ones():
    index = pd.date_range("2024-01-01", periods=8, freq="15min", tz="UTC", name="timestamp")
    fine = pd.DataFrame(
        {
            "open": np.arange(8.0) + 10,
            "high": np.arange(8.0) + 12,
            "low": np.arange(8.0) + 9,
            "close": np.arange(8.0) + 11,
            "volume": np.ones(8),
        },
        index=index,
    )
    fine = fine.drop(index[5])  # a missing fine candle
    hourly = aggregate(fine, "1h")
    assert list(hourly.index) == [index[0], index[4]]
    assert hourly.iloc[0].tolist() == [10.0, 15.0, 9.0, 14.0, 4.0]
    assert hourly.iloc[1].tolist() == [14.0, 19.0, 13.0, 18.0, 3.0]


def test_the_synthetic_market_at_several_intervals_is_one_market_aggregated():
    cfg = Config()
    cfg.data.source, cfg.data.start_date = "synthetic", "2024-01-01"
    cfg.data.interval, cfg.data.intervals = "1h", ["1h", "4h", "1d"]
    cfg.data.synthetic = {"assets": 2, "candles": 24 * 20}
    market = load_market_data(cfg.data, Path("."))
    names = [a.symbol for a in market.assets]
    assert names == [f"SYN000{i}@{iv}" for i in range(2) for iv in ("1h", "4h", "1d")]
    assert market.interval_of("SYN0001@4h") == "4h" and market.interval == "1h"
    hourly = market.candles["SYN0001@1h"]
    pd.testing.assert_frame_equal(market.candles["SYN0001@1d"], aggregate(hourly, "1d"))
    one = load_market_data(at_interval(cfg.data, "1h"), Path("."))  # the finest series is the one-interval market's
    pd.testing.assert_frame_equal(one.candles["SYN0001"], hourly)


def test_asset_info_of_series_shares_asset_ids_across_intervals():
    series = [Asset(f"{s}@{iv}", "sample", c, s) for s, c in (("A", "crypto"), ("B", "fx")) for iv in ("1h", "1d")]
    info = RunInfo.of_assets(series, ["1h", "1d"])
    raw = info.to_json()
    assert raw["symbols"] == {"A": 0, "B": 1} and raw["num_assets"] == 2 and raw["intervals"] == ["1h", "1d"]
    assert raw["series"]["B@1d"] == {"symbol": "B", "interval": "1d"} and RunInfo.from_json(raw) == info
    assets, categories, intervals = info.series_ids()
    assert assets == {"A@1h": 0, "A@1d": 0, "B@1h": 1, "B@1d": 1}
    assert intervals == {"A@1h": 0, "A@1d": 1, "B@1h": 0, "B@1d": 1}
    assert categories["B@1d"] == info.categories["fx"] and info.num_intervals == 2
    one = RunInfo.of_assets([Asset("A", "sample", "crypto", "A")])
    assert "intervals" not in one.to_json() and one.series_ids()[2] == {"A": 0} and one.num_intervals == 1
    assert info.interval("1h", None) == ("1h", 0) and info.interval("1h", "1d") == ("1d", 1)
    assert info.interval_series("1d") == {"A@1d": "A", "B@1d": "B"}
    with pytest.raises(UserError, match="--interval 4h: the run was trained on 1h, 1d only"):
        info.interval("1h", "4h")


# --------------------------------------------------------------------------- model


def test_a_one_interval_model_has_its_old_parameters_and_several_get_a_zero_interval_embedding():
    cfg = Config().model
    torch.manual_seed(0)
    one = MarketGPT(cfg, num_assets=3, num_categories=2)
    torch.manual_seed(0)
    three = [Asset(s, "sample", c, s) for s, c in (("A", "crypto"), ("B", "fx"), ("C", "crypto"))]
    again = MarketGPT.for_run(cfg, RunInfo.of_assets(three))
    assert one.interval_emb is None and one.state_dict().keys() == again.state_dict().keys()
    assert all(torch.equal(v, again.state_dict()[k]) for k, v in one.state_dict().items())
    series = [Asset(f"{a.symbol}@{iv}", a.source, a.category, a.name) for a in three for iv in ("1h", "1d")]
    several = MarketGPT.for_run(cfg, RunInfo.of_assets(series, ["1h", "1d"]))
    assert set(several.state_dict()) - set(one.state_dict()) == {"interval_emb.weight"}
    assert several.interval_emb.weight.shape == (2, cfg.d_model) and not several.interval_emb.weight.any()
    assert several.num_parameters() - one.num_parameters() == 2 * cfg.d_model


# --------------------------------------------------------------------------- a run on three intervals


@pytest.fixture(scope="module")
def straight_run(tmp_path_factory) -> Path:
    config = _case(tmp_path_factory.mktemp("multi"), "straight")
    assert main(["train", "--config", str(config)]) == 0
    return _run_dir(config)


def test_a_run_of_three_intervals_trains_and_evaluates_each(straight_run):
    info = json.loads((straight_run / "asset_info.json").read_text())
    assert info["intervals"] == INTERVALS and info["num_assets"] == 2
    assert sorted(info["series"]) == sorted(f"SYN000{i}@{iv}" for i in range(2) for iv in INTERVALS)
    # model.market_peer: each series' peer is the other asset's series of its own interval; the 4h
    # series train on fewer than MIN_PEER_PAIRS candles, so they have none
    paired = INTERVALS[:-1]
    assert info["peers"] == {f"SYN000{i}@{iv}": f"SYN000{1 - i}@{iv}" for i in range(2) for iv in paired}
    data_info = json.loads((straight_run / "data_info.json").read_text())
    assert data_info["intervals"] == INTERVALS
    state = load_checkpoint(straight_run / "best_model.pt")["model"]
    assert state["interval_emb.weight"].shape[0] == 3 and state["interval_emb.weight"].any()  # it trained
    results = json.loads((straight_run / "test_results.json").read_text())
    assert results["interval"] == "15m" and list(results["per_interval"]) == INTERVALS
    for r in results["per_interval"].values():
        assert set(r["per_asset"]) == {"SYN0000", "SYN0001"} and r["num_tokens"] > 0
        assert r["token_skill"]["unigram"]["value"] is not None
    assert results["per_interval"]["4h"]["num_tokens"] < results["per_interval"]["15m"]["num_tokens"]


def test_kill_9_then_resume_ends_bit_equal_to_a_straight_run(straight_run, tmp_path, capsys):
    config = _case(tmp_path, "killed")
    env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "common.cli", "train", "--config", str(config), "--resume", "auto"]
    proc = subprocess.Popen(cmd, cwd=REPO_ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 180
    try:  # kill -9 once a step checkpoint of the first epoch is on disk
        while not any(
            p.name.startswith("checkpoint_epoch_1_step_")
            for d in (config.parent.parent / "checkpoints").glob("multi_*")
            for p in checkpoint_files(d)
        ):
            assert proc.poll() is None and time.monotonic() < deadline, "the run ended before its first checkpoint"
            time.sleep(0.01)
    finally:
        proc.kill()
        proc.wait(timeout=60)
    assert main(["train", "--config", str(config), "--resume", "auto"]) == 0
    assert "Resuming" in capsys.readouterr().out
    run_dir = _run_dir(config)
    losses = [json.loads((d / "training_log.json").read_text())["epochs"] for d in (run_dir, straight_run)]
    assert [[(e["train_loss"], e["val_loss"]) for e in log] for log in losses][0] == [
        [(e["train_loss"], e["val_loss"]) for e in log] for log in losses
    ][1]
    mine, ref = (load_checkpoint(d / "checkpoint_epoch_2.pt")["model"] for d in (run_dir, straight_run))
    assert mine.keys() == ref.keys() and all(torch.equal(mine[k], ref[k]) for k in ref)


def test_forecast_scorecard_and_export_take_an_interval(straight_run, capsys):
    for interval, step in (("1h", pd.Timedelta("1h")), ("4h", pd.Timedelta("4h"))):
        out = straight_run / f"fc_{interval}"
        assert (
            main(
                [
                    "forecast",
                    str(straight_run),
                    "--interval",
                    interval,
                    "--horizon",
                    "2",
                    "--samples",
                    "4",
                    "--out",
                    str(out),
                ]
            )
            == 0
        )
        table = pd.read_csv(out / "forecast.csv")
        assert set(table["symbol"]) == {"SYN0000", "SYN0001"}
        stamps = pd.to_datetime(table.sort_values(["symbol", "step"])["timestamp"].iloc[:2])
        assert stamps.iloc[1] - stamps.iloc[0] == step
    assert (
        main(
            ["scorecard", str(straight_run), "--interval", "4h", "--origins", "2", "--samples", "4", "--horizons", "1"]
        )
        == 0
    )
    card = json.loads((straight_run / "scorecard_4h" / "scorecard.json").read_text())
    assert card["interval"] == "4h"
    assert main(["export", str(straight_run), "--interval", "1h"]) == 0
    model_card = json.loads(
        (straight_run.parent.parent / "exports" / f"{straight_run.name}_1h" / "model_card.json").read_text()
    )
    assert model_card["interval"] == "1h"
    capsys.readouterr()
    for command in ("forecast", "scorecard", "export"):
        assert main([command, str(straight_run), "--interval", "1d"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert err == [
            f"marketgpt {command}: error: --interval 1d: the run was trained on 15m, 1h, 4h only; "
            "pick one of them (a new interval needs a run that trains on it)"
        ]


def test_the_interval_embedding_changes_the_forecast(straight_run):
    from common.forecasting.forecaster import Forecaster

    fc = Forecaster.from_run(straight_run, interval="1h")
    histories = fc.load_history(["SYN0000"])

    def forecast() -> np.ndarray:
        return fc.forecast(histories, 3, 64, seed=7, return_paths=True).tokens

    first = forecast()
    assert np.array_equal(first, forecast())  # same seed, same model: same paths
    with torch.no_grad():
        # only the 1h row; not a constant vector, which every LayerNorm would take out again
        g = torch.Generator().manual_seed(0)
        fc.model.interval_emb.weight[1] += torch.randn(fc.model.config.d_model, generator=g)
    assert not np.array_equal(first, forecast())
    contexts = torch.randint(4, 60, (1, 8))
    ids = torch.zeros(1, dtype=torch.long)
    features = torch.zeros(1, 8, 7, dtype=torch.long)  # after the 3 of every candle, the market's 3 and the peer
    logits = [fc.model(contexts, ids, ids, interval_ids=torch.tensor([k]), features=features)[0] for k in range(3)]
    assert not torch.equal(logits[0], logits[1]) and not torch.equal(logits[1], logits[2])


def test_fine_tuning_a_one_interval_run_into_several_starts_the_new_rows_at_zero(straight_run, tmp_path):
    from common.training.finetune import Parent, init_from_parent

    cfg = load_config(straight_run / "config.json")
    parent_info = RunInfo.of_assets([Asset(f"SYN000{i}", "synthetic", "crypto", "x") for i in range(2)])
    parent = MarketGPT.for_run(cfg.model, parent_info)  # a one-interval parent
    run = tmp_path / "parent"
    run.mkdir()
    torch.save({"model": parent.state_dict()}, run / "best_model.pt")
    (run / "asset_info.json").write_text(json.dumps(parent_info.to_json()))
    info = RunInfo.read(straight_run / "asset_info.json")
    child = MarketGPT.for_run(cfg.model, info)
    torch.nn.init.normal_(child.interval_emb.weight)
    lineage = init_from_parent(child, Parent(run, run / "best_model.pt", {}), info)
    assert lineage["intervals_zero"] == INTERVALS and lineage["intervals"] == []
    assert not child.interval_emb.weight.any() and torch.equal(child.wte.weight, parent.wte.weight)
    # and a parent of several intervals hands its rows on, by name
    grand = MarketGPT.for_run(cfg.model, info)
    lineage = init_from_parent(grand, Parent(straight_run, straight_run / "best_model.pt", {}), info)
    best = load_checkpoint(straight_run / "best_model.pt")["model"]["interval_emb.weight"]
    assert lineage["intervals"] == INTERVALS and torch.equal(grand.interval_emb.weight, best)


def test_per_interval_splits_give_each_interval_the_one_interval_runs_test_split():
    """The shipped sample's hourly (2017, 2021) and daily (to 2018) candles: pooled cuts would put
    every hourly candle after the train/val cut; per_interval keeps each one-interval run's cuts."""

    def prepared(**data):
        cfg = Config()
        cfg.model.context_length = 32
        cfg.data.source = "sample"
        for key, value in data.items():
            setattr(cfg.data, key, value)
        return prepare_data(cfg.data, cfg.model.context_length, load_market_data(cfg.data, Path(".")))

    several = prepared(interval="1h", intervals=["1h", "1d"], interval_split="per_interval")
    for interval in ("1h", "1d"):
        one = prepared(interval=interval)
        for symbol, split in one.splits.items():
            mine = several.splits[f"{symbol}@{interval}"]
            assert (mine.train, mine.val, mine.test) == (split.train, split.val, split.test), symbol
        assert {f"{s}@{interval}" for s in one.dropped} == {s for s in several.dropped if s.endswith(f"@{interval}")}


def _sample_config(tmp_path: Path, **data) -> Path:
    path = tmp_path / "case" / "configs" / "sample.json"
    path.parent.mkdir(parents=True)
    path.write_text(
        json.dumps(
            {
                "model": {"context_length": 32},
                "data": {
                    "source": "sample",
                    "universe_counts": {},
                    "interval": "1h",
                    "intervals": ["1h", "1d"],
                    **data,
                },
            }
        )
    )
    return path


@pytest.mark.parametrize("shards", [False, True])
def test_pooled_cuts_that_leave_an_interval_without_windows_are_refused_with_the_fix(tmp_path, shards):
    """The sample's hourly candles (2017, 2021) all fall after the pooled train/val cut (late 2015):
    training, whether in memory or through the token shards, refuses in one line that names the
    interval and the fix, instead of training without it."""
    from common.tokens.corpus import prepare_in_memory
    from common.tokens.shards import prepare_shards

    cfg = load_config(_sample_config(tmp_path), [f"data.shards={str(shards).lower()}"])
    with pytest.raises(UserError) as e:
        (prepare_shards if shards else prepare_in_memory)(cfg, tmp_path / "case", out=io.StringIO())
    message = str(e.value)
    assert "\n" not in message and message.startswith("interval 1h would get no training windows")
    assert "data.interval_split 'pooled' (cuts 2015-11-23 and 2017-12-07" in message
    assert message.endswith(
        "split each interval on its own dates with --set data.interval_split=per_interval "
        "(docs/data.md, several intervals in one model)"
    )


def test_an_interval_too_short_for_val_and_test_windows_is_refused_in_both_split_modes(tmp_path, capsys):
    """4h series of 125 candles leave no validation or test candle after a purge gap of 24,
    whatever the cuts: training and plan (an estimate here, split as preparation splits) refuse
    with the same words; the fix is a shorter context or more candles, not per_interval."""
    config = _case(tmp_path, "short")
    fix = (
        "training needs context_length + 1 = 25 candles before the train/val cut, validation at least 1 and "
        "test 2 after their purge gap of 24; lower model.context_length, "
        "use longer histories (earlier data.start_date), or leave 4h out of data.intervals"
    )
    for split in ("pooled", "per_interval"):
        overrides = ["model.context_length=24", f"data.interval_split={split}"]
        cfg = load_config(config, overrides)
        with pytest.raises(UserError) as e:
            prepare_data(cfg.data, cfg.model.context_length, load_market_data(cfg.data, tmp_path))
        assert str(e.value) == (
            "interval 4h would get no validation or test windows (its 2 series: 2024-01-01 to "
            f"2024-01-21, longest 125 candles): {fix}"
        )
        assert main(["plan", "--config", str(config), *(x for o in overrides for x in ("--set", o))]) == 2
        (err,) = capsys.readouterr().err.strip().splitlines()
        assert err == f"marketgpt plan: error: {e.value}"


def test_an_interval_without_any_valid_candle_is_refused_naming_the_source():
    from common.data.prepare import split_data

    cfg = Config()
    cfg.model.context_length = 8
    cfg.data.source, cfg.data.interval, cfg.data.intervals = "download", "1d", ["1d", "1h"]
    universe = [Asset(f"A@{iv}", "yfinance", "us_stock", "x") for iv in ("1d", "1h")]
    stamps = {"A@1d": pd.date_range("2020-01-01", periods=400, freq="D", tz="UTC").as_unit("ns").asi8}
    records = {s.symbol: {"category": "us_stock"} for s in universe}
    with pytest.raises(UserError) as e:
        split_data(
            cfg.data, cfg.model.context_length, universe, "1d", stamps, stamps, records, {"A@1h": "no candles"}, {}
        )
    assert str(e.value) == (
        'interval 1h: none of its series has a valid candle (see "dropped" in data_info.json); '
        "check the data source (download) or leave 1h out of data.intervals"
    )


# the sample at context 32, each interval on its own dates: three daily series too short to train,
# BTC-USD's the only crypto one at 1d; and some kept ones that end before the validation or test cut
SAMPLE_LEFT_OUT = [
    'Left out: 3 of 18 series (each one\'s reason: "dropped" in data_info.json)',
    "  3 with fewer than context_length + 1 = 33 candles before the train/val cut: crypto 1, us_stock 2; "
    "BTC-USD@1d, NFLX@1d, TSLA@1d",
    "No validation windows in 3 of 15 kept series (no validation candle after the purge gap): index 2, emerging 1; "
    "^N225@1d, ^NDX@1d, ^JKSE@1d",
    "No test windows in 6 of 15 kept series (fewer than 2 test candles after the purge gap): "
    "us_stock 3, index 2, emerging 1; AAPL@1d, IBM@1d, META@1d, ^N225@1d, ^NDX@1d and 1 more",
    "WARNING: category crypto at 1d: 1 of 1 series left out: the run neither trains nor tests on it "
    '(see "dropped" and "no_windows_in" in data_info.json)',
]


@pytest.mark.parametrize("shards", [True, False])
def test_plan_and_the_training_log_name_what_was_left_out_and_why(tmp_path, capsys, shards):
    from common.commands.train import run_training

    config = _sample_config(tmp_path, interval_split="per_interval", shards=shards)
    assert main(["plan", "--config", str(config)]) == 0
    plan = capsys.readouterr().out.splitlines()
    assert [line for line in plan if line in ["  " + x for x in SAMPLE_LEFT_OUT[:4]] + SAMPLE_LEFT_OUT[4:]] == [
        "  " + x for x in SAMPLE_LEFT_OUT[:4]
    ] + SAMPLE_LEFT_OUT[4:]
    tiny = [
        "model.d_model=16",
        "model.num_layers=1",
        "model.num_heads=2",
        "model.d_ff=32",
        "model.vocab_size=64",
        "training.batch_size=8",
        "training.scorecard_origins=0",
        "training.vol_reversion=false",
        "training.compile=false",
    ]
    out = io.StringIO()
    assert run_training(config, tiny, stop_after_steps=1, out=out) == 0
    log = out.getvalue().splitlines()
    start = log.index(SAMPLE_LEFT_OUT[0])
    assert log[start : start + len(SAMPLE_LEFT_OUT)] == SAMPLE_LEFT_OUT


def test_plan_shows_candles_and_tokens_per_interval_and_category(tmp_path, capsys):
    config = _case(tmp_path, "plan")
    assert main(["plan", "--config", str(config)]) == 0
    out = capsys.readouterr().out
    rows = {line.split()[0]: line for line in out.splitlines() if line.startswith("    ") and " series " in line}
    assert list(rows)[:4] == [*INTERVALS, "crypto"]
    train = {iv: int(rows[iv].split(" candles")[1].split()[0].replace(",", "")) for iv in INTERVALS}
    assert train["15m"] > train["1h"] > train["4h"] > 0  # a coarser interval: fewer candles of one market
    assert "per parameter" in rows["crypto"]
