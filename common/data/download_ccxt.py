"""The ccxt half of `marketgpt data download`: each crypto asset's history from the exchange,
saved chunk by chunk into the cache as it comes (a download killed midway resumes from there),
with progress lines on long histories. common.data.download imports it only when the universe
has ccxt assets: ccxt takes about 2 s to import.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import ccxt
import pandas as pd

import common.data.crypto as crypto
import common.data.crypto_history as crypto_history
from common.data.download_report import Progress, format_day, resume_from
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

    exchange = crypto.make_exchange(run.cfg.data.exchange)
    crypto.check_timeframe(exchange, run.interval)  # before any request: one line naming its timeframes
    quote = run.cfg.data.quote_currency
    # Candles of BTC/USD and BTC/USDT differ a little: a cache filled with another quote is replaced.
    origin = exchange.id if not quote else f"{exchange.id} {quote}"
    retry: dict[str, Any] = dict(sleep=run.sleep)
    if run.delay is not None:
        retry["base_delay_s"] = run.delay
    crypto.ensure_markets(exchange, **retry)  # once, up front: a refusal by location stops here
    run.progress.note(
        f"{origin}: {run.interval} candles, {crypto.page_limit(exchange)} a request, "
        f"at most one request per {exchange.rateLimit:g} ms (the exchange's rate limit, "
        "through ccxt)"
    )
    now_ms = None if run.now is None else int(run.now.timestamp() * 1000)
    until_ms = None if run.end is None else int(run.end.timestamp() * 1000)
    for asset in assets:
        frame, replace = run.cached("ccxt", asset.symbol, origin)
        start = resume_from(frame) if frame is not None else run.start
        if frame is not None and run.end is not None and start >= run.end:
            run.up_to_date(asset.symbol, frame)
            continue
        since_ms = crypto.HISTORY_START_MS if start is None else int(start.timestamp() * 1000)
        market = crypto.with_quote(asset.symbol, quote)
        lines = _HistoryLines(run.progress, f"ccxt {origin}")
        chunks = crypto_history.iter_ohlcv_history(
            exchange,
            market,
            run.interval,
            since_ms,
            until_ms,
            now_ms=now_ms,
            chunk_candles=SAVE_EVERY_CANDLES,
            on_page=lines.page,
            **retry,
        )
        saved = False
        try:
            for chunk in chunks:  # saved as it comes: a download killed midway resumes from there
                if chunk.empty:
                    continue
                run.save("ccxt", asset.symbol, chunk, adjusted=False, origin=origin, replace=replace and not saved)
                saved = True
                lines.saved()
        except crypto.BadSymbolError as e:
            run.mark(asset.symbol, "failed", str(e))
            run.progress.advance(1, f"ccxt {asset.symbol}: failed")
            continue
        except (SourceUnavailable, ccxt.NetworkError) as e:
            if saved:  # part of its history is in the cache: not "ok" yet
                last = run.summary.assets[asset.symbol].last
                run.mark(
                    asset.symbol,
                    "unreachable",
                    f"{origin} stopped answering; saved up to {format_day(last)}, a rerun goes on from there",
                )
            if isinstance(e, SourceUnavailable):
                raise
            # should arrive as SourceUnavailable; never as a traceback
            raise SourceUnavailable(f"{origin}: {type(e).__name__}: {e}") from e
        for lo, hi in lines.empty_spans:
            run.summary.notes.append(
                f"{asset.symbol}: {origin} had no {run.interval} candles from "
                f"{_day_ms(lo)} to {_day_ms(hi)} (a page answered empty); went on after it"
            )
        if not saved:
            since = format_day(start) if start is not None else "the listing"
            run.mark(asset.symbol, "empty", f"{origin} returned no {run.interval} candles from {since}")
            if frame is not None:
                run.summary.assets[asset.symbol].first = frame.index[0]
                run.summary.assets[asset.symbol].last = frame.index[-1]
            run.progress.advance(1, f"ccxt {asset.symbol}: no candles")
            continue
        inactive = crypto.inactive_reason(exchange, market) if exchange.markets else None
        if inactive:
            run.mark(asset.symbol, "inactive", inactive)
        run.progress.advance(
            1,
            f"ccxt {asset.symbol}: +{run.summary.assets[asset.symbol].rows_added} rows"
            + (" (inactive)" if inactive else ""),
        )


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
