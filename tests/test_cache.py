"""The parquet candle cache: canonical round trip, safe file names, manifest, incremental merge,
a truncated file reported clearly, and an interrupted write that leaves the old file intact."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, strategies as st

import common.data.cache as cache_module
from common.data.cache import COLUMNS, CandleCache, merge_candles
from common.errors import UserError


def candles(start: str, n: int, freq: str = "D", base: float = 100.0) -> pd.DataFrame:
    index = pd.date_range(start, periods=n, freq=freq, tz="UTC", name="timestamp").as_unit("ns")
    close = base + np.arange(n, dtype=float)
    return pd.DataFrame(
        {"open": close - 0.5, "high": close + 1, "low": close - 1, "close": close, "volume": np.full(n, 1000.0)},
        index=index,
    )


def test_round_trip_is_canonical(tmp_path):
    cache = CandleCache(tmp_path)
    frame = candles("2024-01-01", 5)
    messy = frame.iloc[[3, 0, 4, 1, 2, 2]].copy()  # unsorted, one timestamp twice
    messy.index = messy.index.tz_convert("America/New_York")  # same instants, another zone
    messy["volume"] = messy["volume"].astype("int64")
    messy = messy[["close", "volume", "open", "low", "high"]]  # another column order
    cache.write("yfinance", "1d", "AAPL", messy, adjusted=True)

    back = cache.read("yfinance", "1d", "AAPL")
    assert list(back.columns) == COLUMNS
    assert all(str(t) == "float64" for t in back.dtypes)
    assert str(back.index.dtype) == "datetime64[ns, UTC]" and back.index.name == "timestamp"
    assert back.index.is_monotonic_increasing and back.index.is_unique
    pd.testing.assert_frame_equal(back, frame, check_freq=False)
    assert cache.read("yfinance", "1d", "MSFT") is None


def test_naive_index_is_refused(tmp_path):
    frame = candles("2024-01-01", 3)
    frame.index = frame.index.tz_localize(None)
    with pytest.raises(ValueError, match="tz-aware"):
        CandleCache(tmp_path).write("yfinance", "1d", "AAPL", frame, adjusted=True)


def test_paths_are_safe_and_one_to_one(tmp_path):
    cache = CandleCache(tmp_path)
    symbols = ["BTC/USDT", "BTC_USDT", "BTC%2FUSDT", "^GSPC", "GC=F", "SAP.DE", "..", "BRK-B"]
    paths = [cache.path_for("ccxt", "1h", s) for s in symbols]
    assert len(set(paths)) == len(symbols)
    for path in paths:
        assert path.parent == tmp_path / "ccxt" / "1h"  # no symbol makes a sub-folder or escapes
        assert path.suffix == ".parquet" and not path.name.startswith(".")
    assert cache.path_for("yfinance", "1d", "AAPL") == tmp_path / "yfinance" / "1d" / "AAPL.parquet"
    # every one of them round-trips
    for i, symbol in enumerate(symbols):
        cache.write("ccxt", "1h", symbol, candles("2024-01-01", 2, "h", base=i), adjusted=False)
    for i, symbol in enumerate(symbols):
        assert cache.read("ccxt", "1h", symbol)["close"].iloc[0] == i


def test_manifest_entries(tmp_path):
    cache = CandleCache(tmp_path)
    assert cache.manifest() == {}
    cache.write("yfinance", "1d", "AAPL", candles("2024-01-01", 10), adjusted=True, origin="yahoo")
    cache.write("ccxt", "1h", "BTC/USDT", candles("2024-03-01", 48, "h"), adjusted=False, origin="binance")

    manifest = json.loads((tmp_path / "manifest.json").read_text())  # plain JSON for jq
    assert manifest == cache.manifest()
    entry = manifest["yfinance/1d/AAPL.parquet"]
    assert entry["rows"] == 10 and entry["adjusted"] is True and entry["origin"] == "yahoo"
    assert (entry["source"], entry["interval"], entry["symbol"]) == ("yfinance", "1d", "AAPL")
    assert pd.Timestamp(entry["first"]) == pd.Timestamp("2024-01-01", tz="UTC")
    assert pd.Timestamp(entry["last"]) == pd.Timestamp("2024-01-10", tz="UTC")
    assert pd.Timestamp(entry["fetched_at"]).tzinfo is not None
    btc = cache.manifest_entry("ccxt", "1h", "BTC/USDT")
    assert btc["rows"] == 48 and btc["adjusted"] is False
    assert pd.Timestamp(btc["last"]) == pd.Timestamp("2024-03-02 23:00", tz="UTC")

    cache.append("yfinance", "1d", "AAPL", candles("2024-01-11", 5), adjusted=True, origin="yahoo")
    assert cache.manifest_entry("yfinance", "1d", "AAPL")["rows"] == 15


def test_append_merges_and_new_candles_win(tmp_path):
    cache = CandleCache(tmp_path)
    cache.write("ccxt", "1d", "ETH/USDT", candles("2024-01-01", 10), adjusted=False)
    update = candles("2024-01-09", 5, base=500.0)  # overlaps the last two cached days
    added = cache.append("ccxt", "1d", "ETH/USDT", update, adjusted=False)
    back = cache.read("ccxt", "1d", "ETH/USDT")
    assert added == 3 and len(back) == 13
    assert back.index.is_unique and back.index.is_monotonic_increasing
    assert back.loc["2024-01-08", "close"] == 107.0  # old, untouched
    assert back.loc["2024-01-09", "close"] == 500.0  # overlap: the new candle wins
    assert back["close"].iloc[-1] == 504.0


@given(old_days=st.sets(st.integers(0, 30), max_size=15), new_days=st.sets(st.integers(0, 30), max_size=15))
def test_merge_is_the_union_with_new_values(old_days, new_days):
    day0 = pd.Timestamp("2024-01-01", tz="UTC")

    def frame(days, value):
        index = pd.DatetimeIndex(
            [day0 + pd.Timedelta(days=d) for d in sorted(days)], name="timestamp", dtype="datetime64[ns, UTC]"
        )
        return pd.DataFrame({c: np.full(len(days), value) for c in COLUMNS}, index=index)

    merged = merge_candles(frame(old_days, 1.0), frame(new_days, 2.0))
    assert set(merged.index) == {day0 + pd.Timedelta(days=d) for d in old_days | new_days}
    assert merged.index.is_monotonic_increasing
    for ts, close in merged["close"].items():
        assert close == (2.0 if (ts - day0).days in new_days else 1.0)


def test_truncated_file_is_reported_with_its_path(tmp_path):
    cache = CandleCache(tmp_path)
    cache.write("yfinance", "1d", "AAPL", candles("2024-01-01", 50), adjusted=True)
    path = cache.path_for("yfinance", "1d", "AAPL")
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])  # a copy that stopped halfway
    with pytest.raises(UserError) as info:
        cache.read("yfinance", "1d", "AAPL")
    message = str(info.value)
    assert str(path) in message and "corrupt" in message and "delete it" in message
    assert "marketgpt data download" in message


def test_interrupted_write_leaves_the_old_file(tmp_path, monkeypatch):
    cache = CandleCache(tmp_path)
    old = candles("2024-01-01", 10)
    cache.write("yfinance", "1d", "AAPL", old, adjusted=True)
    manifest_before = (tmp_path / "manifest.json").read_bytes()
    real_write = cache_module.pq.write_table

    def dies_halfway(table, where, **kwargs):
        real_write(table, where, **kwargs)
        with open(where, "r+b") as f:  # half a file on disk, then the job is killed
            f.truncate(100)
        raise KeyboardInterrupt

    monkeypatch.setattr(cache_module.pq, "write_table", dies_halfway)
    with pytest.raises(KeyboardInterrupt):
        cache.append("yfinance", "1d", "AAPL", candles("2024-01-11", 5), adjusted=True)
    monkeypatch.undo()

    pd.testing.assert_frame_equal(cache.read("yfinance", "1d", "AAPL"), old, check_freq=False)
    assert sorted(p.name for p in (tmp_path / "yfinance" / "1d").iterdir()) == ["AAPL.parquet"]  # no temp left
    assert (tmp_path / "manifest.json").read_bytes() == manifest_before


def test_a_broken_manifest_is_an_error_on_every_path_and_a_deleted_one_is_rebuilt_from_the_files(tmp_path):
    """The manifest records which exchange each series came from: an unreadable one is never
    read (or rewritten) as {}; deleted, it comes back whole from the files' own records."""
    cache = CandleCache(tmp_path)
    cache.write("yfinance", "1d", "AAPL", candles("2024-01-01", 3), adjusted=True, origin="yahoo")
    cache.write("ccxt", "1d", "BTC/USDT", candles("2024-01-01", 4), adjusted=False, origin="binance")
    whole = cache.manifest()
    path = tmp_path / "manifest.json"
    path.write_text("{not json")
    for call in (cache.manifest, lambda: cache.write("yfinance", "1d", "MSFT", candles("2024-01-01", 3), True)):
        with pytest.raises(UserError) as e:
            call()
        message = str(e.value)
        assert str(path) in message and "delete it" in message and "rebuilds it" in message and "\n" not in message
    assert path.read_text() == "{not json"  # not reset to the one new entry

    path.unlink()
    msft = whole | {"yfinance/1d/MSFT.parquet": cache.file_record(cache.path_for("yfinance", "1d", "MSFT"))}
    assert cache.manifest() == msft and json.loads(path.read_text()) == msft  # rebuilt and written
    assert msft["ccxt/1d/BTC%2FUSDT.parquet"]["origin"] == "binance"


class NoLocks:
    """fcntl on a Lustre or NFS mount without lock support: flock raises ENOLCK."""

    LOCK_EX, LOCK_UN = 2, 8

    def __init__(self) -> None:
        self.calls = 0

    def flock(self, f, op) -> None:
        import errno

        self.calls += 1
        raise OSError(errno.ENOLCK, "No locks available")


def test_filesystem_without_locks_warns_once_and_goes_on(tmp_path, monkeypatch, caplog):
    fake = NoLocks()
    monkeypatch.setattr(cache_module, "fcntl", fake)
    cache = CandleCache(tmp_path / "lustre")
    cache.write("yfinance", "1d", "AAPL", candles("2024-01-01", 5), adjusted=True)
    cache.append("yfinance", "1d", "AAPL", candles("2024-01-06", 3), adjusted=True)
    cache.write("ccxt", "1d", "BTC/USDT", candles("2024-01-01", 4), adjusted=False)
    assert fake.calls == 3  # every manifest update tried the lock
    warnings = [r for r in caplog.records if "does not support file locks" in r.getMessage()]
    assert len(warnings) == 1 and "No locks available" in warnings[0].getMessage()
    manifest = cache.manifest()
    assert manifest["yfinance/1d/AAPL.parquet"]["rows"] == 8
    assert manifest["ccxt/1d/BTC%2FUSDT.parquet"]["rows"] == 4
