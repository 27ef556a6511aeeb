"""`download_case` and `marketgpt data download`, offline.

Yahoo is the real yfinance code against FakeYahoo (imported from test_yahoo.py, tests/ is on
sys.path under pytest's default import mode); ccxt candles come from a stand-in for
crypto.fetch_ohlcv_history (the ccxt adapter has its own tests in test_crypto.py). The CLI test
blocks the network the way a machine without one does: every `requests` call (yfinance with a
requests session, ccxt) gets a ConnectionError from an empty `responses` mock; pytest-socket
stays on underneath.
"""
from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import responses

from test_yahoo import FakeYahoo, expected_frame, load_chart, ny_midnight

import common.data.cache as cache_module
from common.cli import main
from common.config import Config
from common.data import crypto
from common.data.cache import CandleCache
from common.data.download import download_case
from common.errors import SourceUnavailable

REPO = Path(__file__).resolve().parent.parent
DAY_MS = 86_400_000
NOW = pd.Timestamp("2024-02-05", tz="UTC")


class FakeCcxt:
    """Stands in for crypto.fetch_ohlcv_history: daily candles for any [since, until), values
    fixed by the date, so overlapping fetches agree; "NOPE/USDT" is not listed."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int, int | None]] = []
        self.die_on: str | None = None

    def __call__(self, exchange, symbol, timeframe, since_ms, until_ms=None, **kwargs):
        assert timeframe == "1d" and kwargs["sleep"] is not None
        self.calls.append((symbol, since_ms, until_ms))
        if symbol == self.die_on:
            raise KeyboardInterrupt  # the job is killed while this asset downloads
        if symbol == "NOPE/USDT":
            raise crypto.BadSymbolError(f"{exchange.id} does not list symbol '{symbol}'")
        end = until_ms if until_ms is not None else kwargs["now_ms"]
        stamps = np.arange(since_ms, end, DAY_MS)
        close = 40_000.0 + (stamps // DAY_MS) % 1000
        index = pd.DatetimeIndex(pd.to_datetime(stamps, unit="ms", utc=True), name="timestamp")
        return pd.DataFrame({"open": close, "high": close + 10, "low": close - 10, "close": close,
                             "volume": np.ones(len(stamps))}, index=index)


@pytest.fixture
def case(tmp_path):
    case_dir = tmp_path / "case_t"
    (case_dir / "configs").mkdir(parents=True)
    (case_dir / "universe.csv").write_text(
        "symbol,source,category,name\n"
        "AAPL,yfinance,us_stock,Apple\n"
        "MSFT,yfinance,us_stock,Microsoft\n"
        "GONE,yfinance,us_stock,Delisted Inc\n"
        "BTC/USDT,ccxt,crypto,Bitcoin\n"
        "NOPE/USDT,ccxt,crypto,Not listed\n")
    return case_dir


def config(end_date: str) -> Config:
    cfg = Config()
    cfg.data.start_date, cfg.data.end_date, cfg.data.interval = "2024-01-01", end_date, "1d"
    return cfg


@pytest.fixture
def net(monkeypatch):
    """FakeYahoo + FakeCcxt, zero retry delays, a requests session for yfinance."""
    monkeypatch.setenv("MARKETGPT_RETRY_DELAY_S", "0")
    monkeypatch.setenv("MARKETGPT_YAHOO_HTTP", "requests")
    fake_ccxt = FakeCcxt()
    monkeypatch.setattr(crypto, "fetch_ohlcv_history", fake_ccxt)
    with responses.RequestsMock(assert_all_requests_are_fired=False) as rsps:
        yahoo = FakeYahoo(rsps, {"AAPL": load_chart("aapl_1d.json"), "MSFT": load_chart("msft_1d.json")})
        yield yahoo, fake_ccxt


def run(cfg: Config, case_dir: Path, stream=None):
    return download_case(cfg, case_dir, progress=False, sleep=lambda s: None, now=NOW,
                         stream=stream or io.StringIO())


def test_download_case_fills_the_cache_and_reports(case, net, capsys):
    yahoo, fake_ccxt = net
    progress = io.StringIO()
    summary = run(config("2024-02-01"), case, progress)

    assert [a.symbol for a in summary.ok] == ["AAPL", "MSFT", "BTC/USDT"]
    assert {a.symbol for a in summary.failed} == {"GONE", "NOPE/USDT"}
    assert "delisted or renamed" in summary.assets["GONE"].reason
    assert "does not list" in summary.assets["NOPE/USDT"].reason
    cache = CandleCache(case / "data")
    aapl = cache.read("yfinance", "1d", "AAPL")
    np.testing.assert_allclose(aapl.to_numpy(), expected_frame("aapl_1d.json", daily=True).to_numpy())
    btc = cache.read("ccxt", "1d", "BTC/USDT")
    assert btc.index[0] == pd.Timestamp("2024-01-01", tz="UTC") and btc.index[-1] == pd.Timestamp("2024-01-31", tz="UTC")
    manifest = cache.manifest()
    assert manifest["yfinance/1d/AAPL.parquet"]["adjusted"] is True
    assert manifest["ccxt/1d/BTC%2FUSDT.parquet"]["adjusted"] is False
    assert manifest["ccxt/1d/BTC%2FUSDT.parquet"]["origin"] == "binance"
    assert summary.rows_added == len(aapl) * 2 + len(btc)
    assert summary.date_range == (pd.Timestamp("2024-01-01", tz="UTC"), pd.Timestamp("2024-01-31", tz="UTC"))
    # the failed assets left no files behind
    assert not cache.path_for("yfinance", "1d", "GONE").exists()

    out = capsys.readouterr().out
    assert "3 ok, 0 empty, 2 failed" in out and f"rows added: {summary.rows_added:,}" in out
    assert "2024-01-01 -> 2024-01-31" in out and "GONE (yfinance): no data" in out
    assert "[5/5]" in progress.getvalue()  # plain progress lines when not on a terminal


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_bar_only_on_a_terminal(case, net):
    terminal, pipe = Terminal(), io.StringIO()
    download_case(config("2024-02-01"), case, sleep=lambda s: None, now=NOW, stream=terminal)
    download_case(config("2024-02-01"), case, sleep=lambda s: None, now=NOW, stream=pipe)
    assert "100%|" in terminal.getvalue() and "5/5" in terminal.getvalue()  # tqdm's bar
    assert "[5/5]" not in terminal.getvalue()
    assert pipe.getvalue().splitlines()[-1].startswith("[5/5]")  # plain lines, e.g. in a Slurm log
    assert "|" not in pipe.getvalue()


def test_second_run_fetches_only_new_candles(case, net):
    yahoo, fake_ccxt = net
    first = run(config("2024-01-17"), case)
    cache = CandleCache(case / "data")
    before = cache.read("yfinance", "1d", "AAPL")
    btc_before = cache.read("ccxt", "1d", "BTC/USDT")
    yahoo.history.clear()
    fake_ccxt.calls.clear()

    second = run(config("2024-02-01"), case)

    # Yahoo was asked from the second-to-last cached session on (one candle of overlap)
    overlap_day = before.index[-2].strftime("%Y-%m-%d")
    assert [int(q["period1"]) for q in yahoo.history_of("AAPL")] == [ny_midnight(overlap_day)]
    assert [int(q["period1"]) for q in yahoo.history_of("MSFT")] == [ny_midnight(overlap_day)]
    # ccxt from the last cached candle minus one bar
    assert fake_ccxt.calls[0][:2] == ("BTC/USDT", int(btc_before.index[-2].timestamp() * 1000))
    # the result is exactly the full history: no duplicate, no hole
    aapl = cache.read("yfinance", "1d", "AAPL")
    np.testing.assert_allclose(aapl.to_numpy(), expected_frame("aapl_1d.json", daily=True).to_numpy())
    assert second.assets["AAPL"].rows_added == len(aapl) - len(before)
    assert first.assets["AAPL"].rows_added == len(before)
    assert len(cache.read("ccxt", "1d", "BTC/USDT")) == 31


def test_restated_adjusted_prices_trigger_a_full_download(case, net):
    yahoo, _ = net
    run(config("2024-01-17"), case)
    cache = CandleCache(case / "data")
    old = cache.read("yfinance", "1d", "AAPL")
    cache.write("yfinance", "1d", "AAPL", old * 0.97, adjusted=True, origin="yahoo")  # an older basis
    yahoo.history.clear()

    run(config("2024-02-01"), case)

    starts = [int(q["period1"]) for q in yahoo.history_of("AAPL")]
    assert starts == [ny_midnight(old.index[-2].strftime("%Y-%m-%d")), ny_midnight("2024-01-01")]
    assert len(yahoo.history_of("MSFT")) == 1  # unchanged asset: appended as usual
    np.testing.assert_allclose(cache.read("yfinance", "1d", "AAPL").to_numpy(),
                               expected_frame("aapl_1d.json", daily=True).to_numpy())


def test_resume_after_an_interrupted_download(case, net, monkeypatch):
    yahoo, fake_ccxt = net
    fake_ccxt.die_on = "NOPE/USDT"  # killed after BTC/USDT was saved
    with pytest.raises(KeyboardInterrupt):
        run(config("2024-02-01"), case)
    cache = CandleCache(case / "data")
    saved = {p.name for p in (case / "data").rglob("*.parquet")}
    assert saved == {"AAPL.parquet", "MSFT.parquet", "BTC%2FUSDT.parquet"}

    # A second kill in the middle of writing a file leaves no partial file either.
    fake_ccxt.die_on = None
    real_write = cache_module.pq.write_table
    writes = []

    def killed_on_second_write(table, where, **kwargs):
        writes.append(where)
        real_write(table, where, **kwargs)
        if len(writes) == 2:
            raise KeyboardInterrupt

    monkeypatch.setattr(cache_module.pq, "write_table", killed_on_second_write)
    before = {p: p.read_bytes() for p in (case / "data").rglob("*.parquet")}
    with pytest.raises(KeyboardInterrupt):
        run(config("2024-02-01"), case)
    monkeypatch.setattr(cache_module.pq, "write_table", real_write)
    assert not [p for p in (case / "data").rglob("*") if p.name.endswith(".tmp")]
    msft = cache.path_for("yfinance", "1d", "MSFT")
    assert msft.read_bytes() == before[msft]  # the interrupted file is the old one, intact

    summary = run(config("2024-02-01"), case)  # the rerun completes
    assert [a.symbol for a in summary.ok] == ["AAPL", "MSFT", "BTC/USDT"]
    assert {a.symbol for a in summary.failed} == {"GONE", "NOPE/USDT"}
    np.testing.assert_allclose(cache.read("yfinance", "1d", "MSFT").to_numpy(),
                               expected_frame("msft_1d.json", daily=True).to_numpy())


def test_unreachable_source_raises_after_saving_the_other(case, net):
    yahoo, fake_ccxt = net
    yahoo.down = "connection"
    with pytest.raises(SourceUnavailable, match="Yahoo Finance"):
        run(config("2024-02-01"), case)
    cache = CandleCache(case / "data")
    assert cache.read("yfinance", "1d", "AAPL") is None
    assert len(cache.read("ccxt", "1d", "BTC/USDT")) == 31  # ccxt still ran


def _snapshot(root: Path) -> dict:
    return {p.relative_to(root).as_posix(): (p.read_bytes() if p.is_file() else None, p.stat().st_mtime_ns)
            for p in sorted(root.rglob("*"))}


def test_cli_download_without_network_fails_clearly_and_leaves_the_cache(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("MARKETGPT_RETRY_DELAY_S", "0")  # fail fast: retries without waiting
    monkeypatch.setenv("MARKETGPT_YAHOO_HTTP", "requests")  # a client `responses` can block
    cache_dir = tmp_path / "cache"
    existing = CandleCache(cache_dir)
    index = pd.date_range("2024-01-01", periods=3, tz="UTC", name="timestamp")
    frame = pd.DataFrame({c: [1.0, 2.0, 3.0] for c in ["open", "high", "low", "close", "volume"]}, index=index)
    existing.write("yfinance", "1d", "AAPL", frame, adjusted=True, origin="yahoo")
    before = _snapshot(cache_dir)

    with responses.RequestsMock(assert_all_requests_are_fired=False):  # nothing registered: no network
        code = main(["data", "download", "--case", "case_b_reduced", "--set", f"data.cache_dir={cache_dir}"])

    err = capsys.readouterr().err
    assert code == 2
    assert "marketgpt data: error: could not reach Yahoo Finance and ccxt exchange binance;" in err
    assert _snapshot(cache_dir) == before


def test_case_wrapper_runs_the_cli():
    script = REPO / "case_c_crypto" / "crypto_data_loader.py"
    done = subprocess.run([sys.executable, str(script), "--help"], cwd=script.parent, capture_output=True,
                          text=True, timeout=60, env={**os.environ, "PYTHONPATH": ""})
    assert done.returncode == 0, done.stderr
    assert "marketgpt data download" in done.stdout and "--case" in done.stdout
