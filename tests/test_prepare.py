"""Loading (sample and cache), cleaning, gap filling and the global time split."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, strategies as st

from common.config import Config
from common.data.cache import CandleCache
from common.data.cleaning import FIX_KINDS, clean_candles, fill_gaps
from common.data.loading import load_market_data
from common.data.market_data import MarketData
from common.data.prepare import prepare_data
from common.data.universe import Asset
from common.errors import UserError
from common.markets import interval_step
from common.paths import REPO_ROOT

COLUMNS = ["open", "high", "low", "close", "volume"]


def candles(start: str, n: int, freq: str = "1D", seed: int = 0) -> pd.DataFrame:
    """A valid canonical frame: a random walk with consistent high/low."""
    rng = np.random.default_rng(seed)
    close = 100 * np.exp(np.cumsum(rng.normal(0, 0.01, n)))
    open_ = np.concatenate([[100.0], close[:-1]])
    high = np.maximum(open_, close) * (1 + rng.uniform(0, 0.01, n))
    low = np.minimum(open_, close) * (1 - rng.uniform(0, 0.01, n))
    index = pd.date_range(start, periods=n, freq=freq, tz="UTC", name="timestamp")
    return pd.DataFrame(
        {"open": open_, "high": high, "low": low, "close": close, "volume": rng.uniform(1, 10, n)}, index=index
    )


def config(context: int = 8, purge: int | None = None, interval: str = "1d") -> Config:
    cfg = Config()
    cfg.model.context_length = context
    cfg.data.purge_gap = purge
    cfg.data.interval = interval
    return cfg


def market(
    frames: dict[str, pd.DataFrame], categories: dict[str, str] | None = None, interval: str = "1d"
) -> MarketData:
    categories = categories or {}
    assets = [Asset(s, "sample", categories.get(s, "us_stock"), s) for s in frames]
    return MarketData(assets=assets, candles=dict(frames), interval=interval)


# --------------------------------------------------------------------------- cleaning


def test_clean_counts_and_repairs_every_fix_kind():
    t = pd.date_range("2024-01-01", periods=9, freq="1D", tz="UTC")
    rows = [  # (timestamp, open, high, low, close, volume)
        (t[0], 10, 11, 9, 10.5, 5),
        (t[2], 10, 11, 9, 10.5, 5),  # comes before t[1]: out of order
        (t[1], 10, 11, 9, 10.5, 5),
        (t[3], 10, 11, 9, 10.0, 1),  # duplicated below; the last one wins
        (t[3], 20, 22, 19, 21.0, 2),
        (t[4], 10, 11, 9, np.nan, 5),  # NaN price: dropped
        (t[5], 10, np.inf, 9, 10, 5),  # infinite price: dropped
        (t[6], 0, 11, 9, 10, 5),  # non-positive price: dropped
        (t[7], 10, 9.5, 9, 12, -3),  # high below close, negative volume
        (t[8], 10, 13, 11, 12, np.nan),  # low above open, missing volume
    ]
    raw = pd.DataFrame(
        [r[1:] for r in rows], columns=COLUMNS, index=pd.DatetimeIndex([r[0] for r in rows], name="timestamp")
    )
    clean, fixes = clean_candles(raw, "TEST")

    assert fixes == {
        "out_of_order": 1,
        "duplicates": 1,
        "nan_price": 2,
        "nonpositive_price": 1,
        "high_repaired": 1,
        "low_repaired": 1,
        "volume_clipped": 2,
        "subunit_repaired": 0,
    }
    assert list(clean.index) == [t[0], t[1], t[2], t[3], t[7], t[8]]
    assert clean.loc[t[3]].tolist() == [20, 22, 19, 21, 2]  # the later duplicate
    assert clean.loc[t[7], "high"] == 12 and clean.loc[t[7], "volume"] == 0
    assert clean.loc[t[8], "low"] == 10 and clean.loc[t[8], "volume"] == 0
    assert list(clean.columns) == COLUMNS and (clean.dtypes == np.float64).all()
    assert clean.index.name == "timestamp" and str(clean.index.tz) == "UTC"


def test_clean_leaves_valid_candles_alone():
    raw = candles("2020-01-01", 50)
    clean, fixes = clean_candles(raw, "OK")
    assert set(fixes) == set(FIX_KINDS) and sum(fixes.values()) == 0
    np.testing.assert_array_equal(clean.to_numpy(), raw.to_numpy())
    assert (clean.index == raw.index).all()


def test_clean_takes_naive_as_utc_and_converts_other_zones():
    raw = candles("2020-01-01", 5)
    naive = raw.tz_localize(None)
    assert (clean_candles(naive, "N")[0].index == raw.index).all()
    tokyo = raw.tz_convert("Asia/Tokyo")
    assert (clean_candles(tokyo, "T")[0].index == raw.index).all()


def test_clean_rejects_a_frame_without_prices():
    with pytest.raises(UserError, match="XYZ: candle frame lacks column.*close"):
        clean_candles(candles("2020-01-01", 5).drop(columns="close"), "XYZ")


prices = st.one_of(st.floats(-5, 200), st.just(np.nan), st.just(0.0))


@given(st.lists(st.tuples(st.integers(0, 30), prices, prices, prices, prices, prices), max_size=40))
def test_clean_output_is_always_valid(rows):
    index = pd.DatetimeIndex(pd.Timestamp("2021-01-01", tz="UTC") + pd.to_timedelta([r[0] for r in rows], "h"))
    raw = pd.DataFrame([r[1:] for r in rows], columns=COLUMNS, index=index, dtype=float)
    clean, fixes = clean_candles(raw, "H")
    ts = clean.index
    assert ts.is_monotonic_increasing and ts.is_unique
    o, h, low, c, v = (clean[k].to_numpy() for k in COLUMNS)
    assert np.isfinite(clean[["open", "high", "low", "close"]].to_numpy()).all()
    assert (clean[["open", "high", "low", "close"]].to_numpy() > 0).all()
    assert (h >= np.maximum(o, c)).all() and (low <= np.minimum(o, c)).all() and (v >= 0).all()
    dropped = fixes["duplicates"] + fixes["nan_price"] + fixes["nonpositive_price"]
    assert len(clean) == len(raw) - dropped


# --------------------------------------------------------------------------- gaps


def test_fill_gaps_inserts_nan_rows_on_the_grid():
    full = candles("2024-03-01", 24, freq="1h")
    holes = full.index[[3, 10, 11, 12]]
    frame, filled = fill_gaps(full.drop(holes), interval_step("1h"))
    assert filled == 4
    assert (frame.index == full.index).all()
    assert frame.loc[holes].isna().all().all()
    kept = full.drop(holes)
    np.testing.assert_array_equal(frame.loc[kept.index].to_numpy(), kept.to_numpy())


def test_fill_gaps_ignores_off_grid_holes():
    index = pd.DatetimeIndex(["2024-01-01 00:00", "2024-01-01 01:00", "2024-01-01 03:30"], tz="UTC")
    frame = candles("2024-01-01", 3, freq="1h").set_axis(index.rename("timestamp"))
    out, filled = fill_gaps(frame, interval_step("1h"))
    assert filled == 0 and len(out) == 3


def test_prepare_fills_crypto_gaps_but_not_stock_market_closures():
    stock = candles("2020-01-01", 400, freq="B", seed=1)  # business days: weekends are absent
    crypto = candles("2020-01-01", 560, freq="1D", seed=2)
    holes = crypto.index[[100, 101, 300]]
    data = prepare_data(
        config().data, 8, market({"SPY": stock, "BTC/USDT": crypto.drop(holes)}, {"BTC/USDT": "crypto"})
    )
    assert data.info["assets"]["SPY"]["gaps_filled"] == 0
    assert len(data.candles["SPY"]) == 400
    assert data.info["assets"]["BTC/USDT"]["gaps_filled"] == 3
    assert (data.candles["BTC/USDT"].index == crypto.index).all()
    assert data.candles["BTC/USDT"].loc[holes].isna().all().all()


# --------------------------------------------------------------------------- split


def split_market() -> MarketData:
    # Three assets over different, overlapping periods (daily, 24/7 grid for simplicity).
    return market(
        {
            "OLD": candles("2010-01-01", 3000, seed=1),  # ends 2018-03
            "MID": candles("2014-01-01", 2500, seed=2),  # ends 2020-11
            "NEW": candles("2016-06-01", 2000, seed=3),  # ends 2021-11
        }
    )


def test_cuts_are_global_quantiles_of_all_candles():
    m = split_market()
    cfg = config(context=16)
    data = prepare_data(cfg.data, cfg.model.context_length, m)
    pooled = np.sort(np.concatenate([f.index.as_unit("ns").asi8 for f in m.candles.values()]))
    cut1, cut2 = (c.value for c in data.cuts)
    before1 = np.searchsorted(pooled, cut1) / len(pooled)
    before2 = np.searchsorted(pooled, cut2) / len(pooled)
    assert abs(before1 - cfg.data.train_ratio) < 2 / len(pooled)
    assert abs(before2 - (cfg.data.train_ratio + cfg.data.val_ratio)) < 2 / len(pooled)
    assert data.info["split_cuts"] == {"val_start": data.cuts[0].isoformat(), "test_start": data.cuts[1].isoformat()}

    for symbol, split in data.splits.items():
        ts = data.candles[symbol].index
        assert (ts[split.train.start : split.train.stop] < data.cuts[0]).all()
        val = ts[split.val.start : split.val.stop]
        assert ((val >= data.cuts[0]) & (val < data.cuts[1])).all()
        assert (ts[split.test.start : split.test.stop] >= data.cuts[1]).all()
    # Calendar time is shared: the latest training candle of any asset precedes every
    # val and test candle of every other asset.
    last_train = max(data.candles[s].index[sp.train.stop - 1] for s, sp in data.splits.items())
    first_eval = min(
        data.candles[s].index[r.start] for s, sp in data.splits.items() for r in (sp.val, sp.test) if len(r)
    )
    assert last_train < first_eval


@pytest.mark.parametrize("purge", [None, 40])
def test_purge_gap_separates_the_splits(purge):
    context = 16
    data = prepare_data(config(purge=purge).data, context, split_market())
    gap = purge or context
    assert data.purge_gap == gap and data.info["purge_gap"] == gap
    for symbol, split in data.splits.items():
        n = len(data.candles[symbol])
        ts = data.candles[symbol].index
        first_val = int(np.searchsorted(ts, data.cuts[0]))  # first candle at or after the cut
        first_test = int(np.searchsorted(ts, data.cuts[1]))
        assert split.train == range(0, first_val)
        assert split.val.start == min(first_val + gap, first_test)  # the purged candles belong nowhere
        assert split.test.start == min(first_test + gap, n)
        assert split.val.start - split.train.stop >= gap or len(split.val) == 0
        assert split.test.start - split.val.stop >= gap or len(split.test) == 0
        assert split.test.stop == n


def test_asset_too_short_for_a_training_window_is_dropped_with_the_reason():
    m = split_market()
    # LATE starts just before the train/val cut: a few training candles only.
    cut1 = prepare_data(config().data, 16, m).cuts[0]
    late = candles(str((cut1 - pd.Timedelta(days=5)).date()), 40, seed=4)
    m2 = market({**m.candles, "LATE": late})
    data = prepare_data(config().data, 16, m2)
    before = int((late.index < data.cuts[0]).sum())  # LATE's own candles move the cut a little
    assert 0 < before < 17
    assert "LATE" not in data.splits and "LATE" not in data.candles
    assert [a.symbol for a in data.assets] == ["OLD", "MID", "NEW"]
    assert f"{before} candles before the train/val cut {data.cuts[0].isoformat()}" in data.dropped["LATE"]
    assert "context_length + 1 = 17" in data.dropped["LATE"]
    assert data.info["dropped"][0]["symbol"] == "LATE" and data.info["num_dropped"] == 1


def test_asset_without_candles_is_dropped_not_fatal():
    m = split_market()
    empty = candles("2015-01-01", 0)
    nan_only = candles("2015-01-01", 30).assign(close=np.nan)
    data = prepare_data(config().data, 16, market({**m.candles, "EMPTY": empty, "NAN": nan_only}))
    assert data.dropped["EMPTY"].startswith("no candles")
    assert data.dropped["NAN"] == "no valid candles after cleaning (30 raw rows)"
    assert set(data.splits) == {"OLD", "MID", "NEW"}


def test_short_val_or_test_is_kept_and_marked():
    data = prepare_data(config().data, 16, split_market())
    old = data.splits["OLD"]  # ends long before the test cut: no test candles at all
    assert len(old.test) == 0 and "test" in old.short
    assert data.info["assets"]["OLD"]["no_windows_in"] == list(old.short)
    new = data.splits["NEW"]
    assert new.short == ()


def test_all_assets_too_short_is_a_clear_error():
    m = market({"A": candles("2020-01-01", 100), "B": candles("2020-02-01", 60, seed=1)})
    with pytest.raises(UserError) as err:
        prepare_data(config().data, 128, m)
    message = str(err.value)
    assert "context length 128 is longer than any asset's history (longest: 100 candles" in message
    assert "model.context_length" in message


def test_info_is_json_ready_and_adds_up():
    m = split_market()
    data = prepare_data(config().data, 16, m)
    info = json.loads(json.dumps(data.info, allow_nan=False))
    assert info["interval"] == "1d" and info["num_assets"] == 3
    for symbol, rec in info["assets"].items():
        split = data.splits[symbol]
        assert (rec["train"], rec["val"], rec["test"]) == (len(split.train), len(split.val), len(split.test))
        assert rec["raw_rows"] == len(m.candles[symbol]) == rec["rows"]
        assert rec["first"] == m.candles[symbol].index[0].isoformat()
    for key in ("train", "val", "test", "rows", "raw_rows"):
        assert info["totals"][key] == sum(r[key] for r in info["assets"].values())


# --------------------------------------------------------------------------- loading


def write_case(folder: Path, rows: list[tuple[str, str, str]]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    lines = ["symbol,source,category,name"] + [f"{s},{src},{cat},{s}" for s, src, cat in rows]
    (folder / "universe.csv").write_text("\n".join(lines) + "\n")


UNIVERSE = [("AAPL", "yfinance", "us_stock"), ("GC=F", "yfinance", "commodity"), ("BTC/USDT", "ccxt", "crypto")]


def download_config(cache_dir: str = "data") -> Config:
    cfg = config()
    cfg.data.source = "download"
    cfg.data.start_date = "2015-01-01"
    cfg.data.end_date = "2016-01-01"
    cfg.data.cache_dir = cache_dir
    cfg.data.universe_counts = {"us_stock": 1, "commodity": 1, "crypto": 1}
    return cfg


def test_download_source_reads_the_case_cache(tmp_path: Path):
    write_case(tmp_path, UNIVERSE)
    cache = CandleCache(tmp_path / "data")
    frames = {s: candles("2014-06-01", 800, seed=i) for i, (s, _, _) in enumerate(UNIVERSE)}
    for symbol, source, _ in UNIVERSE:
        cache.write(source, "1d", symbol, frames[symbol], adjusted=source == "yfinance")
    cache.write("yfinance", "1h", "AAPL", candles("2015-01-01", 10, freq="1h"), adjusted=True)  # other interval

    data = load_market_data(download_config().data, tmp_path)
    assert [a.symbol for a in data.assets] == ["AAPL", "GC=F", "BTC/USDT"] and data.interval == "1d"
    for symbol, frame in data.candles.items():
        expected = frames[symbol].loc["2015-01-01":"2015-12-31"]  # [start_date, end_date)
        assert (frame.index == expected.index).all()
        np.testing.assert_array_equal(frame.to_numpy(), expected.to_numpy())
    prepared = prepare_data(download_config().data, 8, data)  # and the result feeds the split
    assert set(prepared.splits) == {"AAPL", "GC=F", "BTC/USDT"}


def test_empty_cache_says_to_run_the_download(tmp_path: Path):
    write_case(tmp_path / "my_case", UNIVERSE)
    with pytest.raises(UserError) as err:
        load_market_data(download_config().data, tmp_path / "my_case")
    message = str(err.value)
    assert f"marketgpt data download --case {tmp_path / 'my_case'}" in message
    assert "no 1d candles in the cache" in message and "data.source to 'sample'" in message


def test_missing_assets_are_left_out_with_a_warning_and_recorded(tmp_path: Path, capsys):
    write_case(tmp_path, UNIVERSE)
    CandleCache(tmp_path / "data").write("yfinance", "1d", "AAPL", candles("2015-01-01", 300), adjusted=True)
    data = load_market_data(download_config().data, tmp_path)
    warning = capsys.readouterr().err
    assert re.search(r"2 of 3 assets have no 1d candles .*\(GC=F, BTC/USDT\).*marketgpt data download", warning)
    assert [a.symbol for a in data.assets] == ["AAPL", "GC=F", "BTC/USDT"]  # ids stay those of the universe
    assert data.candles["GC=F"].empty and data.candles["BTC/USDT"].empty
    prepared = prepare_data(download_config().data, 8, data)
    assert set(prepared.splits) == {"AAPL"}
    assert "not in the cache" in prepared.dropped["GC=F"] and "not in the cache" in prepared.dropped["BTC/USDT"]


def test_data_categories_reads_only_those_assets_from_the_cache(tmp_path: Path, capsys, monkeypatch):
    write_case(tmp_path, UNIVERSE)
    CandleCache(tmp_path / "data").write("ccxt", "1d", "BTC/USDT", candles("2015-01-01", 300), adjusted=False)
    cfg = download_config()
    cfg.data.categories = ["crypto"]
    read = []
    real = CandleCache.read
    monkeypatch.setattr(
        CandleCache,
        "read",
        lambda self, source, interval, symbol: read.append(symbol) or real(self, source, interval, symbol),
    )
    data = load_market_data(cfg.data, tmp_path)
    assert [a.symbol for a in data.assets] == ["BTC/USDT"] and read == []  # each asset is read when used
    assert len(data.candles["BTC/USDT"]) == 300 and read == ["BTC/USDT"]
    assert "no 1d candles" not in capsys.readouterr().err  # no warning about the assets left out on purpose
    cfg.data.categories = ["fx"]
    with pytest.raises(UserError, match=r"no asset of fx in this universe \(it has commodity, crypto, us_stock\)"):
        load_market_data(cfg.data, tmp_path)


def test_a_repo_case_is_named_by_its_folder_name(tmp_path: Path):
    cfg = download_config(cache_dir=str(tmp_path / "empty_cache"))  # absolute: ignores the case folder
    cfg.data.universe_counts = {"crypto": 20}
    with pytest.raises(UserError, match=r"`marketgpt data download --case case_c_crypto`"):
        load_market_data(cfg.data, REPO_ROOT / "case_c_crypto")


def test_download_source_checks_universe_counts(tmp_path: Path):
    write_case(tmp_path, UNIVERSE)
    cfg = download_config()
    cfg.data.universe_counts = {"us_stock": 2, "commodity": 1, "crypto": 1}
    with pytest.raises(UserError, match="category 'us_stock' has 1 assets.*expects 2"):
        load_market_data(cfg.data, tmp_path)


@pytest.mark.parametrize("interval", ["1d", "1h"])
def test_sample_source_loads_the_shipped_sample(interval: str, tmp_path: Path):
    cfg = config(context=32, interval=interval)
    cfg.data.source = "sample"
    data = load_market_data(cfg.data, tmp_path)  # the case folder is not needed for the sample
    assert data.interval == interval and data.assets
    assert all(a.source == "sample" for a in data.assets)
    assert [a.symbol for a in data.assets] == list(data.candles)
    prepared = prepare_data(cfg.data, cfg.model.context_length, data)
    assert prepared.assets and prepared.info["source"] == "sample"


def test_the_pipeline_fits_the_tokenizer_on_candles_before_the_first_split_cut(tmp_path: Path, monkeypatch):
    from common.commands.training_run import _prepare_new
    from common.tokens.tokenizer import OHLCTokenizer

    fitted: list[pd.DataFrame] = []
    real_fit = OHLCTokenizer.fit

    def spy(self, frames, *args, **kwargs):
        frames = list(frames.values() if isinstance(frames, dict) else frames)  # may be a generator
        fitted.extend(frames)
        return real_fit(self, frames, *args, **kwargs)

    monkeypatch.setattr(OHLCTokenizer, "fit", spy)
    cfg = config(context=16, interval="1d")
    cfg.data.source = "sample"
    prepared = _prepare_new(cfg, tmp_path)  # what `marketgpt train` runs for a new run
    tokens, data_info = prepared.tokens, prepared.data_info
    assert fitted and sum(len(f) for f in fitted) > 0
    last_fitted = max(f.index.max() for f in fitted if len(f))
    first_cut = pd.Timestamp(data_info["split_cuts"]["val_start"])
    assert last_fitted < first_cut
    # and the fit saw the train split of every asset, not less
    assert sorted(len(f) for f in fitted) == sorted(
        tokens.ranges[s]["train"][1] - tokens.ranges[s]["train"][0] for s in tokens.symbols
    )


def test_sample_source_refuses_an_interval_it_does_not_have(tmp_path: Path):
    cfg = config(interval="4h")
    cfg.data.source = "sample"
    with pytest.raises(UserError, match="'4h'.*1d, 1h"):
        load_market_data(cfg.data, tmp_path)


# --------------------------------------------------------------------------- eras that do not overlap


def _overlaps(a: pd.DatetimeIndex, b: pd.DatetimeIndex) -> bool:
    return len(a) > 0 and len(b) > 0 and a[0] <= b[-1] and b[0] <= a[-1]


def test_assets_in_separate_eras_are_split_on_their_own_dates(capsys):
    # OLD and OLD2 overlap each other (one era); NEW starts after both end (another era).
    m = market(
        {
            "OLD": candles("2010-01-01", 600, seed=1),
            "OLD2": candles("2010-06-01", 400, seed=2),
            "NEW": candles("2016-01-01", 500, seed=3),
        }
    )
    data = prepare_data(config().data, 16, m)
    assert set(data.splits) == {"OLD", "OLD2", "NEW"}
    eras = data.info["split_eras"]
    assert [e["symbols"] for e in eras] == [["OLD", "OLD2"], ["NEW"]]
    for era in eras:  # each era's cuts are its own pooled quantiles
        pooled = np.sort(np.concatenate([m.candles[s].index.as_unit("ns").asi8 for s in era["symbols"]]))
        share = np.searchsorted(pooled, pd.Timestamp(era["val_start"]).value) / len(pooled)
        assert abs(share - 0.70) < 2 / len(pooled)
    for split in data.splits.values():  # every asset has all three splits
        assert min(len(split.train), len(split.val), len(split.test)) > 17 and not split.short
    # No asset's val or test period overlaps another asset's training period.
    periods = {
        s: {
            name: data.candles[s].index[getattr(sp, name).start : getattr(sp, name).stop]
            for name in ("train", "val", "test")
        }
        for s, sp in data.splits.items()
    }
    for a in periods:
        for b in periods:
            if a != b:
                for name in ("val", "test"):
                    assert not _overlaps(periods[a][name], periods[b]["train"]), (a, name, b)
    # data.cuts / split_cuts are the era with the most candles (OLD + OLD2)
    assert data.info["split_cuts"]["val_start"] == eras[0]["val_start"]
    assert "2 eras that do not overlap" in capsys.readouterr().err


def test_one_era_keeps_the_shared_cuts_and_records_no_eras():
    data = prepare_data(config().data, 16, split_market())
    assert "split_eras" not in data.info


def test_shipped_hourly_sample_has_a_test_split_under_case_c():
    from common.config import load_config

    cfg = load_config(REPO_ROOT / "case_c_crypto/configs/crypto_prototype.json", ["data.source=sample"])
    assert cfg.data.interval == "1h"
    data = prepare_data(cfg.data, cfg.model.context_length, load_market_data(cfg.data, REPO_ROOT / "case_c_crypto"))
    window = cfg.model.context_length + 1
    assert set(data.splits) == {"BTC-USD", "EURUSD=X"}
    for split in data.splits.values():
        assert len(split.test) >= window and len(split.val) >= window
    assert [e["symbols"] for e in data.info["split_eras"]] == [["EURUSD=X"], ["BTC-USD"]]


def test_case_c_trains_on_the_hourly_sample_and_writes_test_results(tmp_path: Path):
    import shutil

    from common.cli import main

    case = tmp_path / "case_c_crypto"
    shutil.copytree(REPO_ROOT / "case_c_crypto" / "configs", case / "configs")
    shutil.copy(REPO_ROOT / "case_c_crypto" / "universe.csv", case / "universe.csv")
    tiny = [
        "data.source=sample",
        "model.context_length=32",
        "model.d_model=32",
        "model.num_layers=1",
        "model.num_heads=2",
        "model.d_ff=64",
        "training.epochs=1",
        "training.max_steps_per_epoch=2",
        "training.eval_max_batches=1",
        "training.warmup_steps=1",
        "training.device=cpu",
        "training.scorecard_origins=0",
        "training.vol_reversion=false",
    ]
    args = ["train", "--config", str(case / "configs" / "crypto_prototype.json")]
    assert main(args + [a for kv in tiny for a in ("--set", kv)]) == 0
    (run,) = (case / "checkpoints").glob("crypto_prototype_*")
    info = json.loads((run / "data_info.json").read_text())
    assert info["interval"] == "1h" and len(info["split_eras"]) == 2
    assert all(info["assets"][s]["test"] > 32 for s in ("BTC-USD", "EURUSD=X"))
    results = json.loads((run / "test_results.json").read_text())
    assert results["num_tokens"] > 0 and set(results["per_asset"]) == {"BTC-USD", "EURUSD=X"}


# --------------------------------------------------------------------------- what was left out


def _left_out_info(intervals: list[str] | None = None) -> dict:
    """A data_info of 600 assets: 30 fx ones not in the cache, 10 stocks too short, 6 without test windows."""
    cut = "12 candles before the train/val cut 2021-03-01T00:00:00+00:00 (of 40); a training window needs 257"
    kept = {
        f"S{i:03d}": {"category": "us_stock" if i < 500 else "crypto", "no_windows_in": ["test"] * (i % 100 == 0)}
        for i in range(560)
    }
    dropped = [
        {
            "symbol": f"FX{i:02d}",
            "category": "fx",
            "reason": "no candles (not in the cache, or none in the configured date range)",
        }
        for i in range(30)
    ] + [{"symbol": f"NEW{i}", "category": "us_stock", "reason": cut} for i in range(10)]
    return {
        "context_length": 256,
        "assets": kept,
        "dropped": dropped,
        **({"intervals": intervals} if intervals else {}),
    }


def test_left_out_counts_reasons_and_categories_in_a_few_lines_and_warns_of_a_lost_category():
    from common.data.check import left_out

    lines, warnings = left_out(_left_out_info())
    assert lines == [
        'Left out: 40 of 600 assets (each one\'s reason: "dropped" in data_info.json)',
        "  30 with no candles (not in the cache, or none in the date range): fx 30; FX00, FX01, FX02, FX03, FX04 "
        "and 25 more",
        "  10 with fewer than context_length + 1 = 257 candles before the train/val cut: us_stock 10; NEW0, NEW1, "
        "NEW2, NEW3, NEW4 and 5 more",
        "No test windows in 6 of 560 kept assets (fewer than 2 test candles after the purge "
        "gap): us_stock 5, crypto 1; S000, S100, S200, S300, S400 and 1 more",
    ]
    assert warnings == [
        "WARNING: category fx: 30 of 30 assets left out: the run neither trains nor tests on it "
        '(see "dropped" and "no_windows_in" in data_info.json)'
    ]
    assert left_out({"context_length": 8, "assets": {"A": {"category": "fx", "no_windows_in": []}}, "dropped": []}) == (
        [],
        [],
    )
    info = _left_out_info()
    for record in info["assets"].values():
        record["no_windows_in"] = ["val", "test"]
    assert left_out(info)[1] == [  # once for all, not for each category
        'WARNING: all assets: none of 560 kept assets has a validation or test window (see "dropped" and '
        '"no_windows_in" in data_info.json)',
        warnings[0],
    ]


def test_left_out_warns_once_of_an_interval_lost_whole():
    """A token shard prepared before intervals without windows were refused: the run still says so."""
    from common.data.check import left_out

    info = _left_out_info(["1h", "1d"])
    info["assets"] = {f"{s}@1d": r for s, r in info["assets"].items()}
    info["dropped"] = [{**d, "symbol": f"{d['symbol']}@1d"} for d in info["dropped"]] + [
        {"symbol": f"{s}@1h", "category": r["category"], "reason": "0 candles before the train/val cut"}
        for s, r in list(info["assets"].items())[:3]
    ]
    _, warnings = left_out(info)
    assert [w.split(": ")[1] for w in warnings] == ["interval 1h", "category fx"]  # not fx at 1d, nor each at 1h
    assert warnings[0].startswith("WARNING: interval 1h: 3 of 3 series left out")


def test_case_a_daily_config_gets_validation_and_test_windows():
    """Case A's own settings (context 512, purge gap 512, 70/15/15) on 21 years of daily candles:
    each val split holds about 300 candles after its purge gap, fewer than a window, and every
    one of them is still a validation target (the windows read context from the gap)."""
    import torch

    from common.config import load_config
    from common.special_tokens import PAD_TOKEN
    from common.training.batches import build_windows

    cfg = load_config(REPO_ROOT / "case_a_full_market/configs/full_market_config.json")
    frames = {s: candles("2005-01-03", 5500, freq="B", seed=i) for i, s in enumerate(("AAA", "BBB"))}
    data = prepare_data(cfg.data, cfg.model.context_length, market(frames))
    T = cfg.model.context_length
    ranges = {}
    for s, split in data.splits.items():
        assert split.short == () and data.info["assets"][s]["no_windows_in"] == []
        assert 0 < len(split.val) < T + 1 and 0 < len(split.test) < T + 1  # shorter than a window
        ranges[s] = {
            name: (r.start, r.stop) for name, r in (("train", split.train), ("val", split.val), ("test", split.test))
        }
    tokens = {s: np.arange(len(frames[s])) % 97 + 3 for s in frames}
    w = build_windows(
        tokens, ranges, {"AAA": 0, "BBB": 1}, {"AAA": 0, "BBB": 0}, T, strides={"train": 1, "val": T, "test": T}
    )
    for name in ("val", "test"):
        batch = w.gather(name, torch.arange(w.num_windows(name)))
        assert int((batch.y != PAD_TOKEN).sum()) == sum(r[name][1] - r[name][0] for r in ranges.values())


def test_pooled_cuts_are_the_exact_quantiles_of_every_timestamp():
    """global_cuts counts candles per day (a day array grown as assets reach earlier or later
    days, pre-1970 ones too) instead of holding every stamp: its cuts equal a sort of them all."""
    from common.data.split_cuts import global_cuts

    rng = np.random.default_rng(3)
    day = 86_400 * 10**9
    assets = [
        np.sort(rng.integers(lo * day, hi * day, size=n))
        for lo, hi, n in [(100, 400, 5_000), (-50, 20, 800), (380, 900, 3_000), (0, 1, 1), (200, 210, 0)]
    ]
    every = np.sort(np.concatenate(assets))
    for q1, q2 in [(0.7, 0.85), (0.0, 1.0), (0.5, 0.5)]:
        expected = tuple(int(every[int(np.floor(q * (len(every) - 1)))]) for q in (q1, q2))
        assert global_cuts(lambda: iter(assets), q1, q2) == expected
