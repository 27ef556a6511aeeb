"""Stock, ETF, index and futures candles from Yahoo Finance, through yfinance, checked per ticker.

`yf.download` never raises: a delisted or renamed ticker comes back as all-NaN columns, a call
that failed completely as an empty frame, and rate limits (HTTP 429) or connection errors are
only logged. So this adapter checks every ticker of every call, retries the missing ones with
exponential backoff (at least RATE_LIMIT_DELAY_S, with jitter, after a 429), and then reports
each ticker still missing, with a reason (never a silent hole): in `YahooResult.unreachable`
when its last attempt was rate limited, timed out or could not connect (the ticker is fine; a
rerun fetches it), in `YahooResult.failed` when Yahoo answered without candles (delisted,
renamed, or yfinance could not read the answer). When a whole batch got nothing because Yahoo
could not be reached, it raises `SourceUnavailable`.

yfinance runs at most YAHOO_THREADS threads per call (its default, 2 x CPUs, is 50 on a big login
node, and Yahoo rate-limits such bursts at once).

To tell "Yahoo has no data for X" from "Yahoo could not be reached", the adapter watches the
HTTP session it hands to yfinance and notes how each chart request (/v8/finance/chart/<TICKER>)
ended: a connection error, a timeout, HTTP 429 or 5xx count as unreachable; an answer without
candles (Yahoo's 404 "No data found, symbol may be delisted", the 400 "Data doesn't exist for
startDate", or an empty chart) counts as no data. yf.download keeps its own reasons to itself
(its errors only go to its log): the adapter captures yfinance's log records during each call and
puts those that name a ticker into that ticker's reason, so a chart Yahoo sent with HTTP 200 that
yfinance then failed to read is reported as that, not as "delisted" (common.data.yahoo_requests).

Prices are adjusted (auto_adjust=True: open/high/low/close scaled by Adj Close / Close, so
splits and dividends don't look like price jumps). Yahoo's intraday bars carry no Adj Close;
they are split-adjusted by Yahoo but not dividend-adjusted. Timestamps are UTC: a daily bar is
labelled with UTC midnight of its exchange-local trading date, an intraday bar with its open time.

Yahoo only serves recent intraday bars: 1m for the last 30 days (at most 8 days per request:
asked for 7 days at a time, the pieces joined), 2m-90m for 60 days, 1h for 730 days. A start
further back is clamped to the limit with a warning (and `YahooResult.clamped_start` set) rather
than refused, because nothing older is available anyway and the cache keeps what earlier
downloads fetched, so the history grows run by run. Daily and longer bars go back to the first
trade: data.start_date = "max" asks from `earliest_start` (yfinance's own period="max", 99 years).
4h is not a Yahoo interval (ccxt assets have it).

HTTP client: with `session=None` yfinance uses its default client (curl_cffi with browser
impersonation), which is what production should use. `requests_session()` is yfinance's own
fallback for machines without curl_cffi: plain `requests` with a browser's headers (a bare
requests.Session is rate-limited by Yahoo at once). Pass a `requests.Session` to route every
request through `requests`; that is how the tests serve Yahoo answers (constructed in the shape
of real ones, not recorded) with the `responses` library (curl_cffi goes through libcurl, which
neither `responses` nor pytest-socket can see). In that case, if yfinance is not imported yet,
YF_DISABLE_CURL_CFFI=1 is set first, so that yfinance's own fallback client in this process is
plain requests too and nothing can slip past the test's network guard. yfinance 1.7 quirk in
that mode: it needs https://fc.yahoo.com to answer (a connection error there turns into an
AttributeError about requests.exceptions.DNSError inside yfinance); the adapter then reports the
tickers as unreachable, which is what happened. Nothing here touches the network at import:
yfinance is imported inside `download_yahoo`.
"""

from __future__ import annotations

import logging
import random
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any, Callable, Sequence

import pandas as pd

from common.data.cache import COLUMNS, canonical_frame
from common.data.retry import RetryPolicy
from common.data.yahoo_requests import (
    ChartLog,
    LogCapture,
    Problem,
    clear_request_cache,
    import_yfinance,
    new_session,
    quiet_yfinance,
)
from common.errors import SourceUnavailable, UserError

__all__ = [
    "YAHOO",
    "YAHOO_INTERVALS",
    "YAHOO_WINDOW_DAYS",
    "LOOKBACK_LIMITS",
    "MAX_SPAN",
    "PAUSE_S",
    "REQUEST_SPANS",
    "earliest_start",
    "window_text",
    "RATE_LIMIT_DELAY_S",
    "RETRY_DELAY_S",
    "YAHOO_RETRY",
    "YAHOO_THREADS",
    "YahooPacing",
    "YahooResult",
    "download_yahoo",
]

log = logging.getLogger(__name__)

YAHOO = "Yahoo Finance"
YAHOO_INTERVALS = ("1m", "2m", "5m", "15m", "30m", "60m", "90m", "1h", "1d", "5d", "1wk", "1mo", "3mo")
# How many days back Yahoo serves each intraday interval (its own limits)...
YAHOO_WINDOW_DAYS: dict[str, int] = {
    "1m": 30,
    **{i: 60 for i in ("2m", "5m", "15m", "30m", "90m")},
    "60m": 730,
    "1h": 730,
}
# ... asked for a day short of them, for clock skew,
LOOKBACK_LIMITS: dict[str, pd.Timedelta] = {i: pd.Timedelta(days=n - 1) for i, n in YAHOO_WINDOW_DAYS.items()}
# ... and at most this much per request (Yahoo refuses more than 8 days of 1m bars in one).
REQUEST_SPANS: dict[str, pd.Timedelta] = {"1m": pd.Timedelta(days=7)}
# data.start_date = "max" for daily and longer bars: yfinance's own period="max" (99 years back),
# which Yahoo answers from the first trade.
MAX_SPAN = pd.Timedelta(seconds=3_122_064_000)
PAUSE_S = 2.0  # between yf.download calls: Yahoo rate-limits bursts
RETRY_DELAY_S = 5.0  # first retry; then 2x, 4x, ...
RATE_LIMIT_DELAY_S = 60.0  # the least wait after a 429; up to 25% jitter on top, so parallel jobs spread out
YAHOO_THREADS = 6  # threads per yf.download call
YAHOO_RETRY = RetryPolicy(max_retries=3, base_delay_s=RETRY_DELAY_S)


@dataclass(frozen=True)
class YahooPacing:
    """How a download spreads its yf.download calls so Yahoo does not rate-limit it: tickers per
    call, the pause between calls, threads per call, the HTTP timeout, and the least wait after a 429."""

    batch_size: int = 50
    pause_s: float = PAUSE_S
    threads: int = YAHOO_THREADS
    timeout_s: float = 20.0
    rate_limit_delay_s: float = RATE_LIMIT_DELAY_S


@dataclass(frozen=True)
class _Calls:
    """What every yf.download call of one download shares (yfinance, its session, the interval, the
    retry policy and the pacing), so the helpers below take one argument for it."""

    yf: Any
    session: Any
    interval: str
    retry: RetryPolicy
    pacing: YahooPacing


@dataclass
class YahooResult:
    frames: dict[str, pd.DataFrame] = field(default_factory=dict)  # symbol -> canonical, adjusted, UTC
    failed: dict[str, str] = field(default_factory=dict)  # symbol -> reason (no data from Yahoo)
    unreachable: dict[str, str] = field(default_factory=dict)  # symbol -> reason (rate limit, network)
    clamped_start: pd.Timestamp | None = None  # set when the start was moved to Yahoo's intraday limit


# --------------------------------------------------------------------------- public API


def _utc(value: str | datetime | pd.Timestamp) -> pd.Timestamp:
    ts = pd.Timestamp(value)
    return ts.tz_localize("UTC") if ts.tzinfo is None else ts.tz_convert("UTC")


def _is_daily(interval: str) -> bool:
    return interval[-1] not in ("m", "h")


def _yf_time(ts: pd.Timestamp, interval: str) -> str | int:
    # Daily: a date, which yfinance reads as midnight at the exchange (our UTC-midnight labels
    # are exchange dates). Intraday: epoch seconds, exact.
    return ts.strftime("%Y-%m-%d") if _is_daily(interval) else int(ts.timestamp())


def window_text(interval: str) -> str:
    """How far back Yahoo keeps `interval` bars, in words ("" for daily and longer bars)."""
    if interval not in YAHOO_WINDOW_DAYS:
        return ""
    per_request = f", {REQUEST_SPANS[interval].days} days per request" if interval in REQUEST_SPANS else ""
    return f"Yahoo keeps {interval} bars for the last {YAHOO_WINDOW_DAYS[interval]} days only{per_request}"


def earliest_start(interval: str, now: pd.Timestamp) -> pd.Timestamp:
    """The earliest start Yahoo serves for `interval` at `now`: what data.start_date = "max" asks for."""
    if interval in LOOKBACK_LIMITS:
        return (now - LOOKBACK_LIMITS[interval]).ceil("h")
    return (now - MAX_SPAN).floor("D")


def download_yahoo(
    symbols: Sequence[str],
    interval: str,
    start: str | datetime | pd.Timestamp,
    end: str | datetime | pd.Timestamp | None = None,
    *,
    session: Any = None,
    now: pd.Timestamp | None = None,
    retry: RetryPolicy = YAHOO_RETRY,
    pacing: YahooPacing = YahooPacing(),
    on_batch: Callable[[YahooResult], None] | None = None,
) -> YahooResult:
    """Adjusted candles for `symbols` from `start` (inclusive) to `end` (exclusive; None: now).

    Tickers go to yf.download `pacing.batch_size` at a time with `pacing.pause_s` between calls,
    on at most `pacing.threads` threads. A ticker that comes back empty or all-NaN is asked again
    after retry.base_delay_s, 2x, 4x, ... (at least `pacing.rate_limit_delay_s` plus jitter after a
    429) up to `retry.max_retries` times, then lands in `.unreachable` (rate limit, network) or
    `.failed` (no data) with the reason. If a whole batch got nothing and every ticker of it failed for
    network reasons on every attempt, raises SourceUnavailable.
    `on_batch` gets each batch's own result as soon as it is done (to save it before the next
    batch: a download killed later keeps what was fetched).
    """
    _check_request(interval, pacing.batch_size)
    result = YahooResult()
    now = _utc(now) if now is not None else pd.Timestamp.now(tz="UTC")
    start_ts, end_ts = _download_range(interval, start, end, now, result)

    unique = list(dict.fromkeys(symbols))  # yfinance would drop duplicates silently
    if not unique:
        return result
    yf = import_yfinance(session)
    session = session if session is not None else new_session()
    size = pacing.batch_size
    batches = [unique[i : i + size] for i in range(0, len(unique), size)]
    calls = _Calls(yf, session, interval, retry, replace(pacing, threads=max(1, pacing.threads)))
    for number, batch in enumerate(batches, start=1):
        if number > 1 and pacing.pause_s > 0:
            retry.sleep(pacing.pause_s)  # be polite: Yahoo rate-limits bursts
        label = f"batch {number}/{len(batches)}"
        part = _download_spans(calls, batch, start_ts, end_ts, now, label=label)
        _merge_batch(result, part)
        if on_batch is not None:
            on_batch(part)
    return result


def _check_request(interval: str, batch_size: int) -> None:
    """Fail early on an interval Yahoo does not offer or a batch size below one."""
    if interval not in YAHOO_INTERVALS:
        raise UserError(
            f"interval '{interval}' is not available from {YAHOO}; it offers "
            f"{', '.join(YAHOO_INTERVALS)} (4h candles exist for ccxt assets only)"
        )
    if batch_size < 1:
        raise ValueError("batch_size must be at least 1")


def _download_range(
    interval: str,
    start: str | datetime | pd.Timestamp,
    end: str | datetime | pd.Timestamp | None,
    now: pd.Timestamp,
    result: YahooResult,
) -> tuple[pd.Timestamp, pd.Timestamp | None]:
    """The UTC [start, end) to ask Yahoo for: a start before the interval's window is moved up to it
    (and noted in `result.clamped_start`); an empty range is a UserError."""
    start_ts = _utc(start)
    end_ts = None if end is None else _utc(end)
    if interval in LOOKBACK_LIMITS:
        earliest = earliest_start(interval, now)
        if start_ts < earliest:
            log.warning("%s: starting at %s instead of %s", window_text(interval), earliest, start_ts)
            start_ts = result.clamped_start = earliest
    if end_ts is not None and end_ts <= start_ts:
        limit = f" (Yahoo keeps {interval} bars back to {start_ts} only)" if result.clamped_start is not None else ""
        raise UserError(
            f"nothing to download from {YAHOO}: the range {start_ts} -> {end_ts} is empty{limit}; "
            "check data.start_date, data.end_date and data.interval"
        )
    return start_ts, end_ts


def _merge_batch(result: YahooResult, part: YahooResult) -> None:
    """Fold one batch's frames, failures and unreachable tickers into the whole download's result."""
    part.clamped_start = result.clamped_start
    result.frames.update(part.frames)
    result.failed.update(part.failed)
    result.unreachable.update(part.unreachable)


def _download_spans(
    calls: _Calls,
    symbols: list[str],
    start: pd.Timestamp,
    end: pd.Timestamp | None,
    now: pd.Timestamp,
    *,
    label: str,
) -> YahooResult:
    """One batch over [start, end), in requests of at most REQUEST_SPANS[interval] (1m: 7 days), oldest
    first, the pieces joined per ticker. A ticker unreachable in one span is not asked for later
    spans: what it has is contiguous, so the cache holds no hole and a rerun resumes after it."""
    span = REQUEST_SPANS.get(calls.interval)
    stop = end if end is not None else now
    if span is None or stop - start <= span:
        return _download_batch(calls, symbols, start, end, label=label)
    pieces: dict[str, list[pd.DataFrame]] = {}
    result, failed = YahooResult(), {}
    lo = start
    while lo < stop:
        hi = min(lo + span, stop)
        asked = [s for s in symbols if s not in result.unreachable]
        if not asked:
            break
        part = _download_batch(
            calls,
            asked,
            lo,
            None if hi >= stop and end is None else hi,
            label=f"{label}, {lo:%Y-%m-%d %H:%M} -> {hi:%Y-%m-%d %H:%M}",
        )
        for symbol, frame in part.frames.items():
            pieces.setdefault(symbol, []).append(frame)
        result.unreachable.update(part.unreachable)
        failed.update(part.failed)
        lo = hi
    result.frames = {s: canonical_frame(pd.concat(p)) for s, p in pieces.items()}
    result.failed = {s: why for s, why in failed.items() if s not in result.frames and s not in result.unreachable}
    return result


def _download_batch(
    calls: _Calls,
    symbols: list[str],
    start: pd.Timestamp,
    end: pd.Timestamp | None,
    *,
    label: str,
) -> YahooResult:
    what = f"{calls.interval} {start.date()} -> {end.date() if end is not None else 'now'}"
    max_retries = calls.retry.max_retries
    result = YahooResult()
    problems: dict[str, Problem] = {}
    pending = list(symbols)
    for attempt in range(max_retries + 1):
        if attempt:
            delay = calls.retry.base_delay_s * 2 ** (attempt - 1)
            if any(problems[s].rate_limited for s in pending):
                # Yahoo's 429 lasts about a minute or more; the jitter spreads parallel jobs apart.
                delay = max(delay, calls.pacing.rate_limit_delay_s) * (1 + 0.25 * random.random())
            log.warning(
                "%s %s: %d of %d tickers came back empty (%s), retry %d/%d in %.0fs",
                YAHOO,
                label,
                len(pending),
                len(symbols),
                problems[pending[0]].reason,
                attempt,
                max_retries,
                delay,
            )
            calls.retry.sleep(delay)
        frames, found = _call_once(calls, pending, start, end, what)
        result.frames.update(frames)
        problems.update(found)
        pending = [s for s in pending if s not in frames]
        if not pending:
            break

    if pending and not result.frames and all(problems[s].unreachable for s in pending):
        reasons = sorted({problems[s].reason for s in pending})
        raise SourceUnavailable(
            f"{YAHOO} unreachable: all {len(symbols)} tickers of {label} failed on {max_retries + 1} "
            f"attempts ({'; '.join(reasons[:3])}); check the network or proxy, or wait a few minutes "
            "if rate limited, then run again"
        )
    result.failed = {s: problems[s].reason for s in pending if not problems[s].unreachable}
    result.unreachable = {s: problems[s].reason for s in pending if problems[s].unreachable}
    for symbol in pending:
        log.warning("%s: %s: %s", YAHOO, symbol, problems[symbol].reason)
    return result


def _call_once(
    calls: _Calls,
    symbols: list[str],
    start: pd.Timestamp,
    end: pd.Timestamp | None,
    what: str,
) -> tuple[dict[str, pd.DataFrame], dict[str, Problem]]:
    chart_log, logged = ChartLog(), LogCapture()
    interval = calls.interval
    clear_request_cache(calls.yf)
    with chart_log.watching(calls.session), quiet_yfinance(logged):
        data = calls.yf.download(
            symbols,
            start=_yf_time(start, interval),
            end=None if end is None else _yf_time(end, interval),
            interval=interval,
            auto_adjust=True,
            actions=False,
            group_by="ticker",
            threads=min(calls.pacing.threads, len(symbols)),
            progress=False,
            timeout=calls.pacing.timeout_s,
            session=calls.session,
            multi_level_index=True,
        )
    frames: dict[str, pd.DataFrame] = {}
    problems: dict[str, Problem] = {}
    for symbol in symbols:
        frame = _ticker_frame(data, symbol.upper())
        if frame is None:
            problems[symbol] = chart_log.problem(symbol.upper(), what, logged.about(symbol.upper()))
        else:
            frames[symbol] = frame
    return frames, problems


def _ticker_frame(data: pd.DataFrame | None, ticker: str) -> pd.DataFrame | None:
    """One ticker's canonical frame out of yf.download's (Ticker, Price) columns; None if empty."""
    if data is None or data.empty or not isinstance(data.columns, pd.MultiIndex):
        return None
    if ticker not in data.columns.get_level_values(0):
        return None
    frame = data[ticker].rename(columns=str.lower)
    if any(c not in frame.columns for c in COLUMNS):
        return None
    frame = frame[COLUMNS]
    # Rows are the union of all tickers' dates: this ticker's rows without any price are not its.
    frame = frame.dropna(how="all", subset=["open", "high", "low", "close"])
    if frame.empty:
        return None
    index = pd.DatetimeIndex(frame.index)
    # Daily bars come back tz-naive (exchange dates), intraday ones in the exchange's zone.
    frame.index = index.tz_localize("UTC") if index.tz is None else index.tz_convert("UTC")
    return canonical_frame(frame)
