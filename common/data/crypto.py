"""A ccxt exchange for public crypto candles (binance by default): built, its markets loaded, its
calls retried, its errors told apart. Paging a long history out of it: common.data.crypto_history.

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
from typing import Callable, Iterable, Mapping, TypeVar

import ccxt
import pandas as pd

from common.data.retry import RetryPolicy
from common.errors import SourceUnavailable, UserError

__all__ = [
    "ALTERNATIVES",
    "BadSymbolError",
    "CCXT_RETRY",
    "DEFAULT_PAGE_LIMIT",
    "HISTORY_START_MS",
    "NEXT_CANDLES_EXCHANGES",
    "NO_HISTORY_EXCHANGES",
    "PAGE_LIMITS",
    "bad_symbol",
    "check_timeframe",
    "ensure_markets",
    "inactive_reason",
    "make_exchange",
    "page_limit",
    "RestrictedLocation",
    "with_quote",
    "with_retries",
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
_MAX_DELAY_S = 60.0
# Every ccxt call's default: 5 retries after 1, 2, 4, 8, 16 s (ccxt's rate limiter paces the rest).
CCXT_RETRY = RetryPolicy(max_retries=5, base_delay_s=1.0)

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


def with_retries(
    call: Callable[[], T],
    what: str,
    exchange: ccxt.Exchange,
    retry: RetryPolicy = CCXT_RETRY,
) -> T:
    """Run `call`, retrying the NetworkError family with delays base, 2*base, 4*base, ..."""
    max_retries = retry.max_retries
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
            delay = min(retry.base_delay_s * 2**attempt, _MAX_DELAY_S)
            log.warning(
                "%s: %s failed (%s), retry %d/%d in %.1fs",
                exchange.id,
                what,
                type(e).__name__,
                attempt + 1,
                max_retries,
                delay,
            )
            retry.sleep(delay)
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


def ensure_markets(exchange: ccxt.Exchange, retry: RetryPolicy = CCXT_RETRY) -> None:
    """Load the exchange's markets once (network), unless they were set already."""
    if exchange.markets:
        return
    with_retries(exchange.load_markets, "loading markets", exchange, retry)


def bad_symbol(exchange: ccxt.Exchange, symbol: str) -> BadSymbolError:
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
