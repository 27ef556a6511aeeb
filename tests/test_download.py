"""`download_case` and `marketgpt data download`, offline.

Yahoo is the real yfinance code against FakeYahoo (imported from test_yahoo.py, tests/ is on
sys.path under pytest's default import mode); ccxt candles come from a stand-in for
crypto_history.iter_ohlcv_history (the ccxt adapter has its own tests in test_crypto.py), except in the
long-history tests, which run the real adapter on a fake exchange. The CLI test
blocks the network the way a machine without one does: every `requests` call (yfinance with a
requests session, ccxt) gets a ConnectionError from an empty `responses` mock; pytest-socket
stays on underneath.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import responses

import common.data.cache as cache_module
from common.cli import main
from common.config import Config
from common.data import crypto, crypto_history
from common.data.cache import CandleCache
from common.data.download import TRAINING_CHECK, download_case
from common.errors import SourceUnavailable

from test_crypto import BINANCE, BITSTAMP_MARKETS
from test_yahoo import FakeYahoo, expected_frame, load_chart, ny_midnight

REPO = Path(__file__).resolve().parent.parent
DAY_MS = 86_400_000
NOW = pd.Timestamp("2024-02-05", tz="UTC")


class FakeCcxt:
    """Stands in for crypto_history.iter_ohlcv_history: daily candles for any [since, until) in one chunk,
    values fixed by the date, so overlapping fetches agree; "NOPE/USDT" is not listed."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int, int | None]] = []
        self.die_on: str | None = None

    def __call__(self, exchange, symbol, timeframe, since_ms, until_ms=None, **kwargs):
        assert timeframe == "1d" and kwargs["retry"].sleep is not None
        self.calls.append((symbol, since_ms, until_ms))
        if symbol == self.die_on:
            raise KeyboardInterrupt  # the job is killed while this asset downloads
        if symbol.startswith("NOPE/"):
            raise crypto.BadSymbolError(f"{exchange.id} does not list symbol '{symbol}'")
        end = until_ms if until_ms is not None else kwargs["now_ms"]
        stamps = np.arange(since_ms, end, DAY_MS)
        close = 40_000.0 + (stamps // DAY_MS) % 1000
        index = pd.DatetimeIndex(pd.to_datetime(stamps, unit="ms", utc=True), name="timestamp")
        yield pd.DataFrame(
            {"open": close, "high": close + 10, "low": close - 10, "close": close, "volume": np.ones(len(stamps))},
            index=index,
        )


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
        "NOPE/USDT,ccxt,crypto,Not listed\n"
    )
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
    monkeypatch.setattr(crypto_history, "iter_ohlcv_history", fake_ccxt)
    with responses.RequestsMock(assert_all_requests_are_fired=False) as rsps:
        yahoo = FakeYahoo(rsps, {"AAPL": load_chart("aapl_1d.json"), "MSFT": load_chart("msft_1d.json")})
        yahoo.rsps = rsps
        # binance's market list, parsed by ccxt (fetch_ohlcv_history itself is FakeCcxt)
        rsps.add(
            responses.GET,
            "https://api.binance.com/api/v3/exchangeInfo",
            body=(BINANCE / "exchange_info.json").read_text(encoding="utf-8"),
        )
        yield yahoo, fake_ccxt


def run(cfg: Config, case_dir: Path, stream=None):
    return download_case(cfg, case_dir, progress=False, sleep=lambda s: None, now=NOW, stream=stream or io.StringIO())


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
    assert btc.index[0] == pd.Timestamp("2024-01-01", tz="UTC")
    assert btc.index[-1] == pd.Timestamp("2024-01-31", tz="UTC")
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
    np.testing.assert_allclose(
        cache.read("yfinance", "1d", "AAPL").to_numpy(), expected_frame("aapl_1d.json", daily=True).to_numpy()
    )


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
    np.testing.assert_allclose(
        cache.read("yfinance", "1d", "MSFT").to_numpy(), expected_frame("msft_1d.json", daily=True).to_numpy()
    )


def test_unreachable_source_raises_after_saving_the_other(case, net):
    yahoo, fake_ccxt = net
    yahoo.down = "connection"
    with pytest.raises(SourceUnavailable, match="Yahoo Finance"):
        run(config("2024-02-01"), case)
    cache = CandleCache(case / "data")
    assert cache.read("yfinance", "1d", "AAPL") is None
    assert len(cache.read("ccxt", "1d", "BTC/USDT")) == 31  # ccxt still ran


def _snapshot(root: Path) -> dict:
    return {
        p.relative_to(root).as_posix(): (p.read_bytes() if p.is_file() else None, p.stat().st_mtime_ns)
        for p in sorted(root.rglob("*"))
    }


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
    after = _snapshot(cache_dir)
    check = json.loads(after.pop(TRAINING_CHECK)[0])  # the only new file: what would train now
    assert _snapshot(cache_dir) != before and after == before  # the candles are as they were
    assert check["usable"] == 0 and check["assets"] == 100 and check["problem"]


def test_case_wrapper_runs_the_cli():
    script = REPO / "case_c_crypto" / "crypto_data_loader.py"
    done = subprocess.run(
        [sys.executable, str(script), "--help"],
        cwd=script.parent,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": ""},
    )
    assert done.returncode == 0, done.stderr
    assert "marketgpt data download" in done.stdout and "--case" in done.stdout


# --------------------------------------------------------------------------- what will train


def late_listed_chart(sessions: int) -> dict:
    """AAPL's chart with only its last `sessions` bars: a ticker listed at the end of the range."""
    chart = load_chart("aapl_1d.json")
    result = chart["chart"]["result"][0]
    result["timestamp"] = result["timestamp"][-sessions:]
    quote = result["indicators"]["quote"][0]
    for key in quote:
        quote[key] = quote[key][-sessions:]
    result["indicators"]["adjclose"][0]["adjclose"] = result["indicators"]["adjclose"][0]["adjclose"][-sessions:]
    result["events"] = {}
    return chart


def small_config(case_dir: Path, **data) -> Path:
    """A config file in the case with a context short enough for a month of daily candles."""
    values = {"start_date": "2024-01-01", "end_date": "2024-02-01", "interval": "1d", **data}
    path = case_dir / "configs" / "small.json"
    path.write_text(json.dumps({"model": {"context_length": 4}, "data": values}), encoding="utf-8")
    return path


def test_usable_for_training_is_printed_recorded_and_checked_offline(case, net, capsys):
    yahoo, _ = net
    yahoo.charts["LATE"] = late_listed_chart(4)
    with open(case / "universe.csv", "a", encoding="utf-8") as f:
        f.write("LATE,yfinance,us_stock,Listed late\n")
    path = small_config(case)
    from common.config import load_config

    summary = run(load_config(path), case)

    usable = summary.usable
    assert usable.usable == ["AAPL", "MSFT", "BTC/USDT"] and usable.total == 6
    assert list(usable.unusable) == ["GONE", "NOPE/USDT", "LATE"]
    assert "no candles" in usable.unusable["GONE"]
    assert "0 candles before the train/val cut" in usable.unusable["LATE"]
    out = capsys.readouterr().out
    assert "Usable for training (1d, context 4): 3 of 6 assets" in out and "LATE: 0 candles before" in out
    recorded = json.loads((case / "data" / TRAINING_CHECK).read_text())
    assert recorded["usable"] == 3 and set(recorded["not_usable"]) == {"GONE", "NOPE/USDT", "LATE"}
    # MARKETGPT_YAHOO_HTTP=requests: yfinance's browser headers, not python-requests'
    assert yahoo.headers[-1]["User-Agent"].startswith("Mozilla/5.0")

    # `marketgpt data check`: the same from the cache, with every network request refused
    with responses.RequestsMock(assert_all_requests_are_fired=False):
        code = main(["data", "check", "--case", str(case), "--config", str(path)])
    checked = capsys.readouterr().out
    assert code == 1  # some assets are not usable
    assert "Usable for training (1d, context 4): 3 of 6 assets" in checked
    assert checked.splitlines()[0] == out[out.index("Usable for training") :].splitlines()[0]
    # candles and training tokens of the usable assets per interval and per category
    rows = {line.split()[0]: line.split() for line in checked.splitlines() if " series " in line}
    assert rows["1d"][1] == "3" and rows["crypto"][1] == "1" and int(rows["us_stock"][1]) == 2
    assert recorded["by"]["interval"]["1d"]["train_tokens"] == int(rows["1d"][5].replace(",", "")) > 0


def test_data_check_with_an_empty_cache_says_so(case, capsys):
    path = small_config(case)
    code = main(["data", "check", "--case", str(case), "--config", str(path)])
    out = capsys.readouterr().out
    assert code == 2
    assert "0 of 5 assets" in out and "marketgpt data download" in out


def test_pence_glitch_is_repaired_and_counted_in_data_info(case, net):
    yahoo, _ = net
    yahoo.charts["VOD.L"] = load_chart("vod_l_1d.json")
    with open(case / "universe.csv", "a", encoding="utf-8") as f:
        f.write("VOD.L,yfinance,eu_stock,Vodafone\n")
    from common.config import load_config
    from common.data.loading import load_market_data
    from common.data.prepare import prepare_data

    cfg = load_config(small_config(case))
    summary = run(cfg, case)
    assert summary.usable.fixes["subunit_repaired"] == 1
    raw = CandleCache(case / "data").read("yfinance", "1d", "VOD.L")
    prepared = prepare_data(cfg.data, cfg.model.context_length, load_market_data(cfg.data, case))
    info = prepared.info
    assert info["assets"]["VOD.L"]["fixes"]["subunit_repaired"] == 1
    assert info["totals"]["fixes"]["subunit_repaired"] == 1
    glitch = pd.Timestamp("2024-01-19", tz="UTC")  # the bar Yahoo sent in pounds
    assert raw.loc[glitch, "close"] < 100  # cached as Yahoo sent it ...
    clean = prepared.candles["VOD.L"]
    assert clean.loc[glitch, "close"] == pytest.approx(raw.loc[glitch, "close"] * 100)  # ... repaired for training
    neighbours = clean["close"].drop(glitch)
    assert neighbours.min() * 0.9 < clean.loc[glitch, "close"] < neighbours.max() * 1.1


def test_unreachable_ticker_is_not_failed_and_a_rerun_fetches_it(case, net, capsys):
    yahoo, _ = net
    yahoo.down_for["MSFT"] = "timeout"
    summary = run(config("2024-02-01"), case)
    assert summary.assets["MSFT"].status == "unreachable" and "ReadTimeout" in summary.assets["MSFT"].reason
    assert {a.symbol for a in summary.failed} == {"GONE", "NOPE/USDT"}
    assert summary.exit_code == 1
    out = capsys.readouterr().out
    assert "unreachable (rate limited or timed out; run the same command again later):" in out
    assert "MSFT (yfinance)" in out.split("unreachable (rate limited")[1]

    yahoo.down_for.clear()
    yahoo.history.clear()
    again = run(config("2024-02-01"), case)
    assert again.assets["MSFT"].status == "ok"
    # MSFT from the start; AAPL only from its overlap candle on
    assert [int(q["period1"]) for q in yahoo.history_of("MSFT")] == [ny_midnight("2024-01-01")]
    assert [int(q["period1"]) for q in yahoo.history_of("AAPL")] == [ny_midnight("2024-01-30")]


def test_inactive_pair_is_kept_and_reported(case, net, capsys):
    with open(case / "universe.csv", "a", encoding="utf-8") as f:
        f.write("LUNA/USDT,ccxt,crypto,Terra\n")
    summary = run(config("2024-02-01"), case)
    luna = summary.assets["LUNA/USDT"]
    assert luna.status == "inactive" and "BREAK" in luna.reason
    assert summary.assets["BTC/USDT"].status == "ok"
    assert CandleCache(case / "data").read("ccxt", "1d", "LUNA/USDT") is not None  # candles up to then kept
    assert summary.exit_code == 1
    assert "inactive (halted or delisted" in capsys.readouterr().out


def test_exchange_refusing_the_location_stops_crypto_with_one_clear_line(case, net, capsys):
    yahoo, fake_ccxt = net
    yahoo.rsps.replace(
        responses.GET,
        "https://api.binance.com/api/v3/exchangeInfo",
        status=451,
        body=(BINANCE / "restricted_451.json").read_text(encoding="utf-8"),
    )
    path = small_config(case)
    code = main(["data", "download", "--case", str(case), "--config", str(path)])
    captured = capsys.readouterr()
    assert code == 2
    error = [line for line in captured.err.splitlines() if "error:" in line]
    assert len(error) == 1 and "binance refuses requests from this machine's location (HTTP 451" in error[0]
    assert "data.exchange" in error[0] and "bitstamp" in error[0]
    assert "refused: ccxt exchange binance" in captured.out  # the summary came first
    assert fake_ccxt.calls == []  # no candles asked for
    assert CandleCache(case / "data").read("yfinance", "1d", "AAPL") is not None  # Yahoo's part was saved


def test_quote_currency_fetches_usd_pairs_on_bitstamp(case, net):
    yahoo, fake_ccxt = net
    yahoo.rsps.add(responses.GET, "https://www.bitstamp.net/api/v2/markets/", json=BITSTAMP_MARKETS)
    cfg = config("2024-02-01")
    cfg.data.exchange, cfg.data.quote_currency = "bitstamp", "USD"
    summary = run(cfg, case)
    assert [c[0] for c in fake_ccxt.calls] == ["BTC/USD", "NOPE/USD"]
    assert summary.assets["BTC/USDT"].status == "ok"  # cached under the universe's symbol
    entry = CandleCache(case / "data").manifest_entry("ccxt", "1d", "BTC/USDT")
    assert entry["origin"] == "bitstamp USD"


def test_a_lost_manifest_never_merges_two_exchanges_candles(case, net, capsys):
    """Candles from binance, then the manifest is damaged: the download stops in one line naming
    it; deleted as that line says, it is rebuilt from the files, so a config now on bitstamp
    fetches the whole history again instead of appending bitstamp's candles to binance's."""
    yahoo, fake_ccxt = net
    yahoo.rsps.add(responses.GET, "https://www.bitstamp.net/api/v2/markets/", json=BITSTAMP_MARKETS)
    run(config("2024-01-17"), case)
    manifest = case / "data" / "manifest.json"
    btc = CandleCache(case / "data").path_for("ccxt", "1d", "BTC/USDT")
    before = btc.read_bytes()
    manifest.write_text("{not json")
    path = small_config(case, exchange="bitstamp", quote_currency="USD")
    capsys.readouterr()
    assert main(["data", "download", "--case", str(case), "--config", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and str(manifest) in err and "delete it" in err, err
    assert btc.read_bytes() == before and manifest.read_text() == "{not json"

    manifest.unlink()
    fake_ccxt.calls.clear()
    stream = io.StringIO()
    cfg = config("2024-02-01")
    cfg.data.exchange, cfg.data.quote_currency = "bitstamp", "USD"
    run(cfg, case, stream)
    (btc_call,) = [c for c in fake_ccxt.calls if c[0] == "BTC/USD"]
    assert btc_call[1] == pd.Timestamp("2024-01-01", tz="UTC").value // 1_000_000  # the whole history
    assert "came from binance" in stream.getvalue()
    assert CandleCache(case / "data").manifest_entry("ccxt", "1d", "BTC/USDT")["origin"] == "bitstamp USD"


def test_a_cached_file_without_any_record_of_its_origin_is_downloaded_again_in_full(case, net):
    """A file of an older version (no record in its metadata) whose manifest entry is gone: where
    its candles came from is unknown, so they are replaced, not extended."""
    _, fake_ccxt = net
    cache = CandleCache(case / "data")
    index = pd.date_range("2024-01-01", periods=9, freq="D", tz="UTC", name="timestamp")
    frame = pd.DataFrame({c: np.full(9, 1.0) for c in ("open", "high", "low", "close", "volume")}, index=index)
    path = cache.path_for("ccxt", "1d", "BTC/USDT")
    path.parent.mkdir(parents=True)
    pq.write_table(pa.Table.from_pandas(frame, preserve_index=True), path)  # no record, no manifest
    assert cache.manifest() == {}
    fake_ccxt.calls.clear()
    stream = io.StringIO()
    run(config("2024-02-01"), case, stream)
    (btc_call,) = [c for c in fake_ccxt.calls if c[0] == "BTC/USDT"]
    assert btc_call[1] == pd.Timestamp("2024-01-01", tz="UTC").value // 1_000_000
    assert "records no origin" in stream.getvalue()


def test_shipped_universes_are_dated():
    from common.data.universe import universe_as_of

    for universe in sorted(REPO.glob("case_*/universe.csv")):
        as_of = universe_as_of(universe)
        assert as_of is not None, f"{universe} has no '# As of YYYY-MM-DD' line"
        pd.Timestamp(as_of)  # a real date


# --------------------------------------------------------------------------- long ccxt histories
# The real adapter (crypto_history.iter_ohlcv_history) on a binance whose klines answers come from `Klines`:
# twenty days of 1-minute candles, saved every 5,000, killed or cut off midway, then resumed.

MINUTE_MS = 60_000
LONG_START = pd.Timestamp("2024-01-01", tz="UTC")
LONG_NOW = LONG_START + pd.Timedelta(days=20, seconds=30)


class Klines:
    """binance's /api/v3/klines for any listed symbol: 1m candles from LONG_START on, the newest
    one still forming; after `fail_after` requests every request fails with `failure`."""

    def __init__(self, fail_after: int | None = None, failure: BaseException | None = None) -> None:
        self.fail_after, self.failure = fail_after, failure
        self.requests: list[str] = []

    def __call__(self, url, method="GET", headers=None, body=None):
        from urllib.parse import parse_qs, urlsplit

        from test_crypto import candle

        query = {k: v[0] for k, v in parse_qs(urlsplit(url).query).items()}
        if self.fail_after is not None and len(self.requests) >= self.fail_after:
            raise self.failure
        self.requests.append(query["symbol"])
        start = max(int(query["startTime"]), int(LONG_START.timestamp() * 1000))
        first = -(-start // MINUTE_MS) * MINUTE_MS
        last_open = int(LONG_NOW.timestamp() * 1000) // MINUTE_MS * MINUTE_MS
        times = list(range(first, last_open + 1, MINUTE_MS))[: int(query["limit"])]
        return [
            [t, *(f"{v:.8f}" for v in candle(t, MINUTE_MS)), t + MINUTE_MS - 1, "0", 7, "0", "0", "0"] for t in times
        ]


@pytest.fixture
def long_case(tmp_path, monkeypatch):
    """A case of two 1m pairs; make_exchange gives a binance answered by the `klines` attribute."""
    import ccxt

    import common.data.download_ccxt as download_module

    from test_crypto import BINANCE_MARKETS

    monkeypatch.setenv("MARKETGPT_RETRY_DELAY_S", "0")
    monkeypatch.setattr(download_module, "SAVE_EVERY_CANDLES", 5_000)
    made = crypto.make_exchange

    class Case:
        throttled: list = []

        def make(self, path: Path) -> Path:
            path.mkdir(parents=True)
            (path / "universe.csv").write_text(
                "symbol,source,category,name\nBTC/USDT,ccxt,crypto,Bitcoin\nETH/USDT,ccxt,crypto,Ether\n"
            )
            return path

    case = Case()
    case.klines = Klines()

    def make_exchange(name="binance", *, markets=None):
        exchange = made(name, markets=BINANCE_MARKETS)
        exchange.fetch = case.klines
        exchange.throttle = lambda cost=None: case.throttled.append(cost)  # ccxt's rate limiter, not waiting
        return exchange

    monkeypatch.setattr(crypto, "make_exchange", make_exchange)
    case.ccxt = ccxt
    case.tmp = tmp_path
    return case


def long_config() -> Config:
    cfg = Config()
    cfg.data.start_date, cfg.data.interval = "2024-01-01", "1m"
    return cfg


def long_run(case_dir: Path, stream=None):
    return download_case(
        long_config(),
        case_dir,
        progress=False,
        sleep=lambda s: None,
        now=LONG_NOW,
        stream=stream if stream is not None else io.StringIO(),
    )


def test_a_long_history_killed_midway_resumes_to_the_same_candles(long_case):
    whole = long_case.make(long_case.tmp / "whole")
    progress = io.StringIO()
    long_run(whole, progress)
    want = {s: CandleCache(whole / "data").read("ccxt", "1m", s) for s in ("BTC/USDT", "ETH/USDT")}
    assert len(want["BTC/USDT"]) == 20 * 1440  # every closed minute of the twenty days
    pages = 2 * 29  # 28,801 rows a pair, 1,000 a page
    assert len(long_case.klines.requests) == pages and len(long_case.throttled) == pages  # all rate limited
    lines = progress.getvalue()
    assert "rate limit" in lines and "50 ms" in lines  # binance's ccxt rateLimit
    assert "BTC/USDT 1m: 5,000 candles, 5 pages, up to 2024-01-04 11:20 (17%)" in lines
    assert "candles/s, ETA" in lines and "(saved)" in lines

    # Killed while BTC/USDT is on its 13th page: 10,000 candles saved, 2,000 fetched and lost.
    killed = long_case.make(long_case.tmp / "killed")
    long_case.klines = Klines(fail_after=12, failure=KeyboardInterrupt())
    with pytest.raises(KeyboardInterrupt):
        long_run(killed)
    cache = CandleCache(killed / "data")
    assert len(cache.read("ccxt", "1m", "BTC/USDT")) == 10_000 and cache.read("ccxt", "1m", "ETH/USDT") is None

    long_case.klines = Klines()
    summary = long_run(killed)
    assert [a.symbol for a in summary.ok] == ["BTC/USDT", "ETH/USDT"]
    # from the saved candles on (one candle of overlap), not from the start: 19 pages instead of 29
    assert long_case.klines.requests.count("BTCUSDT") == 19
    for symbol, frame in want.items():
        got = cache.read("ccxt", "1m", symbol)  # no duplicate, no missing candle
        assert got.index.is_unique and got.index.equals(frame.index)
        np.testing.assert_array_equal(got.to_numpy(), frame.to_numpy())


def test_a_network_drop_midway_keeps_the_saved_part_and_a_rerun_completes(long_case, capsys):
    case_dir = long_case.make(long_case.tmp / "dropped")
    long_case.klines = Klines(fail_after=8, failure=long_case.ccxt.NetworkError("Connection reset by peer"))
    with pytest.raises(SourceUnavailable, match="binance"):
        long_run(case_dir)
    out = capsys.readouterr().out
    assert "BTC/USDT (ccxt): binance stopped answering; saved up to 2024-01-04 11:19" in out
    cache = CandleCache(case_dir / "data")
    assert len(cache.read("ccxt", "1m", "BTC/USDT")) == 5_000

    long_case.klines = Klines()
    summary = long_run(case_dir)
    assert [a.symbol for a in summary.ok] == ["BTC/USDT", "ETH/USDT"]
    btc = cache.read("ccxt", "1m", "BTC/USDT")
    assert len(btc) == 20 * 1440 and btc.index.is_unique
    assert (np.diff(btc.index.asi8) == 60 * 10**9).all()  # no hole where the network went away


def test_an_exchange_without_the_interval_is_one_line_naming_its_timeframes(case, net, capsys):
    yahoo, fake_ccxt = net
    (case / "universe.csv").write_text("symbol,source,category,name\nBTC/USDT,ccxt,crypto,Bitcoin\n")
    path = small_config(case, interval="4h", exchange="coinbase", quote_currency="USD")
    code = main(["data", "download", "--case", str(case), "--config", str(path)])
    captured = capsys.readouterr()
    assert code == 2
    error = [line for line in captured.err.splitlines() if "error:" in line]
    assert len(error) == 1
    assert "coinbase has no '4h' candles; it offers 1m, 5m, 15m, 30m, 1h, 2h, 6h, 1d" in error[0]
    assert fake_ccxt.calls == [] and len(yahoo.rsps.calls) == 0  # refused before any request


# --------------------------------------------------------------------------- data.start_date = "max"


def test_start_date_max_asks_each_source_for_its_whole_history(case, net):
    yahoo, fake_ccxt = net
    cfg = config("2024-02-01")
    cfg.data.start_date = "max"
    summary = run(cfg, case)

    assert [a.symbol for a in summary.ok] == ["AAPL", "MSFT", "BTC/USDT"]
    # Yahoo daily: yfinance's own period="max" (99 years back), answered from the first trade
    assert [int(q["period1"]) for q in yahoo.history_of("AAPL")] == [ny_midnight("1925-03-01")]
    # ccxt: from 2010 on; the exchange answers from the pair's listing
    end_ms = int(pd.Timestamp("2024-02-01", tz="UTC").timestamp() * 1000)
    assert fake_ccxt.calls[0] == ("BTC/USDT", crypto.HISTORY_START_MS, end_ms)
    from common.data.loading import load_market_data

    market = load_market_data(cfg.data, case)  # "max": no lower bound on the cached candles
    assert market.candles["BTC/USDT"].index[0] == pd.Timestamp("2010-01-01", tz="UTC")
    assert len(market.candles["AAPL"]) == len(expected_frame("aapl_1d.json", daily=True))


@pytest.mark.parametrize(
    "start, instead",
    [("2015-01-01", "instead of 2015-01-01"), ("max", 'instead of the whole history (data.start_date = "max")')],
)
def test_a_clamped_intraday_start_is_said_in_the_report(tmp_path, net, capsys, start, instead):
    case_dir = tmp_path / "case_h"
    case_dir.mkdir()
    (case_dir / "universe.csv").write_text("symbol,source,category,name\nSPY,yfinance,index,S&P 500 ETF\n")
    yahoo, _ = net
    yahoo.charts["SPY"] = load_chart("spy_1h.json")
    cfg = Config()
    cfg.data.start_date, cfg.data.interval = start, "1h"
    now = pd.Timestamp("2024-01-05 12:00", tz="UTC")
    download_case(cfg, case_dir, progress=False, sleep=lambda s: None, now=now, stream=io.StringIO())
    out = capsys.readouterr().out
    assert f"note: Yahoo keeps 1h bars for the last 730 days only: fetched from 2022-01-06 12:00 {instead}" in out
    clamped = pd.Timestamp("2022-01-06 12:00", tz="UTC")
    assert [int(q["period1"]) for q in yahoo.history_of("SPY")] == [int(clamped.timestamp())]
