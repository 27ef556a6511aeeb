"""Offline tests of the ccxt adapter against ccxt's real request building and response parsing.

Each test builds a real ccxt exchange, gives it a two-market list with `set_markets` (no network),
and replaces `exchange.fetch` with a fake server: it parses the URL ccxt built, checks the path
and query, and answers with exchange-shaped JSON generated for the requested range. Two tests go
one level lower with `responses`, so ccxt's own HTTP-status-to-exception mapping runs too.
Sockets are blocked by pytest-socket (setup.cfg).
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import ccxt
import numpy as np
import pandas as pd
import pytest
import responses

from common.data.crypto import (
    CCXT_RETRY,
    PAGE_LIMITS,
    BadSymbolError,
    RestrictedLocation,
    check_timeframe,
    ensure_markets,
    inactive_reason,
    make_exchange,
    with_quote,
)
from common.data.crypto_history import fetch_ohlcv_history, iter_ohlcv_history
from common.data.retry import RetryPolicy
from common.errors import SourceUnavailable, UserError

BINANCE = Path(__file__).parent / "fixtures" / "binance"  # constructed in the shape of real answers
HOUR = 3_600_000
DAY = 24 * HOUR
T0 = 1_609_459_200_000  # 2021-01-01T00:00:00Z

BINANCE_MARKETS = [
    {
        "id": "BTCUSDT",
        "symbol": "BTC/USDT",
        "base": "BTC",
        "quote": "USDT",
        "baseId": "BTC",
        "quoteId": "USDT",
        "type": "spot",
        "spot": True,
        "active": True,
    },
    {
        "id": "ETHUSDT",
        "symbol": "ETH/USDT",
        "base": "ETH",
        "quote": "USDT",
        "baseId": "ETH",
        "quoteId": "USDT",
        "type": "spot",
        "spot": True,
        "active": True,
    },
]
OKX_MARKETS = [
    {
        "id": "BTC-USDT",
        "symbol": "BTC/USDT",
        "base": "BTC",
        "quote": "USDT",
        "baseId": "BTC",
        "quoteId": "USDT",
        "type": "spot",
        "spot": True,
        "active": True,
    },
    {
        "id": "ETH-USDT",
        "symbol": "ETH/USDT",
        "base": "ETH",
        "quote": "USDT",
        "baseId": "ETH",
        "quoteId": "USDT",
        "type": "spot",
        "spot": True,
        "active": True,
    },
]


# --------------------------------------------------------------------------- fake market data


def candle(t: int, step: int) -> tuple[float, float, float, float, float]:
    """A distinct, exactly representable candle for each open time (multiples of 0.25)."""
    k = t // step
    o = 100.0 + k % 50 + 0.25
    c = o + (k % 7 - 3) * 0.5
    return o, max(o, c) + 1.0, min(o, c) - 1.0, c, 10.0 + k % 13


def expected_frame(first: int, stop: int, step: int) -> pd.DataFrame:
    """The candles opening in [first, stop), built independently of the adapter."""
    times = list(range(first, stop, step))
    index = pd.DatetimeIndex([pd.Timestamp(t, unit="ms", tz="UTC") for t in times], name="timestamp")
    return pd.DataFrame(
        [candle(t, step) for t in times],
        index=index,
        columns=["open", "high", "low", "close", "volume"],
        dtype="float64",
    )


def assert_canonical(frame: pd.DataFrame) -> None:
    assert list(frame.columns) == ["open", "high", "low", "close", "volume"]
    assert all(dtype == np.float64 for dtype in frame.dtypes)
    assert isinstance(frame.index, pd.DatetimeIndex) and frame.index.name == "timestamp"
    assert str(frame.index.tz) == "UTC"
    assert frame.index.is_monotonic_increasing and frame.index.is_unique


def assert_same_candles(got: pd.DataFrame, want: pd.DataFrame) -> None:
    assert_canonical(got)
    assert list(got.index) == list(want.index)
    np.testing.assert_array_equal(got.to_numpy(), want.to_numpy())


class FakeBinance:
    """GET /api/v3/klines for one symbol: candles from `listed` on, the newest one still open.

    `errors` are raised one per request before any data is served (ccxt errors, as ccxt's own
    fetch would raise them after mapping an HTTP status).
    """

    def __init__(
        self,
        step: int,
        interval: str,
        now: int,
        listed: int = 0,
        market_id: str = "BTCUSDT",
        errors=(),
        ignore_since: bool = False,
    ):
        self.step, self.interval, self.now, self.listed = step, interval, now, listed
        self.market_id, self.errors, self.ignore_since = market_id, list(errors), ignore_since
        self.requests: list[dict[str, str]] = []
        self.served: list[int] = []  # open times sent back, to prove what the adapter dropped

    def __call__(self, url, method="GET", headers=None, body=None):
        parts = urlsplit(url)
        assert method == "GET"
        assert (parts.scheme, parts.netloc, parts.path) == ("https", "api.binance.com", "/api/v3/klines")
        query = {k: v[0] for k, v in parse_qs(parts.query).items()}
        assert set(query) == {"symbol", "interval", "startTime", "limit"}, query
        assert query["symbol"] == self.market_id and query["interval"] == self.interval
        self.requests.append(query)
        if self.errors:
            raise self.errors.pop(0)
        limit = int(query["limit"])
        last_open = self.now - self.now % self.step  # the candle forming right now
        if self.ignore_since:  # a broken server: always the same first page
            first = -(-self.listed // self.step) * self.step
        else:
            start = max(int(query["startTime"]), self.listed)
            first = -(-start // self.step) * self.step  # next open time on the grid
        times = list(range(first, last_open + 1, self.step))[:limit]
        self.served += times
        return [
            [t, *(f"{v:.8f}" for v in candle(t, self.step)), t + self.step - 1, "0", 7, "0", "0", "0"] for t in times
        ]


class FakeOkx:
    """GET /api/v5/market/history-candles: rows with before < ts < after, newest first."""

    def __init__(self, step: int, bar: str, now: int):
        self.step, self.bar, self.now = step, bar, now
        self.requests: list[dict[str, str]] = []

    def __call__(self, url, method="GET", headers=None, body=None):
        parts = urlsplit(url)
        assert (parts.netloc, parts.path) == ("www.okx.com", "/api/v5/market/history-candles")
        query = {k: v[0] for k, v in parse_qs(parts.query).items()}
        assert query["instId"] == "BTC-USDT" and query["bar"] == self.bar
        self.requests.append(query)
        before, after, limit = int(query["before"]), int(query["after"]), int(query["limit"])
        last_open = self.now - self.now % self.step
        times = [
            t for t in range(before - before % self.step, min(after, last_open + 1), self.step) if before < t < after
        ][:limit]
        rows = [[str(t), *(f"{v:.8f}" for v in candle(t, self.step)), "0", "0", "1"] for t in times]
        return {"code": "0", "msg": "", "data": rows[::-1]}


def binance(fake=None) -> ccxt.Exchange:
    exchange = make_exchange("binance", markets=BINANCE_MARKETS)
    if fake is not None:
        exchange.fetch = fake
    return exchange


class Sleeps(list):
    """An injected `sleep` that records the delays instead of waiting."""

    def __call__(self, seconds: float) -> None:
        self.append(seconds)


def retrying(sleep: Sleeps, **changes) -> RetryPolicy:
    """ccxt's default retry policy waiting on `sleep` (a recorder), with any of its fields changed."""
    return dataclasses.replace(CCXT_RETRY, sleep=sleep, **changes)


# --------------------------------------------------------------------------- paging


def test_multi_page_history_is_exact_with_a_partial_last_page():
    now = T0 + 2500 * HOUR + 17 * 60_000  # 17 minutes into candle #2500
    fake = FakeBinance(HOUR, "1h", now)
    got = fetch_ohlcv_history(binance(fake), "BTC/USDT", "1h", T0, now_ms=now, retry=retrying(Sleeps()))

    assert_same_candles(got, expected_frame(T0, T0 + 2500 * HOUR, HOUR))
    # 1000 + 1000 + a partial 501 (500 closed + the open one); each page starts after the last.
    assert [int(q["limit"]) for q in fake.requests] == [1000, 1000, 1000]
    assert [int(q["startTime"]) for q in fake.requests] == [T0, T0 + 1000 * HOUR, T0 + 2000 * HOUR]
    assert len(fake.served) == 2501


def test_still_open_candle_is_dropped():
    now = T0 + 10 * DAY + 5 * HOUR
    fake = FakeBinance(DAY, "1d", now)
    got = fetch_ohlcv_history(binance(fake), "BTC/USDT", "1d", T0, now_ms=now)

    assert max(fake.served) == T0 + 10 * DAY  # the server did send today's candle ...
    assert got.index[-1] == pd.Timestamp(T0 + 9 * DAY, unit="ms", tz="UTC")  # ... the adapter dropped it
    assert_same_candles(got, expected_frame(T0, T0 + 10 * DAY, DAY))


def test_candle_closing_exactly_now_is_kept():
    now = T0 + 10 * DAY  # yesterday's candle closed this very millisecond
    got = fetch_ohlcv_history(binance(FakeBinance(DAY, "1d", now)), "BTC/USDT", "1d", T0, now_ms=now)
    assert_same_candles(got, expected_frame(T0, T0 + 10 * DAY, DAY))


def test_until_ms_ends_the_range_mid_page():
    now = T0 + 3000 * HOUR
    fake = FakeBinance(HOUR, "1h", now)
    got = fetch_ohlcv_history(binance(fake), "BTC/USDT", "1h", T0, T0 + 1234 * HOUR, now_ms=now)
    assert_same_candles(got, expected_frame(T0, T0 + 1234 * HOUR, HOUR))
    assert len(fake.requests) == 2  # no request for candles past until_ms


def test_explicit_limit_overrides_the_exchange_page_size():
    now = T0 + 95 * HOUR
    fake = FakeBinance(HOUR, "1h", now, market_id="ETHUSDT")
    got = fetch_ohlcv_history(binance(fake), "ETH/USDT", "1h", T0, now_ms=now, limit=40)
    assert_same_candles(got, expected_frame(T0, T0 + 95 * HOUR, HOUR))
    assert [int(q["limit"]) for q in fake.requests] == [40, 40, 40]


def test_history_starts_at_listing_and_empty_range_is_canonical():
    listed = T0 + 30 * DAY
    now = T0 + 40 * DAY + HOUR
    got = fetch_ohlcv_history(binance(FakeBinance(DAY, "1d", now, listed=listed)), "BTC/USDT", "1d", T0, now_ms=now)
    assert_same_candles(got, expected_frame(listed, T0 + 40 * DAY, DAY))

    empty = fetch_ohlcv_history(
        binance(FakeBinance(DAY, "1d", now, listed=listed)), "BTC/USDT", "1d", T0, T0 + 20 * DAY, now_ms=now
    )
    assert len(empty) == 0
    assert_canonical(empty)


def test_incremental_fetch_returns_only_newer_candles():
    now1 = T0 + 1500 * HOUR + 60_000
    first = fetch_ohlcv_history(binance(FakeBinance(HOUR, "1h", now1)), "BTC/USDT", "1h", T0, now_ms=now1)

    now2 = now1 + 80 * HOUR
    fake = FakeBinance(HOUR, "1h", now2)
    since = int(first.index[-1].value // 1_000_000) + HOUR  # last cached open time + one timeframe
    newer = fetch_ohlcv_history(binance(fake), "BTC/USDT", "1h", since, now_ms=now2)

    assert [int(q["startTime"]) for q in fake.requests] == [T0 + 1500 * HOUR]
    assert_same_candles(newer, expected_frame(T0 + 1500 * HOUR, T0 + 1580 * HOUR, HOUR))
    assert_same_candles(pd.concat([first, newer]), expected_frame(T0, T0 + 1580 * HOUR, HOUR))


def test_page_limit_is_per_exchange_okx_pages_by_300():
    now = T0 + 700 * HOUR + 1
    fake = FakeOkx(HOUR, "1H", now)
    okx = make_exchange("okx", markets=OKX_MARKETS)
    okx.fetch = fake
    got = fetch_ohlcv_history(okx, "BTC/USDT", "1h", T0, now_ms=now)

    assert PAGE_LIMITS["okx"] == 300 and PAGE_LIMITS["binance"] == 1000
    assert_same_candles(got, expected_frame(T0, T0 + 700 * HOUR, HOUR))
    assert [int(q["limit"]) for q in fake.requests] == [300, 300, 300]
    assert [int(q["before"]) for q in fake.requests] == [T0 - 1, T0 + 300 * HOUR - 1, T0 + 600 * HOUR - 1]


# --------------------------------------------------------------------------- no endless loops


def test_server_that_repeats_a_page_stops_instead_of_looping():
    # Through ccxt: the repeated page is filtered by ccxt's since-check, so it comes back empty.
    now = T0 + 5000 * HOUR + 1
    fake = FakeBinance(HOUR, "1h", now, listed=T0, ignore_since=True)
    got = fetch_ohlcv_history(binance(fake), "BTC/USDT", "1h", T0, now_ms=now)
    assert [int(q["startTime"]) for q in fake.requests] == [T0, T0 + 1000 * HOUR]
    assert_same_candles(got, expected_frame(T0, T0 + 1000 * HOUR, HOUR))


def test_page_that_does_not_advance_stops_the_loop():
    # Below ccxt: an exchange whose fetch_ohlcv hands back the same stale rows whatever `since` is.
    exchange = binance()
    stale = [[t, *candle(t, DAY)] for t in range(T0, T0 + 3 * DAY, DAY)]
    calls = []

    def fetch_ohlcv(symbol, timeframe, since=None, limit=None, params=None):
        calls.append(since)
        if len(calls) > 10:
            raise AssertionError("fetch_ohlcv_history is looping")
        return stale

    exchange.fetch_ohlcv = fetch_ohlcv
    got = fetch_ohlcv_history(exchange, "BTC/USDT", "1d", T0 + 10 * DAY, now_ms=T0 + 100 * DAY)
    assert calls == [T0 + 10 * DAY]
    assert len(got) == 0  # the stale rows lie before since_ms


# --------------------------------------------------------------------------- failures


@pytest.mark.parametrize(
    "errors",
    [
        [ccxt.RateLimitExceeded("binance 429"), ccxt.DDoSProtection("binance 429"), ccxt.RateLimitExceeded("x")],
        [ccxt.ExchangeNotAvailable("binance 503"), ccxt.RequestTimeout("timed out"), ccxt.NetworkError("reset")],
    ],
)
def test_network_errors_are_retried_with_exponential_backoff(errors):
    now = T0 + 1200 * HOUR + 1
    fake = FakeBinance(HOUR, "1h", now, errors=errors)
    sleeps = Sleeps()
    got = fetch_ohlcv_history(binance(fake), "BTC/USDT", "1h", T0, now_ms=now, retry=retrying(sleeps, base_delay_s=0.5))
    assert sleeps == [0.5, 1.0, 2.0]
    assert_same_candles(got, expected_frame(T0, T0 + 1200 * HOUR, HOUR))
    # the failed requests asked for the same page again
    assert [int(q["startTime"]) for q in fake.requests] == [T0] * 4 + [T0 + 1000 * HOUR]


def test_persistent_timeout_raises_source_unavailable_after_max_retries():
    fake = FakeBinance(DAY, "1d", T0 + 50 * DAY, errors=[ccxt.RequestTimeout("timed out")] * 10)
    sleeps = Sleeps()
    with pytest.raises(SourceUnavailable, match="binance") as info:
        fetch_ohlcv_history(
            binance(fake),
            "BTC/USDT",
            "1d",
            T0,
            now_ms=T0 + 50 * DAY,
            retry=retrying(sleeps, max_retries=3, base_delay_s=2.0),
        )
    assert isinstance(info.value, UserError)
    assert "RequestTimeout" in str(info.value)
    assert sleeps == [2.0, 4.0, 8.0]
    assert len(fake.requests) == 4


def test_symbol_missing_from_markets_is_bad_symbol_without_a_request():
    fake = FakeBinance(DAY, "1d", T0 + 5 * DAY)
    with pytest.raises(BadSymbolError, match=r"binance.*'BTC/USDC'") as info:
        fetch_ohlcv_history(binance(fake), "BTC/USDC", "1d", T0, now_ms=T0 + 5 * DAY)
    assert isinstance(info.value, UserError)
    assert "BTC/USDT" in str(info.value)  # the close match is suggested
    assert fake.requests == []


def test_bad_symbol_from_the_exchange_is_not_retried():
    fake = FakeBinance(DAY, "1d", T0 + 5 * DAY, errors=[ccxt.BadSymbol("binance Invalid symbol.")])
    sleeps = Sleeps()
    with pytest.raises(BadSymbolError, match=r"binance.*'BTC/USDT'"):
        fetch_ohlcv_history(binance(fake), "BTC/USDT", "1d", T0, now_ms=T0 + 5 * DAY, retry=retrying(sleeps))
    assert sleeps == [] and len(fake.requests) == 1


KLINES = re.compile(r"https://api\.binance\.com/api/v3/klines\?.*")


@responses.activate
def test_binance_http_429_then_ok_through_ccxt_error_mapping():
    # No fake fetch: ccxt's own fetch, status handling and JSON parsing run on canned HTTP replies.
    now = T0 + 3 * DAY + 1
    rows = [
        [t, *(f"{v:.8f}" for v in candle(t, DAY)), t + DAY - 1, "0", 1, "0", "0", "0"]
        for t in range(T0, T0 + 4 * DAY, DAY)
    ]
    responses.add(responses.GET, KLINES, status=429, json={"code": -1003, "msg": "Too many requests"})
    responses.add(responses.GET, KLINES, status=200, json=rows)
    sleeps = Sleeps()
    got = fetch_ohlcv_history(binance(), "BTC/USDT", "1d", T0, now_ms=now, retry=retrying(sleeps))
    assert sleeps == [1.0]
    assert_same_candles(got, expected_frame(T0, T0 + 3 * DAY, DAY))
    assert len(responses.calls) == 2


@responses.activate
def test_binance_invalid_symbol_reply_becomes_bad_symbol_error():
    responses.add(responses.GET, KLINES, status=400, json={"code": -1121, "msg": "Invalid symbol."})
    with pytest.raises(BadSymbolError, match="ETH/USDT"):
        fetch_ohlcv_history(binance(), "ETH/USDT", "1d", T0, now_ms=T0 + 5 * DAY, retry=retrying(Sleeps()))
    assert len(responses.calls) == 1


def test_markets_load_lazily_with_the_same_retries():
    exchange = make_exchange("binance")
    assert not exchange.markets  # construction made no request
    attempts = []

    def load_markets(reload=False, params=None):
        attempts.append(1)
        if len(attempts) < 3:
            raise ccxt.ExchangeNotAvailable("binance 503")
        return exchange.set_markets(BINANCE_MARKETS)

    exchange.load_markets = load_markets
    now = T0 + 4 * DAY
    exchange.fetch = FakeBinance(DAY, "1d", now)
    sleeps = Sleeps()
    got = fetch_ohlcv_history(exchange, "BTC/USDT", "1d", T0, now_ms=now, retry=retrying(sleeps, base_delay_s=0.25))
    assert sleeps == [0.25, 0.5]
    assert_same_candles(got, expected_frame(T0, now, DAY))
    ensure_markets(exchange)  # loaded: no further attempt
    assert len(attempts) == 3


def test_markets_that_never_load_raise_source_unavailable():
    exchange = make_exchange("bybit")

    def load_markets(reload=False, params=None):
        raise ccxt.DDoSProtection("bybit 403")

    exchange.load_markets = load_markets
    with pytest.raises(SourceUnavailable, match="bybit.*markets"):
        ensure_markets(exchange, retrying(Sleeps(), max_retries=2))


# --------------------------------------------------------------------------- exchanges


def test_kraken_is_refused_with_a_reason():
    with pytest.raises(UserError, match="since"):
        make_exchange("kraken")
    kraken = ccxt.kraken()  # built directly, bypassing make_exchange
    kraken.fetch = lambda *a, **k: pytest.fail("kraken must be refused before any request")
    with pytest.raises(UserError, match="kraken.*history"):
        fetch_ohlcv_history(kraken, "BTC/USD", "1d", T0, now_ms=T0 + 5 * DAY)


def test_unknown_exchange_lists_valid_ones():
    with pytest.raises(UserError, match="binanse") as info:
        make_exchange("binanse")
    assert "did you mean 'binance'" in str(info.value)
    assert "okx" in str(info.value)


def test_make_exchange_is_public_and_rate_limited():
    exchange = make_exchange(" OKX ")
    assert exchange.id == "okx" and exchange.enableRateLimit
    assert not exchange.apiKey and not exchange.secret


def test_unsupported_timeframe_is_a_user_error():
    fake = FakeBinance(DAY, "1d", T0 + 5 * DAY)
    with pytest.raises(UserError, match="'7m'.*1d"):
        fetch_ohlcv_history(binance(fake), "BTC/USDT", "7m", T0, now_ms=T0 + 5 * DAY)
    assert fake.requests == []


# --------------------------------------------------------------------------- real services' refusals
# Through ccxt's own fetch, status mapping (binance.handle_errors, handle_http_status_code) and
# market parsing, on answers shaped like the services' (tests/fixtures/binance/README.md).

ANY_BINANCE = re.compile(r"https://[a-z]+\.binance\.com/.*")


def binance_answer(name: str) -> dict:
    return json.loads((BINANCE / name).read_text(encoding="utf-8"))


@responses.activate
def test_binance_451_restricted_location_is_a_user_error_without_retries():
    responses.add(responses.GET, ANY_BINANCE, status=451, json=binance_answer("restricted_451.json"))
    sleeps = Sleeps()
    with pytest.raises(RestrictedLocation) as info:
        fetch_ohlcv_history(make_exchange("binance"), "BTC/USDT", "1d", T0, now_ms=T0 + 5 * DAY, retry=retrying(sleeps))
    message = str(info.value)
    assert isinstance(info.value, UserError) and not isinstance(info.value, SourceUnavailable)
    assert "HTTP 451" in message and "restricted location" in message
    assert "data.exchange" in message and "bitstamp" in message and "data.quote_currency" in message
    assert "\n" not in message
    assert sleeps == [] and len(responses.calls) == 1  # the market list was asked for once, no retries


@responses.activate
def test_403_that_blocks_the_country_is_a_restricted_location_too():
    # bybit behind CloudFront: ccxt 4.5 maps this 403 to RateLimitExceeded, a NetworkError.
    page = (
        "<HTML><HEAD><TITLE>ERROR: The request could not be satisfied</TITLE></HEAD><BODY><H1>403 ERROR"
        "</H1>The Amazon CloudFront distribution is configured to block access from your country.</BODY></HTML>"
    )
    responses.add(responses.GET, re.compile(r"https://api\.bybit\.com/.*"), status=403, body=page)
    sleeps = Sleeps()
    with pytest.raises(RestrictedLocation, match=r"bybit.*HTTP 403"):
        ensure_markets(make_exchange("bybit"), retrying(sleeps))
    assert sleeps == [] and len(responses.calls) == 1


@responses.activate
def test_plain_403_is_still_retried():
    responses.add(responses.GET, re.compile(r"https://api\.bybit\.com/.*"), status=403, body="Forbidden")
    sleeps = Sleeps()
    with pytest.raises(SourceUnavailable, match="bybit"):
        ensure_markets(make_exchange("bybit"), retrying(sleeps, max_retries=2))
    assert sleeps == [1.0, 2.0]


@responses.activate
def test_binance_418_ip_ban_stops_at_once_naming_its_end():
    responses.add(responses.GET, KLINES, status=418, json=binance_answer("banned_418.json"))
    sleeps = Sleeps()
    with pytest.raises(SourceUnavailable, match=r"banned.*until 2025-01-01T01:00:00\+00:00"):
        fetch_ohlcv_history(binance(), "BTC/USDT", "1d", T0, now_ms=T0 + 5 * DAY, retry=retrying(sleeps))
    assert sleeps == [] and len(responses.calls) == 1


@responses.activate
def test_markets_load_spot_only_and_an_inactive_pair_is_named():
    # Only the spot list is registered: a request for the futures lists (fapi, dapi) would get a
    # ConnectionError from `responses` and end in SourceUnavailable.
    responses.add(
        responses.GET, "https://api.binance.com/api/v3/exchangeInfo", json=binance_answer("exchange_info.json")
    )
    exchange = make_exchange("binance")
    ensure_markets(exchange, retrying(Sleeps(), max_retries=0))
    assert [urlsplit(c.request.url).path for c in responses.calls] == ["/api/v3/exchangeInfo"]
    assert {"BTC/USDT", "ETH/USDT", "SOL/USDT", "LUNA/USDT"} == set(exchange.symbols)
    assert all(m["spot"] for m in exchange.markets.values())
    assert inactive_reason(exchange, "BTC/USDT") is None
    reason = inactive_reason(exchange, "LUNA/USDT")
    assert reason is not None and "BREAK" in reason and "LUNA/USDT" in reason


def test_quote_currency_maps_universe_symbols():
    assert with_quote("BTC/USDT", "USD") == "BTC/USD"
    assert with_quote("ETH/USDT", "usd") == "ETH/USD"
    assert with_quote("BTC/USDT", None) == "BTC/USDT"


BITSTAMP_MARKETS = [
    {
        "name": f"{base}/USD",
        "market_symbol": f"{base.lower()}usd",
        "base_currency": base,
        "base_decimals": 8,
        "counter_currency": "USD",
        "counter_decimals": 0,
        "minimum_order_value": "10",
        "trading": "Enabled",
        "instant_order_counter_decimals": 2,
        "instant_and_market_orders": "Enabled",
        "description": f"{base} / U.S. dollar",
        "market_type": "SPOT",
    }
    for base in ("BTC", "ETH")
]


class FakeBitstamp:
    """GET /api/v2/markets/ and /api/v2/ohlc/<pair>/?step&start&end&limit (seconds), oldest first."""

    def __init__(self, step_s: int, now_ms: int) -> None:
        self.step_s, self.now_ms = step_s, now_ms
        self.ohlc: list[dict[str, str]] = []

    def __call__(self, request):
        parts = urlsplit(request.url)
        if parts.path == "/api/v2/markets/":
            return 200, {}, json.dumps(BITSTAMP_MARKETS)
        assert parts.path == "/api/v2/ohlc/btcusd/", parts.path
        query = {k: v[0] for k, v in parse_qs(parts.query).items()}
        self.ohlc.append(query)
        assert int(query["step"]) == self.step_s
        start, end, limit = int(query["start"]), int(query["end"]), int(query["limit"])
        last_open = (self.now_ms - self.now_ms % (self.step_s * 1000)) // 1000
        times = [t for t in range(start - start % self.step_s, min(end, last_open) + 1, self.step_s) if t >= start][
            :limit
        ]
        rows = [
            dict(
                zip(
                    ("open", "high", "low", "close", "volume"),
                    (f"{v:.8f}" for v in candle(t * 1000, self.step_s * 1000)),
                ),
                timestamp=str(t),
            )
            for t in times
        ]
        return 200, {}, json.dumps({"data": {"pair": "BTC/USD", "ohlc": rows}})


@responses.activate
def test_bitstamp_builds_a_long_history_with_usd_quotes():
    now = T0 + 2300 * DAY + HOUR
    fake = FakeBitstamp(86_400, now)
    responses.add_callback(responses.GET, re.compile(r"https://www\.bitstamp\.net/api/v2/.*"), callback=fake)
    exchange = make_exchange("bitstamp")
    got = fetch_ohlcv_history(exchange, with_quote("BTC/USDT", "USD"), "1d", T0, now_ms=now, retry=retrying(Sleeps()))
    assert_same_candles(got, expected_frame(T0, T0 + 2300 * DAY, DAY))
    assert PAGE_LIMITS["bitstamp"] == 1000
    assert [int(q["limit"]) for q in fake.ohlc] == [1000, 1000, 1000]
    assert [int(q["start"]) * 1000 for q in fake.ohlc] == [T0, T0 + 1000 * DAY, T0 + 2000 * DAY]
    assert inactive_reason(exchange, "BTC/USD") is None


# --------------------------------------------------------------------------- full histories
# 1-minute candles across months, with the holes real exchanges have: minutes without trades, an
# outage longer than a page, a window before the listing. Answered through ccxt's own request
# building and parsing (exchange.fetch replaced), each request through ccxt's rate limiter.

MINUTE = 60_000


def minus_gaps(frame: pd.DataFrame, gaps) -> pd.DataFrame:
    ms = frame.index.as_unit("ms").asi8
    keep = np.ones(len(frame), dtype=bool)
    for lo, hi in gaps:
        keep &= ~((ms >= lo) & (ms < hi))
    return frame[keep]


class GappyBinance(FakeBinance):
    """FakeBinance with stretches [lo, hi) that have no candles: klines answers with the candles
    after `startTime`, however far, as binance does."""

    def __init__(self, *args, gaps=(), **kwargs):
        super().__init__(*args, **kwargs)
        self.gaps = list(gaps)

    def __call__(self, url, method="GET", headers=None, body=None):
        parts = urlsplit(url)
        query = {k: v[0] for k, v in parse_qs(parts.query).items()}
        self.requests.append(query)
        if self.errors:
            raise self.errors.pop(0)
        start = max(int(query["startTime"]), self.listed)
        first = -(-start // self.step) * self.step
        last_open = self.now - self.now % self.step
        times = (t for t in range(first, last_open + 1, self.step) if not any(lo <= t < hi for lo, hi in self.gaps))
        times = [t for _, t in zip(range(int(query["limit"])), times)]
        self.served += times
        return [
            [t, *(f"{v:.8f}" for v in candle(t, self.step)), t + self.step - 1, "0", 7, "0", "0", "0"] for t in times
        ]


class GappyOkx:
    """okx's history-candles and candles, which answer by time window (before < ts < after), for
    1m and daily bars of a pair listed at `listed` with stretches [lo, hi) without candles: a window
    inside a stretch comes back empty (a missing page)."""

    def __init__(self, now: int, listed: int, gaps=()):
        self.now, self.listed, self.gaps = now, listed, list(gaps)
        self.requests: list[dict[str, str]] = []

    def has(self, t: int) -> bool:
        return t >= self.listed and not any(lo <= t < hi for lo, hi in self.gaps)

    def __call__(self, url, method="GET", headers=None, body=None):
        parts = urlsplit(url)
        assert parts.path in ("/api/v5/market/history-candles", "/api/v5/market/candles"), parts.path
        query = {k: v[0] for k, v in parse_qs(parts.query).items()}
        assert query["instId"] == "BTC-USDT" and query["bar"] in ("1m", "1D", "1Dutc"), query
        self.requests.append(query)
        step = MINUTE if query["bar"] == "1m" else DAY
        before, after, limit = int(query["before"]), int(query["after"]), int(query["limit"])
        last_open = self.now - self.now % step
        times = []
        for t in range(before - before % step, min(after, last_open + 1), step):
            # a day has a candle if any of its minutes has one
            present = self.has(t) if step == MINUTE else any(self.has(m) for m in range(t, t + DAY, MINUTE))
            if before < t < after and present:
                times.append(t)
        rows = [[str(t), *(f"{v:.8f}" for v in candle(t, step)), "0", "0", "1"] for t in times[:limit]]
        return {"code": "0", "msg": "", "data": rows[::-1]}


def rate_limited(exchange: ccxt.Exchange) -> list:
    """Record each call of ccxt's rate limiter (instead of waiting), to show every request took it."""
    calls: list = []
    exchange.throttle = lambda cost=None: calls.append(cost)
    return calls


def test_one_minute_history_across_months_with_gaps_in_chunks():
    start = T0 + 20 * DAY  # 2021-01-21: the range crosses two month ends
    now = start + 40 * DAY + 30_000  # 30 s into the last minute
    gaps = [
        (start + 3 * DAY + 17 * MINUTE, start + 3 * DAY + 29 * MINUTE),  # quiet minutes
        (start + 11 * DAY, start + 13 * DAY + 7 * MINUTE),  # a two-day outage: several pages
    ]
    fake = GappyBinance(MINUTE, "1m", now, gaps=gaps)
    exchange = binance(fake)
    throttled = rate_limited(exchange)
    seen = []
    chunks = list(
        iter_ohlcv_history(
            exchange,
            "BTC/USDT",
            "1m",
            start,
            now_ms=now,
            chunk_candles=10_000,
            on_page=lambda p: seen.append((p.pages, p.candles, p.fraction)),
        )
    )

    want = minus_gaps(expected_frame(start, start + 40 * DAY, MINUTE), gaps)
    assert_same_candles(pd.concat(chunks), want)
    assert all(10_000 <= len(c) < 11_000 for c in chunks[:-1])  # handed over about every 10,000
    assert all(a.index[-1] < b.index[0] for a, b in zip(chunks, chunks[1:]))  # no overlap
    assert len(fake.requests) == math.ceil(len(fake.served) / 1000) == len(throttled)  # all rate limited
    pages, candles, fraction = seen[-1]
    assert pages == len(fake.requests) and candles == len(want) and fraction == 1.0
    assert [p for p, _, _ in seen] == sorted(p for p, _, _ in seen)


def test_windowed_exchange_goes_on_after_empty_pages_and_starts_at_the_listing():
    listed = T0 + 40 * DAY + 9 * HOUR
    now = listed + 5 * DAY + 30_000
    gaps = [
        (listed + DAY + 3 * HOUR, listed + DAY + 13 * HOUR),  # 10 h: two 300-minute pages empty
        (T0 + 42 * DAY + 20 * HOUR, T0 + 44 * DAY + 2 * HOUR),  # 30 h, a whole UTC day in it
    ]
    fake = GappyOkx(now, listed, gaps)
    okx = make_exchange("okx", markets=OKX_MARKETS)
    okx.fetch = fake
    rate_limited(okx)
    progress = []
    got = list(iter_ohlcv_history(okx, "BTC/USDT", "1m", T0, now_ms=now, chunk_candles=None, on_page=progress.append))[
        0
    ]

    assert_same_candles(got, minus_gaps(expected_frame(listed, listed + 5 * DAY, MINUTE), gaps))
    minute_pages = [q for q in fake.requests if q["bar"] == "1m"]
    assert len(minute_pages) <= 5 * 24 * 60 / 300 + 8  # the stretches cost a few requests, not a walk
    assert len(fake.requests) - len(minute_pages) <= 8  # daily probes, one per empty page
    spans = progress[-1].empty_spans
    assert spans[0] == (T0, T0 + 40 * DAY)  # nothing before the listing: on from the listing day
    assert any(hi == T0 + 44 * DAY and hi - lo > 20 * HOUR for lo, hi in spans)  # the empty day: one skip


def test_binance_empty_page_ends_the_history_without_probing():
    now = T0 + 30 * DAY
    fake = GappyBinance(HOUR, "1h", now, gaps=[(T0 + 10 * DAY, now + DAY)])  # delisted on day 10
    got = fetch_ohlcv_history(binance(fake), "BTC/USDT", "1h", T0, now_ms=now)
    assert_same_candles(got, expected_frame(T0, T0 + 10 * DAY, HOUR))
    assert [int(q["startTime"]) for q in fake.requests] == [T0, T0 + 240 * HOUR]


def test_progress_line_names_candles_pages_rate_and_eta():
    from common.data.crypto_history import HistoryProgress

    p = HistoryProgress("BTC/USDT", "1m", T0, T0 + 100 * DAY, pages=1440, candles=1_440_000, reached_ms=T0 + 25 * DAY)
    line = p.line(72.0)
    assert line == (
        "BTC/USDT 1m: 1,440,000 candles, 1,440 pages, up to 2021-01-26 00:00 (25%), 20,000 candles/s, ETA 3m36s"
    )


def test_a_missing_timeframe_is_one_line_naming_the_ones_it_has():
    coinbase = make_exchange("coinbase")
    with pytest.raises(UserError) as info:
        check_timeframe(coinbase, "4h")
    message = str(info.value)
    assert "\n" not in message and "coinbase has no '4h' candles" in message
    assert "1m, 5m, 15m, 30m, 1h, 2h, 6h, 1d" in message and "data.interval" in message
