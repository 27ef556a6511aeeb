"""The ccxt half of `marketgpt data download`: each crypto asset's history from the exchange,
saved chunk by chunk into the cache as it comes (a download killed midway resumes from there),
with progress lines on long histories. common.data.download imports it only when the universe
has ccxt assets: ccxt takes about 2 s to import.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Iterator

import ccxt
import pandas as pd

import common.data.crypto as crypto
import common.data.crypto_history as crypto_history
from common.data.download_report import Progress, format_day, resume_from
from common.data.retry import RetryPolicy
from common.data.universe import Asset
from common.errors import SourceUnavailable

if TYPE_CHECKING:  # the download's state; that module imports this one when it runs
    from common.data.download import DownloadRun

__all__ = ["PROGRESS_EVERY_S", "SAVE_EVERY_CANDLES", "fetch_ccxt"]

# A long history is saved every this many candles (a kill loses at most that many), and shows a
# progress line at each save and at least every PROGRESS_EVERY_S seconds.
SAVE_EVERY_CANDLES = 200_000
PROGRESS_EVERY_S = 15.0


def fetch_ccxt(run: "DownloadRun", assets: list[Asset]) -> None:
    """Download or extend each ccxt asset's history, chunk by chunk into the cache (resumable)."""

    source = _open_source(run)
    for asset in assets:
        _fetch_asset(run, source, asset)


@dataclass(frozen=True)
class _CcxtSource:
    """The exchange one download asks, and what every asset's request shares: the cache origin
    (exchange and quote), retry settings and the time bounds in ms."""

    exchange: ccxt.Exchange
    quote: str | None
    origin: str
    retry: RetryPolicy
    now_ms: int | None
    until_ms: int | None


def _open_source(run: "DownloadRun") -> _CcxtSource:
    """Build the exchange, check the timeframe and load its markets once, up front; note its limits."""
    exchange = crypto.make_exchange(run.data.exchange)
    crypto.check_timeframe(exchange, run.interval)  # before any request: one line naming its timeframes
    quote = run.data.quote_currency
    # Candles of BTC/USD and BTC/USDT differ a little: a cache filled with another quote is replaced.
    origin = exchange.id if not quote else f"{exchange.id} {quote}"
    retry = replace(crypto.CCXT_RETRY, sleep=run.sleep)
    if run.delay is not None:
        retry = replace(retry, base_delay_s=run.delay)
    crypto.ensure_markets(exchange, retry)  # once, up front: a refusal by location stops here
    run.progress.note(
        f"{origin}: {run.interval} candles, {crypto.page_limit(exchange)} a request, "
        f"at most one request per {exchange.rateLimit:g} ms (the exchange's rate limit, "
        "through ccxt)"
    )
    now_ms = None if run.now is None else int(run.now.timestamp() * 1000)
    until_ms = None if run.end is None else int(run.end.timestamp() * 1000)
    return _CcxtSource(exchange, quote, origin, retry, now_ms, until_ms)


def _fetch_asset(run: "DownloadRun", source: _CcxtSource, asset: Asset) -> None:
    """Download or extend one asset's history into the cache and record how it went."""
    origin = source.origin
    frame, replace = run.cached("ccxt", asset.symbol, origin)
    start = resume_from(frame) if frame is not None else run.start
    if frame is not None and run.end is not None and start >= run.end:
        run.up_to_date(asset.symbol, frame)
        return
    since_ms = crypto.HISTORY_START_MS if start is None else int(start.timestamp() * 1000)
    market = crypto.with_quote(asset.symbol, source.quote)
    lines = _HistoryLines(run.progress, f"ccxt {origin}")
    chunks = crypto_history.iter_ohlcv_history(
        source.exchange,
        market,
        run.interval,
        since_ms,
        source.until_ms,
        now_ms=source.now_ms,
        chunk_candles=SAVE_EVERY_CANDLES,
        on_page=lines.page,
        retry=source.retry,
    )
    try:
        saved = _save_chunks(run, origin, asset.symbol, chunks, lines, replace)
    except crypto.BadSymbolError as e:
        run.mark(asset.symbol, "failed", str(e))
        run.progress.advance(1, f"ccxt {asset.symbol}: failed")
        return
    for lo, hi in lines.empty_spans:
        run.summary.notes.append(
            f"{asset.symbol}: {origin} had no {run.interval} candles from "
            f"{_day_ms(lo)} to {_day_ms(hi)} (a page answered empty); went on after it"
        )
    if not saved:
        _mark_empty(run, origin, asset.symbol, start, frame)
        return
    inactive = crypto.inactive_reason(source.exchange, market) if source.exchange.markets else None
    if inactive:
        run.mark(asset.symbol, "inactive", inactive)
    run.progress.advance(
        1,
        f"ccxt {asset.symbol}: +{run.summary.assets[asset.symbol].rows_added} rows"
        + (" (inactive)" if inactive else ""),
    )


def _save_chunks(
    run: "DownloadRun",
    origin: str,
    symbol: str,
    chunks: Iterator[pd.DataFrame],
    lines: "_HistoryLines",
    replace: bool,
) -> bool:
    """Save each non-empty chunk into the cache as it comes; whether any was saved. An exchange that
    stops answering midway marks a partly saved asset unreachable and raises SourceUnavailable."""
    saved = False
    try:
        for chunk in chunks:  # saved as it comes: a download killed midway resumes from there
            if chunk.empty:
                continue
            run.save("ccxt", symbol, chunk, adjusted=False, origin=origin, replace=replace and not saved)
            saved = True
            lines.saved()
    except (SourceUnavailable, ccxt.NetworkError) as e:
        if saved:  # part of its history is in the cache: not "ok" yet
            last = run.summary.assets[symbol].last
            run.mark(
                symbol,
                "unreachable",
                f"{origin} stopped answering; saved up to {format_day(last)}, a rerun goes on from there",
            )
        if isinstance(e, SourceUnavailable):
            raise
        # should arrive as SourceUnavailable; never as a traceback
        raise SourceUnavailable(f"{origin}: {type(e).__name__}: {e}") from e
    return saved


def _mark_empty(
    run: "DownloadRun", origin: str, symbol: str, start: pd.Timestamp | None, frame: pd.DataFrame | None
) -> None:
    """Record an asset the exchange had no new candles for (keeping the cached span in the summary)."""
    since = format_day(start) if start is not None else "the listing"
    run.mark(symbol, "empty", f"{origin} returned no {run.interval} candles from {since}")
    if frame is not None:
        run.summary.assets[symbol].first = frame.index[0]
        run.summary.assets[symbol].last = frame.index[-1]
    run.progress.advance(1, f"ccxt {symbol}: no candles")


def _day_ms(ms: int) -> str:
    return format_day(pd.Timestamp(ms, unit="ms", tz="UTC"))


class _HistoryLines:
    """Progress lines of one long ccxt history: at each saved chunk, and every PROGRESS_EVERY_S."""

    def __init__(self, progress: Progress, label: str) -> None:
        self.progress, self.label = progress, label
        self.started = self.shown = time.monotonic()
        self.last: Any = None  # crypto_history.HistoryProgress of the latest page
        self.empty_spans: list[tuple[int, int]] = []

    def page(self, state: Any) -> None:
        self.last, self.empty_spans = state, state.empty_spans
        if time.monotonic() - self.shown >= PROGRESS_EVERY_S:
            self._show("")

    def saved(self) -> None:
        if self.last is not None:
            self._show(" (saved)")

    def _show(self, suffix: str) -> None:
        self.shown = time.monotonic()
        self.progress.note(f"{self.label} {self.last.line(self.shown - self.started)}{suffix}")
