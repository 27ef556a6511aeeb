"""Public crypto candles from a ccxt exchange (binance by default), paged into one canonical frame.

ccxt returns at most one page of `[ms, open, high, low, close, volume]` rows per call, so a history
is built by asking from `since`, continuing from the last timestamp plus one timeframe, and
deduplicating. The newest candle is still forming until its timeframe ends; it is dropped so the
cache only ever holds final candles. `iter_ohlcv_history` hands a long history over in chunks
(to be saved as they come); a page answered empty while time is left (before the listing, an
outage, on exchanges that answer by time window) is stepped over with a probe of daily candles
(`_after_empty_page`), and the stretch is reported in `HistoryProgress.empty_spans`.

Failures: the ccxt `NetworkError` family (RateLimitExceeded, DDoSProtection = binance's 429 and
418, RequestTimeout, ExchangeNotAvailable) is transient and retried with exponential backoff, then
raised as `SourceUnavailable`. Two answers in that family are not transient and are not retried:
a refusal by location (HTTP 451, which ccxt 4.5 raises as ExchangeNotAvailable; or a 403 whose
body says the country or location is blocked, which ccxt raises as ExchangeNotAvailable,
RateLimitExceeded or PermissionDenied depending on the exchange) is `RestrictedLocation`, a user
error naming data.exchange and the alternatives; binance's 418 "IP banned until <ms>" is
`SourceUnavailable` at once, naming the time. A symbol the exchange does not list is permanent:
`BadSymbolError`. A listed but inactive market (binance status BREAK: halted or being delisted)
is reported by `inactive_reason`.

Markets: only spot markets are loaded (the `fetchMarkets` types option): futures lists cost
several MB and their hosts are blocked in more places than the spot API. Exchanges quote in
different coins (binance BTC/USDT, bitstamp BTC/USD): `with_quote` maps a universe symbol to the
configured data.quote_currency, so one universe serves several exchanges.

Kraken is refused: its OHLC endpoint ignores `since` and only returns the latest 720 candles, so
paging would silently produce a short history with a hole at the start.

Nothing here touches the network at import or when an exchange is built; markets are loaded on
first use (with the same retries) unless the caller passes them.
"""

from __future__ import annotations

import difflib
import logging
import re
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator, Mapping, TypeVar

import ccxt
import numpy as np
import pandas as pd

from common.errors import SourceUnavailable, UserError

__all__ = [
    "ALTERNATIVES",
    "BadSymbolError",
    "CHUNK_CANDLES",
    "DEFAULT_PAGE_LIMIT",
    "HISTORY_START_MS",
    "HistoryProgress",
    "NEXT_CANDLES_EXCHANGES",
    "NO_HISTORY_EXCHANGES",
    "PAGE_LIMITS",
    "check_timeframe",
    "ensure_markets",
    "fetch_ohlcv_history",
    "inactive_reason",
    "iter_ohlcv_history",
    "make_exchange",
    "page_limit",
    "RestrictedLocation",
    "with_quote",
]

log = logging.getLogger(__name__)

# Max rows per fetch_ohlcv call, checked against ccxt 4.5. Asking for more is capped (or refused)
# by the exchange, so paging still works, but asking for the max means the fewest requests.
PAGE_LIMITS: dict[str, int] = {
    "binance": 1000,
    "bybit": 1000,
    "bitstamp": 1000,
    "okx": 300,
    "coinbase": 300,
    "kucoin": 1500,
}
# Candles handed over (to be saved) at a time by iter_ohlcv_history: a 1-minute history since 2017
# (4M+ candles) is saved in a few dozen steps, so a kill loses at most one chunk of pages.
CHUNK_CANDLES = 200_000
# Exchanges we have not checked: small enough that no exchange we know of rejects it.
DEFAULT_PAGE_LIMIT = 100

# Exchanges whose candle endpoint can't go back in time, with the reason shown to the user.
NO_HISTORY_EXCHANGES: dict[str, str] = {
    "kraken": "kraken ignores `since` and only returns its latest 720 candles, so it can't build a history",
}

# Exchanges whose candle endpoint answers with the next candles after `since`, however far: an
# empty page there means the history ends (binance's klines: startTime, checked in the tests).
NEXT_CANDLES_EXCHANGES = frozenset({"binance"})

# The earliest candle any exchange could have (Mt.Gox opened in July 2010): where a history of
# data.start_date = "max" starts asking; the exchange answers from the pair's listing.
HISTORY_START_MS = 1_262_304_000_000  # 2010-01-01T00:00:00Z

_SUGGESTED = ("binance", "bybit", "okx", "kucoin", "bitstamp", "coinbase")
# Exchanges that serve long histories through `since` paging and answer from the US (where
# binance, bybit and okx refuse), with the quote currency their pairs use. bitstamp is tested
# end to end (tests/test_crypto.py); its USD pairs go back to 2011 for BTC.
ALTERNATIVES: dict[str, str] = {"bitstamp": "USD", "coinbase": "USD"}
_RESTRICTED_WORDS = re.compile(
    r"restricted location|block(?:ed)? access from your (?:country|region)|"
    r"not available (?:in|from) your (?:country|region|location)|"
    r"restricted (?:country|region|jurisdiction)",
    re.IGNORECASE,
)
_BANNED_UNTIL = re.compile(r"banned until (\d{12,14})")
_COLUMNS = ["open", "high", "low", "close", "volume"]
_MAX_DELAY_S = 60.0

T = TypeVar("T")


class BadSymbolError(UserError):
    """The exchange does not list this symbol (delisted, misspelt, or quoted in another coin)."""


class RestrictedLocation(UserError):
    """The exchange refuses this machine's location (HTTP 451, or a 403 that says so)."""


Markets = Iterable[dict] | Mapping[str, dict]


def make_exchange(name: str = "binance", *, markets: Markets | None = None) -> ccxt.Exchange:
    """A ccxt exchange for public market data: no API keys, ccxt's rate limiter on, no network yet.

    `markets` (ccxt market structures, as returned by `load_markets`) skips the network call that
    would otherwise load them on first use.
    """
    key = name.strip().lower()
    if key in NO_HISTORY_EXCHANGES:
        raise UserError(
            f"exchange '{name}': {NO_HISTORY_EXCHANGES[key]}; set data.exchange to one of {', '.join(_SUGGESTED)}"
        )
    if key not in ccxt.exchanges:
        close = difflib.get_close_matches(key, ccxt.exchanges, n=1, cutoff=0.6)
        hint = f"did you mean '{close[0]}'? " if close else ""
        raise UserError(
            f"unknown ccxt exchange '{name}'; {hint}common ones with long histories: {', '.join(_SUGGESTED)}"
        )
    exchange: ccxt.Exchange = getattr(ccxt, key)({"enableRateLimit": True})
    _spot_only(exchange)
    if markets is not None:
        exchange.set_markets(markets)
    return exchange


def _spot_only(exchange: ccxt.Exchange) -> None:
    # binance, bybit, okx, kucoin: fetchMarkets.types lists the market kinds to load (default
    # spot and futures); older exchanges take the list itself. Others load spot only anyway.
    option = exchange.options.get("fetchMarkets")
    if isinstance(option, dict) and "types" in option:
        exchange.options["fetchMarkets"] = {**option, "types": ["spot"]}
    elif isinstance(option, list):
        exchange.options["fetchMarkets"] = ["spot"]


def with_quote(symbol: str, quote: str | None) -> str:
    """The universe symbol BASE/QUOTE with its quote replaced by `quote` (None: unchanged)."""
    if not quote:
        return symbol
    base = symbol.split("/", 1)[0]
    return f"{base}/{quote.upper()}"


def page_limit(exchange: ccxt.Exchange) -> int:
    """Rows to ask for per call on this exchange."""
    return PAGE_LIMITS.get(exchange.id, DEFAULT_PAGE_LIMIT)


def _with_retries(
    call: Callable[[], T],
    what: str,
    exchange: ccxt.Exchange,
    *,
    max_retries: int,
    base_delay_s: float,
    sleep: Callable[[float], None],
) -> T:
    """Run `call`, retrying the NetworkError family with delays base, 2*base, 4*base, ..."""
    for attempt in range(max_retries + 1):
        try:
            return call()
        except (ccxt.NetworkError, ccxt.PermissionDenied) as e:
            _raise_if_permanent(e, exchange)
            if isinstance(e, ccxt.PermissionDenied):
                raise
            if attempt == max_retries:
                raise SourceUnavailable(
                    f"{exchange.id}: {what} still failing after {max_retries + 1} attempts "
                    f"({type(e).__name__}: {_short(e)}); check the network or try again later"
                ) from e
            delay = min(base_delay_s * 2**attempt, _MAX_DELAY_S)
            log.warning(
                "%s: %s failed (%s), retry %d/%d in %.1fs",
                exchange.id,
                what,
                type(e).__name__,
                attempt + 1,
                max_retries,
                delay,
            )
            sleep(delay)
    raise AssertionError("unreachable")


def _raise_if_permanent(e: Exception, exchange: ccxt.Exchange) -> None:
    """Refusals that no retry changes: the location, or an IP ban with an end time."""
    text = str(e)
    # ccxt's message: "<id> <method> <url> <status> <reason> <body>" (handle_http_status_code)
    if re.search(r"(?:^|\s)451(?:\s|$)", text) or (
        re.search(r"(?:^|\s)403(?:\s|$)", text) and _RESTRICTED_WORDS.search(text)
    ):
        status = "451" if re.search(r"(?:^|\s)451(?:\s|$)", text) else "403"
        raise RestrictedLocation(
            f"{exchange.id} refuses requests from this machine's location (HTTP {status}: "
            f"{_short(_body(text), 120)}); retrying will not help. Set data.exchange in the case config "
            f"to an exchange that serves this region and pages back through history: "
            f"{_alternatives()}"
        ) from None
    banned = _BANNED_UNTIL.search(text)
    if banned:
        until = pd.Timestamp(int(banned.group(1)), unit="ms", tz="UTC")
        raise SourceUnavailable(
            f"{exchange.id} has banned this IP for too many requests until "
            f"{until.isoformat(timespec='seconds')} (HTTP 418); run again after that"
        ) from None


def _body(text: str) -> str:
    start = text.find("{")
    return text[start:] if start >= 0 else text.split(" ", 4)[-1]


def _alternatives() -> str:
    return ", ".join(
        f'{name} (pairs quoted in {quote}: also set data.quote_currency = "{quote}")'
        for name, quote in ALTERNATIVES.items()
    )


def _short(e: Exception | str, n: int = 200) -> str:
    text = str(e)
    return text if len(text) <= n else text[:n] + "..."


def ensure_markets(
    exchange: ccxt.Exchange,
    *,
    max_retries: int = 5,
    base_delay_s: float = 1.0,
    sleep: Callable[[float], None] = time.sleep,
) -> None:
    """Load the exchange's markets once (network), unless they were set already."""
    if exchange.markets:
        return
    _with_retries(
        exchange.load_markets,
        "loading markets",
        exchange,
        max_retries=max_retries,
        base_delay_s=base_delay_s,
        sleep=sleep,
    )


def _bad_symbol(exchange: ccxt.Exchange, symbol: str) -> BadSymbolError:
    close = difflib.get_close_matches(symbol, exchange.symbols or [], n=3, cutoff=0.6)
    hint = f" (close matches: {', '.join(close)})" if close else ""
    return BadSymbolError(
        f"{exchange.id} does not list symbol '{symbol}'{hint}; fix the symbol in the "
        "universe file (unified form like BTC/USDT) or remove it"
    )


def inactive_reason(exchange: ccxt.Exchange, symbol: str) -> str | None:
    """Why the exchange lists `symbol` as inactive (its history ends), or None if it trades.

    Needs the markets loaded (`ensure_markets`)."""
    market = exchange.market(symbol)
    if market.get("active") is not False:
        return None
    info = market.get("info") or {}
    status = info.get("status") or info.get("trading") or info.get("state") or "inactive"
    return (
        f"{exchange.id} lists {symbol} as not trading (status {status}): halted or delisted, "
        "so its history stops; the candles up to then are kept"
    )


def check_timeframe(exchange: ccxt.Exchange, timeframe: str) -> None:
    """A UserError, in one line naming the timeframes the exchange has, unless it serves `timeframe`
    candles that page back through history. Makes no request."""
    if exchange.id in NO_HISTORY_EXCHANGES:
        raise UserError(f"{NO_HISTORY_EXCHANGES[exchange.id]}; use one of {', '.join(_SUGGESTED)}")
    if not exchange.has.get("fetchOHLCV"):
        raise UserError(f"{exchange.id} has no public candles (fetchOHLCV); use one of {', '.join(_SUGGESTED)}")
    if exchange.timeframes and timeframe not in exchange.timeframes:
        raise UserError(
            f"{exchange.id} has no '{timeframe}' candles; it offers "
            f"{', '.join(exchange.timeframes)}: set data.interval to one of them or data.exchange "
            "to another exchange"
        )


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
    max_retries: int = 5,
    base_delay_s: float = 1.0,
    sleep: Callable[[float], None] = time.sleep,
    now_ms: int | None = None,
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
        max_retries=max_retries,
        base_delay_s=base_delay_s,
        sleep=sleep,
        now_ms=now_ms,
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
    max_retries: int = 5,
    base_delay_s: float = 1.0,
    sleep: Callable[[float], None] = time.sleep,
    now_ms: int | None = None,
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
    `on_page` gets the progress after each page.
    """
    check_timeframe(exchange, timeframe)
    retry: dict[str, Any] = dict(max_retries=max_retries, base_delay_s=base_delay_s, sleep=sleep)
    ensure_markets(exchange, **retry)
    try:
        exchange.market(symbol)
    except ccxt.BadSymbol:
        raise _bad_symbol(exchange, symbol) from None

    step = exchange.parse_timeframe(timeframe) * 1000
    now = exchange.milliseconds() if now_ms is None else now_ms
    end = now if until_ms is None else min(int(until_ms), now)
    per_call = limit or page_limit(exchange)
    progress = HistoryProgress(symbol, timeframe, int(since_ms), end, reached_ms=int(since_ms))
    rows: dict[int, list] = {}  # open time -> row; dedupes overlapping pages
    since = int(since_ms)

    def fetch(since: int, frame: str = timeframe) -> list:
        def call() -> list:
            return exchange.fetch_ohlcv(symbol, frame, since=since, limit=per_call)

        try:
            return _with_retries(call, f"{symbol} {frame} candles from {_iso(since)}", exchange, **retry)
        except ccxt.BadSymbol:
            raise _bad_symbol(exchange, symbol) from None

    def frame_of(rows: Mapping[int, list]) -> pd.DataFrame:
        return _to_frame(rows, since_ms=since_ms, until_ms=until_ms, now_ms=now, step=step)

    # Ask only while the candle opening at `since` could be closed and inside the range.
    while since + step <= now and (until_ms is None or since < until_ms):
        page = fetch(since)
        progress.pages += 1
        if not page:
            resume = _after_empty_page(exchange, fetch, since, end, step, per_call)
            if resume is None:
                break
            log.info(
                "%s: %s %s: no candles from %s to %s; going on from there",
                exchange.id,
                symbol,
                timeframe,
                _iso(since),
                _iso(resume),
            )
            progress.empty_spans.append((since, resume))
            since = progress.reached_ms = resume
            if on_page is not None:
                on_page(progress)
            continue
        for row in page:
            t = int(row[0])
            progress.candles += t not in rows and t + step <= now  # closed ones, once each
            rows[t] = row
        next_since = int(max(row[0] for row in page)) + step
        if next_since <= since:  # the exchange ignored `since` (or repeated a page): stop, don't loop
            log.warning("%s: %s %s page did not advance past %s; stopping", exchange.id, symbol, timeframe, _iso(since))
            break
        since = progress.reached_ms = next_since
        if on_page is not None:
            on_page(progress)
        if chunk_candles is not None and len(rows) >= chunk_candles:
            yield frame_of(rows)
            rows = {}
    if rows or chunk_candles is None:
        yield frame_of(rows)


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
        len(keep), len(_COLUMNS)
    )
    index = pd.DatetimeIndex(pd.to_datetime(np.array(keep, dtype="int64"), unit="ms", utc=True), name="timestamp")
    return pd.DataFrame(values, index=index, columns=_COLUMNS)
