"""A long crypto history paged out of a ccxt exchange (common.data.crypto builds the exchange and
retries its calls): from `since`, each page continuing from the last timestamp plus one
timeframe, deduplicated; the newest candle, still forming, dropped so the cache only ever holds
final candles. `iter_ohlcv_history` hands a long history over in chunks (to be saved as they
come); a page answered empty while time is left (before the listing, an outage, on exchanges
that answer by time window) is stepped over with a probe of daily candles (`_after_empty_page`),
and the stretch is reported in `HistoryProgress.empty_spans`.
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass, field
from typing import Callable, Iterator, Mapping

import ccxt
import numpy as np
import pandas as pd

from common.data.crypto import (
    CCXT_RETRY,
    NEXT_CANDLES_EXCHANGES,
    bad_symbol,
    check_timeframe,
    ensure_markets,
    page_limit,
    with_retries,
)
from common.data.retry import RetryPolicy

__all__ = ["CHUNK_CANDLES", "HistoryProgress", "fetch_ohlcv_history", "iter_ohlcv_history"]

log = logging.getLogger(__name__)
COLUMNS = ["open", "high", "low", "close", "volume"]
# Candles handed over (to be saved) at a time by iter_ohlcv_history: a 1-minute history since 2017
# (4M+ candles) is saved in a few dozen steps, so a kill loses at most one chunk of pages.
CHUNK_CANDLES = 200_000


@dataclass
class HistoryProgress:
    """How far a history download has come, updated after each page (for progress lines)."""

    symbol: str
    timeframe: str
    since_ms: int  # where this download started
    end_ms: int  # where it will stop: until_ms or now
    pages: int = 0
    candles: int = 0  # closed candles received so far
    reached_ms: int = 0  # the open time the next request asks from
    empty_spans: list[tuple[int, int]] = field(default_factory=list)  # [from, to) answered empty, skipped

    @property
    def fraction(self) -> float:
        """Share of the time range covered so far (0..1)."""
        span = max(self.end_ms - self.since_ms, 1)
        return min(max((self.reached_ms - self.since_ms) / span, 0.0), 1.0)

    def line(self, elapsed_s: float) -> str:
        """One progress line: candles, pages, how far in time, rate and the time left at that rate."""
        rate = self.candles / elapsed_s if elapsed_s > 0 else 0.0
        f = self.fraction
        eta = _clock(elapsed_s * (1 - f) / f) if f > 0 and elapsed_s > 0 else "?"
        reached = pd.Timestamp(min(self.reached_ms, self.end_ms), unit="ms", tz="UTC").strftime("%Y-%m-%d %H:%M")
        return (
            f"{self.symbol} {self.timeframe}: {self.candles:,} candles, {self.pages:,} pages, up to {reached} "
            f"({f:.0%}), {rate:,.0f} candles/s, ETA {eta}"
        )


def _clock(seconds: float) -> str:
    s = int(round(seconds))
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


def fetch_ohlcv_history(
    exchange: ccxt.Exchange,
    symbol: str,
    timeframe: str,
    since_ms: int,
    until_ms: int | None = None,
    *,
    limit: int | None = None,
    now_ms: int | None = None,
    retry: RetryPolicy = CCXT_RETRY,
) -> pd.DataFrame:
    """Closed candles with open time in [since_ms, until_ms) (or up to now) as a canonical frame.

    The frame has a UTC DatetimeIndex named "timestamp" (candle open time), sorted, unique, and
    float64 columns open, high, low, close, volume; it is empty if there are no candles. For an
    incremental update pass `since_ms` = last cached open time + one timeframe. A long history is
    better fetched with `iter_ohlcv_history`, which hands it over in chunks to save as they come.
    """
    [frame] = iter_ohlcv_history(
        exchange,
        symbol,
        timeframe,
        since_ms,
        until_ms,
        limit=limit,
        now_ms=now_ms,
        retry=retry,
        chunk_candles=None,
    )
    return frame


def iter_ohlcv_history(
    exchange: ccxt.Exchange,
    symbol: str,
    timeframe: str,
    since_ms: int,
    until_ms: int | None = None,
    *,
    limit: int | None = None,
    now_ms: int | None = None,
    retry: RetryPolicy = CCXT_RETRY,
    chunk_candles: int | None = CHUNK_CANDLES,
    on_page: Callable[[HistoryProgress], None] | None = None,
) -> Iterator[pd.DataFrame]:
    """The closed candles of [since_ms, until_ms) (or up to now), paged at the exchange's limit and
    handed over oldest first in canonical frames of about `chunk_candles` candles (None: one frame),
    so a caller can save each before asking for more: a download killed midway keeps what it saved.

    Each request goes through ccxt's rate limiter (make_exchange turns it on). A page that comes
    back empty while time is left (an exchange answering by time window: a stretch before the
    listing, or an outage longer than a page) does not end the history: a probe of daily candles
    finds where candles resume (`_after_empty_page`); the stretch skipped is in `empty_spans`.
    Failed requests are retried as `retry` says; `on_page` gets the progress after each page.
    """
    check_timeframe(exchange, timeframe)
    _check_symbol(exchange, symbol, retry)

    step = exchange.parse_timeframe(timeframe) * 1000
    now = exchange.milliseconds() if now_ms is None else now_ms
    end = now if until_ms is None else min(int(until_ms), now)
    per_call = limit or page_limit(exchange)
    progress = HistoryProgress(symbol, timeframe, int(since_ms), end, reached_ms=int(since_ms))
    rows: dict[int, list] = {}  # open time -> row; dedupes overlapping pages
    since = int(since_ms)
    fetch = _page_fetcher(exchange, symbol, timeframe, per_call, retry)
    frame_of = functools.partial(_to_frame, since_ms=since_ms, until_ms=until_ms, now_ms=now, step=step)
    # Ask only while the candle opening at `since` could be closed and inside the range.
    while since + step <= now and (until_ms is None or since < until_ms):
        page = fetch(since)
        progress.pages += 1
        if page:
            next_since: int | None = _add_page(rows, page, progress, step, now)
        else:
            next_since = _skip_empty_page(exchange, fetch, progress, since, step, per_call)
        if next_since is None:  # an empty page with no candles after it before the end
            break
        if next_since <= since:  # the exchange ignored `since` (or repeated a page): stop, don't loop
            log.warning("%s: %s %s page did not advance past %s; stopping", exchange.id, symbol, timeframe, _iso(since))
            break
        since = progress.reached_ms = next_since
        if on_page is not None:
            on_page(progress)
        if page and chunk_candles is not None and len(rows) >= chunk_candles:
            yield frame_of(rows)
            rows = {}
    if rows or chunk_candles is None:
        yield frame_of(rows)


def _skip_empty_page(
    exchange: ccxt.Exchange,
    fetch: Callable[..., list],
    progress: HistoryProgress,
    since: int,
    step: int,
    per_call: int,
) -> int | None:
    """Where to go on after a page that came back empty at `since` (logged and kept in
    `progress.empty_spans`), or None: no candles before the end."""
    resume = _after_empty_page(exchange, fetch, since, progress.end_ms, step, per_call)
    if resume is None:
        return None
    log.info(
        "%s: %s %s: no candles from %s to %s; going on from there",
        exchange.id,
        progress.symbol,
        progress.timeframe,
        _iso(since),
        _iso(resume),
    )
    progress.empty_spans.append((since, resume))
    return resume


def _check_symbol(exchange: ccxt.Exchange, symbol: str, retry: RetryPolicy) -> None:
    """Load the exchange's markets (with retries) and fail with a helpful error if `symbol` is not one."""
    ensure_markets(exchange, retry)
    try:
        exchange.market(symbol)
    except ccxt.BadSymbol:
        raise bad_symbol(exchange, symbol) from None


def _page_fetcher(
    exchange: ccxt.Exchange, symbol: str, timeframe: str, per_call: int, retry: RetryPolicy
) -> Callable[..., list]:
    """A `fetch(since, frame=timeframe)` that asks for one page of `symbol`'s candles, with retries."""

    def fetch(since: int, frame: str = timeframe) -> list:
        def call() -> list:
            return exchange.fetch_ohlcv(symbol, frame, since=since, limit=per_call)

        try:
            return with_retries(call, f"{symbol} {frame} candles from {_iso(since)}", exchange, retry)
        except ccxt.BadSymbol:
            raise bad_symbol(exchange, symbol) from None

    return fetch


def _add_page(rows: dict[int, list], page: list, progress: HistoryProgress, step: int, now: int) -> int:
    """Merge a non-empty page into `rows` (by open time), count its new closed candles in `progress`,
    and return the open time the next page should ask from."""
    for row in page:
        t = int(row[0])
        progress.candles += t not in rows and t + step <= now  # closed ones, once each
        rows[t] = row
    return int(max(row[0] for row in page)) + step


_DAY_MS = 86_400_000


def _after_empty_page(
    exchange: ccxt.Exchange, fetch: Callable[..., list], since: int, end: int, step: int, per_call: int
) -> int | None:
    """Where candles resume after a page that came back empty at `since`, or None: none before `end`.

    Exchanges that answer by start time (binance) return the next candles whatever the gap, so an
    empty page means the history ends there. Those that answer by time window (okx, bitstamp:
    [since, since + limit candles)) return nothing for a window before the listing or inside an
    outage. Daily candles tell the two apart and how far to skip, a few requests at most: the first
    day with a candle that ends after `since` (the listing day, the day after an outage); if that
    day has begun already, only the empty window is skipped."""
    if exchange.id in NEXT_CANDLES_EXCHANGES:
        return None
    window = per_call * step
    if step >= _DAY_MS or "1d" not in (exchange.timeframes or {}):  # no finer probe: skip a window
        return since + window if since + window < end else None
    probe = since - since % _DAY_MS
    while probe < end:
        days = [int(row[0]) for row in fetch(probe, "1d") if int(row[0]) + _DAY_MS > since]
        if days:
            first = min(days)
            resume = first if first > since else since + window
            return resume if resume < end else None
        probe += per_call * _DAY_MS  # a daily window without candles (before the listing)
    return None


def _iso(ms: int) -> str:
    return pd.Timestamp(ms, unit="ms", tz="UTC").isoformat()


def _to_frame(rows: Mapping[int, list], *, since_ms: int, until_ms: int | None, now_ms: int, step: int) -> pd.DataFrame:
    """Keep closed candles in range and build the canonical frame."""
    keep = sorted(t for t in rows if t >= since_ms and (until_ms is None or t < until_ms) and t + step <= now_ms)
    # ccxt leaves a missing field as None; float() of None is NaN, which cleaning counts and repairs.
    values = np.array([[np.nan if v is None else v for v in rows[t][1:6]] for t in keep], dtype="float64").reshape(
        len(keep), len(COLUMNS)
    )
    index = pd.DatetimeIndex(pd.to_datetime(np.array(keep, dtype="int64"), unit="ms", utc=True), name="timestamp")
    return pd.DataFrame(values, index=index, columns=COLUMNS)
