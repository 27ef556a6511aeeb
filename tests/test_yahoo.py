"""Offline tests of the Yahoo adapter against the real yfinance code.

`FakeYahoo` plays Yahoo's chart API through the `responses` library: yfinance runs unchanged
with a plain requests.Session (YF_DISABLE_CURL_CFFI=1, so no libcurl client exists), builds its
real URLs, and parses chart JSON shaped like Yahoo's (tests/fixtures/yahoo, written by
make_charts.py there; constructed in the shape of real answers, not recorded), cut to the
requested period1/period2 like the real server does. Sockets
are blocked by pytest-socket (setup.cfg); the retry policy's `sleep` is injected, so no test waits.
test_download.py imports FakeYahoo from here.
"""

from __future__ import annotations

import atexit
import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit

os.environ.setdefault("YF_DISABLE_CURL_CFFI", "1")  # before anything imports yfinance

import numpy as np
import pandas as pd
import pytest
import requests
import responses
import yfinance as yf

from common.data.retry import RetryPolicy
from common.data.yahoo import YAHOO_RETRY, YAHOO_THREADS, YahooPacing, YahooResult, download_yahoo
from common.data.yahoo_requests import NO_DATA, requests_session
from common.errors import SourceUnavailable, UserError

FIXTURES = Path(__file__).parent / "fixtures" / "yahoo"
NY = "America/New_York"

# yfinance keeps a ticker -> time zone database on disk; keep it out of the user's ~/.cache.
_YF_CACHE = tempfile.mkdtemp(prefix="marketgpt-yf-cache-")
atexit.register(shutil.rmtree, _YF_CACHE, ignore_errors=True)
yf.set_tz_cache_location(_YF_CACHE)


def load_chart(name: str) -> dict:
    return json.loads((FIXTURES / name).read_text(encoding="utf-8"))


def _cut(chart: dict, lo: int, hi: int) -> dict:
    """The chart with only the bars whose open time is in [lo, hi), as Yahoo would answer."""
    result = json.loads(json.dumps(chart["chart"]["result"][0]))  # deep copy
    keep = [i for i, t in enumerate(result.get("timestamp", [])) if lo <= t < hi]
    if not keep:  # Yahoo's shape for a range without bars: no timestamps, an empty quote
        result.pop("timestamp", None)
        result.pop("events", None)
        result["indicators"] = {"quote": [{}], "adjclose": [{}]}
    else:
        result["timestamp"] = [result["timestamp"][i] for i in keep]
        quote = result["indicators"]["quote"][0]
        for key in quote:
            quote[key] = [quote[key][i] for i in keep]
        for adj in result["indicators"].get("adjclose", []):
            adj["adjclose"] = [adj["adjclose"][i] for i in keep]
        divs = result.get("events", {}).get("dividends", {})
        result.get("events", {})["dividends"] = {k: v for k, v in divs.items() if lo <= v["date"] < hi}
    return {"chart": {"result": [result], "error": None}}


class FakeYahoo:
    """Yahoo's cookie, crumb and chart endpoints on a `responses` mock.

    `charts` maps ticker -> full chart JSON; unknown tickers get Yahoo's 404 "No data found";
    `answers` maps ticker -> (HTTP status, fixture file name or chart JSON) for a fixed answer
    (to range requests only, if the ticker also has a chart for the time-zone probe).
    Set `down` to "429", "401", "timeout", "connection" or "empty" to make every chart request fail
    that way until it is set back to None (tests flip it from the injected `sleep`); `down_for`
    does the same for single tickers. yfinance's fallback look-ups (quoteSummary, v7 quote) get
    Yahoo's "not found" answers.
    """

    def __init__(self, rsps: responses.RequestsMock, charts: dict[str, dict]) -> None:
        self.charts = {k.upper(): v for k, v in charts.items()}
        self.down: str | None = None
        self.down_for: dict[str, str] = {}
        self.answers: dict[str, tuple[int, str | dict]] = {}
        self.headers: list[dict[str, str]] = []  # request headers of each chart request
        self.history: list[tuple[str, dict[str, str]]] = []  # (ticker, query) of range requests
        self.requests: list[str] = []  # every chart request's ticker, time-zone probes included
        rsps.add(responses.GET, re.compile(r"https://fc\.yahoo\.com.*"), status=404)
        rsps.add(responses.GET, re.compile(r"https://query\d\.finance\.yahoo\.com/v1/test/getcrumb"), body="fake-crumb")
        rsps.add_callback(
            responses.GET, re.compile(r"https://query\d\.finance\.yahoo\.com/v8/finance/chart/.*"), callback=self._chart
        )
        rsps.add(
            responses.GET,
            re.compile(r"https://query\d\.finance\.yahoo\.com/v10/finance/quoteSummary/.*"),
            status=404,
            json={
                "quoteSummary": {
                    "result": None,
                    "error": {"code": "Not Found", "description": "Quote not found for symbol"},
                }
            },
        )
        rsps.add(
            responses.GET,
            re.compile(r"https://query\d\.finance\.yahoo\.com/v7/finance/quote.*"),
            json={"quoteResponse": {"result": [], "error": None}},
        )

    def history_of(self, ticker: str) -> list[dict[str, str]]:
        return [q for t, q in self.history if t == ticker]

    def _chart(self, request: requests.PreparedRequest):
        url = urlsplit(request.url)
        ticker = unquote(url.path.rsplit("/", 1)[1]).upper()
        query = {k: v[0] for k, v in parse_qs(url.query).items()}
        self.requests.append(ticker)
        self.headers.append(dict(request.headers))
        if "period1" in query:
            self.history.append((ticker, query))
        down = self.down_for.get(ticker, self.down)
        if ticker in self.answers and ("period1" in query or ticker not in self.charts):
            status, body = self.answers[ticker]
            body = load_chart(body) if isinstance(body, str) else body
            return status, {"Content-Type": "application/json"}, json.dumps(body)
        if down == "429":
            return 429, {}, "Too Many Requests"
        if down == "401":
            return (
                401,
                {"Content-Type": "application/json"},
                json.dumps(
                    {"finance": {"result": None, "error": {"code": "Unauthorized", "description": "Invalid Crumb"}}}
                ),
            )
        if down == "timeout":
            return requests.exceptions.ReadTimeout("Read timed out. (read timeout=20)")
        if down == "connection":
            return requests.exceptions.ConnectionError("Failed to resolve 'query2.finance.yahoo.com'")
        chart = self.charts.get(ticker)
        if chart is None:
            return 404, {"Content-Type": "application/json"}, json.dumps(load_chart("not_found_404.json"))
        if "range" in query:  # yfinance's time-zone probe (range=1d): the last bar
            last = chart["chart"]["result"][0]["timestamp"][-1]
            body = _cut(chart, last, last + 1)
        elif down == "empty":
            body = _cut(chart, 0, 0)
        else:
            body = _cut(chart, int(query["period1"]), int(query["period2"]))
        return 200, {"Content-Type": "application/json"}, json.dumps(body)


@pytest.fixture
def yahoo():
    with responses.RequestsMock(assert_all_requests_are_fired=False) as rsps:
        yield FakeYahoo(
            rsps,
            {"AAPL": load_chart("aapl_1d.json"), "MSFT": load_chart("msft_1d.json"), "SPY": load_chart("spy_1h.json")},
        )


def expected_frame(name: str, daily: bool) -> pd.DataFrame:
    """The fixture's candles as the adapter should return them: adjusted, UTC, float64."""
    result = load_chart(name)["chart"]["result"][0]
    q = result["indicators"]["quote"][0]
    close = np.array(q["close"])
    adj = np.array(result["indicators"]["adjclose"][0]["adjclose"]) if daily else close
    ratio = adj / close
    index = pd.to_datetime(result["timestamp"], unit="s", utc=True)
    if daily:  # labelled with the exchange date at UTC midnight
        index = pd.DatetimeIndex(index.tz_convert(NY).date).tz_localize("UTC")
    return pd.DataFrame(
        {
            "open": np.array(q["open"]) * ratio,
            "high": np.array(q["high"]) * ratio,
            "low": np.array(q["low"]) * ratio,
            "close": adj,
            "volume": np.array(q["volume"], float),
        },
        index=index.rename("timestamp"),
    )


def ny_midnight(day: str) -> int:
    return int(pd.Timestamp(day, tz=NY).timestamp())


class Sleeps(list):
    """An injected sleep that records delays and can run an action on each call."""

    def __init__(self, action=None):
        super().__init__()
        self.action = action

    def __call__(self, seconds: float) -> None:
        self.append(seconds)
        if self.action:
            self.action()


def retrying(sleep: Sleeps, **changes) -> RetryPolicy:
    """Yahoo's default retry policy waiting on `sleep` (a recorder), with any of its fields changed."""
    return dataclasses.replace(YAHOO_RETRY, sleep=sleep, **changes)


def test_daily_multi_ticker_adjusted_utc_and_batched(yahoo):
    sleeps, batches = Sleeps(), []
    result = download_yahoo(
        ["AAPL", "MSFT"],
        "1d",
        "2024-01-01",
        "2024-02-01",
        session=requests.Session(),
        retry=retrying(sleeps),
        pacing=YahooPacing(batch_size=1, pause_s=1.5),
        on_batch=batches.append,
    )

    assert result.failed == {}
    assert set(result.frames) == {"AAPL", "MSFT"}
    for symbol, name in (("AAPL", "aapl_1d.json"), ("MSFT", "msft_1d.json")):
        frame = result.frames[symbol]
        assert list(frame.columns) == ["open", "high", "low", "close", "volume"] and frame.columns.name is None
        assert all(str(t) == "float64" for t in frame.dtypes)
        assert str(frame.index.tz) == "UTC" and frame.index.name == "timestamp"
        assert frame.index.is_monotonic_increasing and frame.index.is_unique
        want = expected_frame(name, daily=True)
        assert (frame.index == want.index).all()
        np.testing.assert_allclose(frame.to_numpy(), want.to_numpy(), rtol=1e-9)
        # adjusted: before the dividend the close is below Yahoo's raw close
        raw_close = load_chart(name)["chart"]["result"][0]["indicators"]["quote"][0]["close"]
        assert frame["close"].iloc[0] < raw_close[0]
        assert frame["close"].iloc[-1] == pytest.approx(raw_close[-1])
    # one yf.download call per batch of 1, a polite pause between them, each batch handed over
    assert sleeps == [1.5]
    assert [sorted(b.frames) for b in batches] == [["AAPL"], ["MSFT"]]
    # the range sent: New York midnights of the start and end dates
    query = yahoo.history_of("AAPL")[0]
    assert int(query["period1"]) == ny_midnight("2024-01-01")
    assert int(query["period2"]) == ny_midnight("2024-02-01")
    assert query["interval"] == "1d"


def test_intraday_converted_to_utc(yahoo):
    now = pd.Timestamp("2024-02-01", tz="UTC")
    result = download_yahoo(
        ["SPY"], "1h", "2024-01-02", "2024-01-05", session=requests.Session(), now=now, retry=retrying(Sleeps())
    )
    frame = result.frames["SPY"]
    stamps = load_chart("spy_1h.json")["chart"]["result"][0]["timestamp"]
    assert list(frame.index) == list(pd.to_datetime(stamps, unit="s", utc=True))
    assert str(frame.index.tz) == "UTC"
    assert frame.index[0] == pd.Timestamp("2024-01-02 14:30", tz="UTC")  # 09:30 in New York
    assert result.clamped_start is None
    assert int(yahoo.history_of("SPY")[0]["period1"]) == int(pd.Timestamp("2024-01-02", tz="UTC").timestamp())


def test_intraday_start_beyond_yahoo_limit_is_clamped(yahoo, caplog):
    now = pd.Timestamp("2024-01-04 12:00", tz="UTC")
    result = download_yahoo(["SPY"], "1h", "2015-01-01", session=requests.Session(), now=now, retry=retrying(Sleeps()))
    assert result.clamped_start == now - pd.Timedelta(days=729)
    assert int(yahoo.history_of("SPY")[0]["period1"]) == int(result.clamped_start.timestamp())
    assert "starting at" in caplog.text
    with pytest.raises(UserError, match="range"):
        download_yahoo(["SPY"], "5m", "2015-01-01", "2015-02-01", session=requests.Session(), now=now)


def test_unsupported_interval_is_a_user_error():
    with pytest.raises(UserError, match="4h"):
        download_yahoo(["AAPL"], "4h", "2024-01-01")


def test_delisted_ticker_is_retried_then_reported(yahoo):
    sleeps = Sleeps()
    result = download_yahoo(
        ["AAPL", "GONE"],
        "1d",
        "2024-01-01",
        "2024-02-01",
        session=requests.Session(),
        retry=retrying(sleeps, max_retries=3, base_delay_s=2.0),
    )
    assert set(result.frames) == {"AAPL"}
    assert list(result.failed) == ["GONE"]
    assert NO_DATA in result.failed["GONE"] and "No data found" in result.failed["GONE"]
    assert sleeps == [2.0, 4.0, 8.0]  # exponential backoff
    assert yahoo.requests.count("GONE") >= 4  # asked on every attempt
    assert len(yahoo.history_of("AAPL")) == 1  # the good ticker was not fetched again


def test_symbols_with_special_characters(yahoo):
    yahoo.charts["^GSPC"] = load_chart("msft_1d.json")
    result = download_yahoo(
        ["^GSPC", "^GONE"], "1d", "2024-01-01", "2024-02-01", session=requests.Session(), retry=retrying(Sleeps())
    )
    assert list(result.frames) == ["^GSPC"]
    assert "No data found" in result.failed["^GONE"]  # Yahoo's answer was matched to the ticker


def test_rate_limit_then_success(yahoo):
    def recover():
        yahoo.down = None

    yahoo.down = "429"
    sleeps = Sleeps(recover)
    result = download_yahoo(
        ["AAPL", "MSFT"],
        "1d",
        "2024-01-01",
        "2024-02-01",
        session=requests.Session(),
        retry=retrying(sleeps, base_delay_s=3.0),
    )
    # not the 3 s backoff: at least a minute after a 429, plus up to 25% jitter
    assert len(sleeps) == 1 and 60.0 < sleeps[0] <= 75.0
    assert result.failed == {}
    assert set(result.frames) == {"AAPL", "MSFT"}
    np.testing.assert_allclose(result.frames["AAPL"].to_numpy(), expected_frame("aapl_1d.json", True).to_numpy())


def test_empty_answer_is_asked_again_not_served_from_yfinance_memory(yahoo):
    # A past range goes through yfinance's in-memory request cache; a retry must reach Yahoo.
    def recover():
        yahoo.down = None

    yahoo.down = "empty"
    result = download_yahoo(
        ["AAPL"], "1d", "2024-01-01", "2024-02-01", session=requests.Session(), retry=retrying(Sleeps(recover))
    )
    assert result.failed == {}
    assert len(result.frames["AAPL"]) == len(expected_frame("aapl_1d.json", True))
    assert len(yahoo.history_of("AAPL")) == 2


@pytest.mark.parametrize(
    "down, words",
    [("timeout", "ReadTimeout"), ("connection", "ConnectionError"), ("429", "429"), ("401", "Invalid Crumb")],
)
def test_unreachable_on_every_retry_raises_source_unavailable(yahoo, down, words):
    yahoo.down = down
    sleeps, batches = Sleeps(), []
    with pytest.raises(SourceUnavailable) as info:
        download_yahoo(
            ["AAPL", "MSFT"],
            "1d",
            "2024-01-01",
            session=requests.Session(),
            retry=retrying(sleeps, max_retries=2, base_delay_s=1.0),
            on_batch=batches.append,
        )
    message = str(info.value)
    assert "Yahoo Finance" in message and words in message
    if down == "429":
        assert len(sleeps) == 2 and all(60.0 < s <= 75.0 for s in sleeps) and sleeps[0] != sleeps[1]
    else:
        assert sleeps == [1.0, 2.0]
    assert batches == []  # nothing handed over to be saved


def test_later_batch_unreachable_keeps_earlier_batches(yahoo):
    saved: list[YahooResult] = []

    def save(part: YahooResult) -> None:
        saved.append(part)
        yahoo.down = "connection"  # the network goes away after the first batch

    with pytest.raises(SourceUnavailable):
        download_yahoo(
            ["AAPL", "MSFT"],
            "1d",
            "2024-01-01",
            "2024-02-01",
            session=requests.Session(),
            retry=retrying(Sleeps()),
            pacing=YahooPacing(batch_size=1),
            on_batch=save,
        )
    assert [sorted(p.frames) for p in saved] == [["AAPL"]]


def test_import_touches_no_network_and_does_not_import_yfinance():
    code = "import sys, common.data.yahoo, common.data.download; assert 'yfinance' not in sys.modules"
    root = Path(__file__).resolve().parent.parent
    done = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


# --------------------------------------------------------------------------- real services' habits


def test_ticker_rate_limited_or_timed_out_is_unreachable_not_failed(yahoo):
    yahoo.down_for = {"MSFT": "timeout", "SPY": "429"}
    result = download_yahoo(
        ["AAPL", "MSFT", "SPY", "GONE"],
        "1d",
        "2024-01-01",
        "2024-02-01",
        session=requests.Session(),
        retry=retrying(Sleeps(), max_retries=1, base_delay_s=1.0),
    )
    assert list(result.frames) == ["AAPL"]
    assert set(result.unreachable) == {"MSFT", "SPY"}
    assert "ReadTimeout" in result.unreachable["MSFT"] and "429" in result.unreachable["SPY"]
    assert list(result.failed) == ["GONE"]  # only the ticker Yahoo has no data for


def test_yfinance_failing_on_a_200_answer_is_reported_as_that(yahoo):
    broken = load_chart("aapl_1d.json")
    broken["chart"]["result"][0]["indicators"]["quote"][0]["close"].pop()  # one close short
    yahoo.answers["BRKN"] = (200, broken)  # served whole: Yahoo answered, yfinance chokes on it
    result = download_yahoo(
        ["BRKN", "AAPL"],
        "1d",
        "2024-01-01",
        "2024-02-01",
        session=requests.Session(),
        retry=retrying(Sleeps(), max_retries=0),
    )
    assert list(result.frames) == ["AAPL"]
    reason = result.failed["BRKN"]
    assert NO_DATA not in reason
    assert "yfinance could not read" in reason and "All arrays must be of the same length" in reason


def test_yfinance_threads_are_capped(yahoo, monkeypatch):
    import yfinance.multi

    used: list[int] = []
    real = yfinance.multi._multitasking.set_max_threads

    def record(n):
        used.append(n)
        return real(n)

    monkeypatch.setattr(yfinance.multi._multitasking, "set_max_threads", record)
    monkeypatch.setattr(yfinance.multi._multitasking, "cpu_count", lambda: 64)  # a big login node
    tickers = ["AAPL", "MSFT"] + [f"GONE{i}" for i in range(10)]
    download_yahoo(
        tickers, "1d", "2024-01-01", "2024-02-01", session=requests.Session(), retry=retrying(Sleeps(), max_retries=0)
    )
    assert used == [YAHOO_THREADS] and 4 <= YAHOO_THREADS <= 8


def test_requests_session_carries_browser_headers(yahoo):
    session = requests_session()
    assert isinstance(session, requests.Session)
    result = download_yahoo(["AAPL"], "1d", "2024-01-01", "2024-02-01", session=session, retry=retrying(Sleeps()))
    assert set(result.frames) == {"AAPL"}
    agent = yahoo.headers[-1]["User-Agent"]
    assert agent.startswith("Mozilla/5.0") and "python-requests" not in agent
    assert yahoo.headers[-1]["Accept-Language"].startswith("en-US")


def test_null_bars_splits_capital_gains_and_a_live_last_bar(yahoo):
    yahoo.charts["VOD.L"] = load_chart("vod_l_1d.json")
    yahoo.charts["VFIAX"] = load_chart("fund_1d.json")
    result = download_yahoo(
        ["VOD.L", "VFIAX"], "1d", "2024-01-01", "2024-02-01", session=requests.Session(), retry=retrying(Sleeps())
    )
    assert result.failed == {} and result.unreachable == {}
    vod, fund = result.frames["VOD.L"], result.frames["VFIAX"]
    # The bar whose prices were all null is left out; every other session is there.
    days = [pd.Timestamp(d, tz="UTC") for d in pd.bdate_range("2024-01-02", "2024-01-31") if d.day != 15]
    assert list(vod.index) == [d for d in days if d != pd.Timestamp("2024-01-10", tz="UTC")]
    assert not vod.isna().any().any()
    # The live bar (stamped mid-session) is labelled with its date, once; events add no columns.
    assert list(fund.index) == days and list(fund.columns) == ["open", "high", "low", "close", "volume"]
    raw = load_chart("fund_1d.json")["chart"]["result"][0]
    assert fund["close"].iloc[-1] == pytest.approx(raw["indicators"]["quote"][0]["close"][-1])
    # adjusted by Yahoo's adjclose (dividend), not scaled again for the split
    np.testing.assert_allclose(fund["close"], raw["indicators"]["adjclose"][0]["adjclose"], rtol=1e-9)


def test_range_before_listing_400_is_no_data_in_range_not_delisted(yahoo):
    yahoo.charts["NEWCO"] = load_chart("aapl_1d.json")  # listed now: the time-zone probe works
    yahoo.answers["NEWCO"] = (400, "start_400.json")
    result = download_yahoo(
        ["NEWCO"], "1d", "2023-01-01", "2023-02-01", session=requests.Session(), retry=retrying(Sleeps(), max_retries=0)
    )
    reason = result.failed["NEWCO"]
    assert "Data doesn't exist for startDate" in reason and "delisted" not in reason
    assert result.unreachable == {}


# --------------------------------------------------------------------------- Yahoo's intraday windows


def minute_chart(first_day: str, last_day: str) -> dict:
    """SPY's chart in 1m bars, 09:30-16:00 New York on each weekday: Yahoo's shape (spy_1h.json's
    meta), prices fixed by the minute so that pieces fetched apart can be checked against the whole."""
    chart = load_chart("spy_1h.json")
    result = chart["chart"]["result"][0]
    stamps = []
    for day in pd.bdate_range(first_day, last_day):
        open_ = pd.Timestamp(day.date(), tz=NY) + pd.Timedelta(hours=9, minutes=30)
        stamps += [int((open_ + pd.Timedelta(minutes=m)).timestamp()) for m in range(390)]
    close = [400.0 + (t // 60) % 97 * 0.25 for t in stamps]
    result["timestamp"] = stamps
    result["indicators"] = {
        "quote": [
            {
                "open": close,
                "high": [c + 0.5 for c in close],
                "low": [c - 0.5 for c in close],
                "close": close,
                "volume": [1000 + (t // 60) % 11 for t in stamps],
            }
        ]
    }
    result["meta"].update(
        dataGranularity="1m",
        tradingPeriods=[
            [{"timezone": "EST", "start": s, "end": s + 390 * 60, "gmtoffset": -18000}] for s in stamps[::390]
        ],
    )
    return chart


def test_one_minute_bars_come_from_the_last_30_days_in_7_day_requests(yahoo, caplog):
    now = pd.Timestamp("2024-02-01 12:00", tz="UTC")
    yahoo.charts["SPY"] = minute_chart("2023-11-01", "2024-01-31")
    result = download_yahoo(["SPY"], "1m", "2023-12-01", session=requests.Session(), now=now, retry=retrying(Sleeps()))

    assert result.clamped_start == pd.Timestamp("2024-01-03 12:00", tz="UTC")  # 29 days back: Yahoo's 30, less one
    assert "Yahoo keeps 1m bars for the last 30 days only, 7 days per request" in caplog.text
    spans = [(int(q["period1"]), int(q.get("period2", 0))) for q in yahoo.history_of("SPY")]
    starts = pd.date_range("2024-01-03 12:00", periods=5, freq="7D", tz="UTC")
    assert [s for s, _ in spans] == [int(t.timestamp()) for t in starts]  # oldest first, 7 days each
    assert [e for _, e in spans[:4]] == [s for s, _ in spans[1:]]  # each ends where the next starts
    frame = result.frames["SPY"]
    stamps = minute_chart("2024-01-03", "2024-01-31")["chart"]["result"][0]["timestamp"]
    assert len(stamps) == 21 * 390  # the weekdays of January from the 3rd on
    assert list(frame.index) == list(pd.to_datetime(stamps, unit="s", utc=True))  # no hole, no duplicate
    np.testing.assert_allclose(frame["close"], [400.0 + (t // 60) % 97 * 0.25 for t in stamps])


def test_daily_max_asks_from_99_years_back_and_keeps_everything(yahoo):
    from common.data.yahoo import earliest_start

    now = pd.Timestamp("2024-02-05", tz="UTC")
    start = earliest_start("1d", now)
    assert start == pd.Timestamp("1925-03-01", tz="UTC")  # yfinance's period="max": 3,122,064,000 s
    result = download_yahoo(["AAPL"], "1d", start, session=requests.Session(), now=now, retry=retrying(Sleeps()))
    assert result.clamped_start is None
    np.testing.assert_allclose(result.frames["AAPL"].to_numpy(), expected_frame("aapl_1d.json", True).to_numpy())
    assert int(yahoo.history_of("AAPL")[0]["period1"]) == ny_midnight("1925-03-01")
