"""data.universe = "exchange": an exchange's liquid spot pairs, resolved at download time into a dated file.

`marketgpt data download` with data.universe = "exchange" asks data.exchange for its markets and
keeps the pairs that pass data.exchange_universe (common.config.ExchangeUniverseConfig), in order:

1. quote: pairs quoted in `quote` (e.g. USDT);
2. spot_only: spot markets (always: common.data.crypto loads spot markets only);
3. active_only: not halted or delisted (ccxt's market "active"; unknown counts as active);
4. exclude_bases: not these base coins (stablecoins, say, whose flat prices teach nothing);
5. a 24h pre-filter: one fetch_tickers request for all pairs; a pair whose 24h quote volume is
   below a tenth of min_quote_volume (TICKER_PREFILTER) is left out before its candles are asked
   for. Skipped where the exchange has no tickers or their request fails; a pair without a ticker
   goes on to the next step;
6. min_quote_volume: the average daily quote volume over the `volume_days` complete UTC days
   before the as-of day, from daily candles: the sum of close x volume over the window divided
   by volume_days (a day without a candle, before a listing, counts as zero). One 24h ticker is
   one day's noise (a listing pump, a quiet Sunday); the window's average is not, at the price of
   one request per pair, paced by ccxt's rate limiter, hence the cheap pre-filter first;
7. max_count: the most liquid pairs by that average.

The pairs that pass are written, most liquid first, to case_dir/universe_exchange_<exchange>_<YYYY-MM-DD>.csv
(the format of common.data.universe, with its "# As of" line and a survivorship note), atomically.
A day's second resolution replaces that day's file; another day's writes a new file, so every
universe a run trained on stays on record. Training, `plan` and `data check` read the newest file
(common.data.universe.universe_path). A resolution that leaves no pair is a UserError naming each
filter and how many pairs it removed, and writes nothing.
"""

from __future__ import annotations

import csv
import io
import math
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, TextIO

import ccxt
import numpy as np
import pandas as pd

from common.atomic import atomic_write_bytes
from common.config import DataConfig, ExchangeUniverseConfig
from common.data import crypto, crypto_history
from common.data.retry import RetryPolicy
from common.data.universe import HEADER, exchange_universe_file
from common.errors import UserError

__all__ = ["Resolution", "TICKER_PREFILTER", "resolve_exchange_universe", "resolve_to_file", "write_exchange_universe"]

# The 24h pre-filter keeps pairs whose last 24 h traded at least this share of min_quote_volume.
TICKER_PREFILTER = 0.1
_DAY = pd.Timedelta(days=1)
_PROGRESS_EVERY = 50  # pairs between progress lines while daily candles are fetched


@dataclass
class Resolution:
    """The pairs of one exchange that passed the filters on one day, and what each filter removed."""

    exchange: str  # the ccxt id
    as_of: str  # YYYY-MM-DD: the day of the resolution; volumes cover the volume_days before it
    filters: ExchangeUniverseConfig
    markets: int  # markets the exchange listed
    removed: dict[str, int]  # filter (in words) -> pairs it removed, in the order applied
    pairs: list[tuple[str, str, float]]  # (symbol, base, average daily quote volume), most liquid first

    def counts(self) -> str:
        return ", ".join(f"{what}: {n} removed" for what, n in self.removed.items())


def resolve_exchange_universe(
    exchange: ccxt.Exchange,
    filters: ExchangeUniverseConfig,
    now: pd.Timestamp,
    *,
    sleep: Callable[[float], None] = time.sleep,
    base_delay_s: float | None = None,
    stream: TextIO | None = None,
) -> Resolution:
    """Apply the filters to the exchange's markets as of `now` (network: markets, tickers, daily candles)."""
    retry = replace(crypto.CCXT_RETRY, sleep=sleep)
    if base_delay_s is not None:
        retry = replace(retry, base_delay_s=base_delay_s)
    crypto.ensure_markets(exchange, retry)
    f = filters
    markets = sorted(exchange.markets.values(), key=lambda m: m["symbol"])
    removed: dict[str, int] = {}
    pairs = _listing_filters(markets, f, removed)
    if pairs and f.min_quote_volume > 0:
        pairs = _ticker_prefilter(exchange, pairs, f, removed, stream)

    day = now.floor("D")
    volumes = _average_volumes(exchange, [m["symbol"] for m in pairs], day, f.volume_days, now, retry, stream)
    pairs = _keep(
        removed,
        f"average daily quote volume over {f.volume_days} days below {f.min_quote_volume:,.0f} {f.quote}",
        pairs,
        lambda m: volumes[m["symbol"]] >= f.min_quote_volume,
    )
    pairs.sort(key=lambda m: (-volumes[m["symbol"]], m["symbol"]))
    if f.max_count is not None:
        removed[f"beyond max_count {f.max_count}"] = max(0, len(pairs) - f.max_count)
        pairs = pairs[: f.max_count]
    result = Resolution(
        exchange=exchange.id,
        as_of=day.strftime("%Y-%m-%d"),
        filters=f,
        markets=len(markets),
        removed=removed,
        pairs=[(m["symbol"], m.get("base") or m["symbol"].split("/")[0], volumes[m["symbol"]]) for m in pairs],
    )
    if not result.pairs:
        raise UserError(
            f"data.exchange_universe leaves no pair of {exchange.id}'s {len(markets)} markets on "
            f"{result.as_of} ({result.counts()}); loosen the filters in the config's "
            "data.exchange_universe (quote, min_quote_volume, exclude_bases)"
        )
    return result


def _keep(removed: dict[str, int], what: str, pairs: list[dict], ok: Callable[[dict], bool]) -> list[dict]:
    """The pairs `ok` accepts; how many it removed is counted in `removed` under `what`."""
    kept = [m for m in pairs if ok(m)]
    removed[what] = len(pairs) - len(kept)
    return kept


def _listing_filters(markets: list[dict], f: ExchangeUniverseConfig, removed: dict[str, int]) -> list[dict]:
    """The markets that pass the filters the market list alone decides: quote, spot, active, base."""
    pairs = _keep(removed, f"quote not {f.quote}", markets, lambda m: m.get("quote") == f.quote)
    pairs = _keep(removed, "not spot", pairs, lambda m: bool(m.get("spot")) or m.get("type") == "spot")
    if f.active_only:
        pairs = _keep(removed, "not active (halted or delisted)", pairs, lambda m: m.get("active") is not False)
    if f.exclude_bases:
        pairs = _keep(
            removed,
            f"base in exclude_bases ({', '.join(f.exclude_bases)})",
            pairs,
            lambda m: m.get("base") not in f.exclude_bases,
        )
    return pairs


def _ticker_prefilter(
    exchange: ccxt.Exchange,
    pairs: list[dict],
    f: ExchangeUniverseConfig,
    removed: dict[str, int],
    stream: TextIO | None,
) -> list[dict]:
    """The pairs whose 24h ticker volume is not far below the floor (one request spares many candle
    requests); all of them when the exchange has no tickers to give."""
    tickers = _ticker_volumes(exchange, stream)
    if not tickers:
        return pairs
    floor = TICKER_PREFILTER * f.min_quote_volume
    return _keep(
        removed,
        f"24h quote volume below {floor:,.0f} {f.quote} (ticker pre-filter)",
        pairs,
        lambda m: tickers.get(m["symbol"], math.inf) >= floor,
    )


def _ticker_volumes(exchange: ccxt.Exchange, stream: TextIO | None) -> dict[str, float]:
    """symbol -> 24h quote volume from one fetch_tickers request; {} when there is none to be had."""
    if not exchange.has.get("fetchTickers"):
        return {}
    try:
        tickers = exchange.fetch_tickers()
    except ccxt.BaseError as e:  # a pre-filter only: the candles still decide
        _say(
            stream,
            f"{exchange.id}: 24h tickers unavailable ({type(e).__name__}); no pre-filter, "
            "every pair's daily candles are fetched",
        )
        return {}
    volumes = {}
    for symbol, t in tickers.items():
        quote_volume = t.get("quoteVolume")
        if quote_volume is None and t.get("baseVolume") is not None:
            price = t.get("vwap") or t.get("last") or t.get("close")
            quote_volume = t["baseVolume"] * price if price is not None else None
        if quote_volume is not None:
            volumes[symbol] = float(quote_volume)
    return volumes


def _average_volumes(
    exchange: ccxt.Exchange,
    symbols: list[str],
    day: pd.Timestamp,
    days: int,
    now: pd.Timestamp,
    retry: RetryPolicy,
    stream: TextIO | None,
) -> dict[str, float]:
    """symbol -> sum(close x volume) of the daily candles in [day - days, day), divided by days."""
    if symbols:
        _say(stream, f"{exchange.id}: {days} daily candles of {len(symbols)} pairs for their average quote volume")
    since_ms, until_ms = _ms(day - days * _DAY), _ms(day)
    volumes = {}
    for number, symbol in enumerate(symbols, start=1):
        try:
            frame = crypto_history.fetch_ohlcv_history(
                exchange, symbol, "1d", since_ms, until_ms, now_ms=_ms(now), retry=retry
            )
        except crypto.BadSymbolError:  # listed a moment ago, gone now: no volume
            frame = None
        traded = 0.0 if frame is None or frame.empty else float(np.nansum(frame["close"] * frame["volume"]))
        volumes[symbol] = traded / days
        if number % _PROGRESS_EVERY == 0 and number < len(symbols):
            _say(stream, f"{exchange.id}: {number} of {len(symbols)} pairs")
    return volumes


def _ms(ts: pd.Timestamp) -> int:
    return int(ts.timestamp() * 1000)


def _say(stream: TextIO | None, line: str) -> None:
    if stream is not None:
        print(line, file=stream, flush=True)


def write_exchange_universe(case_dir: Path, result: Resolution) -> Path:
    """Write the resolved pairs to the day's universe file (atomically); returns its path."""
    f = result.filters
    lines = [
        f"# Exchange universe: {result.exchange} spot pairs quoted in {f.quote}, resolved by `marketgpt data download`",
        f"# As of {result.as_of}: the pairs that passed data.exchange_universe on that day, most liquid first",
        "# Survivorship bias: the pairs listed and liquid on that day, trained on their past; pairs delisted",
        "# or illiquid before then are absent (see docs/data.md, Universes).",
        f"# Filters: quote {f.quote}, spot only, {'active only, ' if f.active_only else ''}average daily quote "
        f"volume over the {f.volume_days} days before {result.as_of} >= {f.min_quote_volume:,.0f} {f.quote}, "
        f"max_count {f.max_count}, exclude_bases [{', '.join(f.exclude_bases)}]",
        f"# Of {result.markets} markets: {result.counts()}; {len(result.pairs)} kept",
        f"# Average daily quote volume ({f.quote}) of the most liquid: "
        + ", ".join(f"{symbol} {volume:,.0f}" for symbol, _, volume in result.pairs[:5]),
    ]
    body = io.StringIO()
    writer = csv.writer(body, lineterminator="\n")
    writer.writerow(HEADER)
    for symbol, base, _ in result.pairs:
        writer.writerow([symbol, "ccxt", "crypto", base])
    path = exchange_universe_file(case_dir, result.exchange, result.as_of)
    atomic_write_bytes(path, ("\n".join(lines) + "\n" + body.getvalue()).encode("utf-8"))
    return path


def resolve_to_file(
    d: DataConfig,
    case_dir: Path,
    *,
    now: pd.Timestamp | None = None,
    sleep: Callable[[float], None] = time.sleep,
    base_delay_s: float | None = None,
    stream: TextIO | None = None,
) -> Path:
    """The download's first step under data.universe = "exchange": resolve the pairs and write the day's file."""
    now = pd.Timestamp.now(tz="UTC") if now is None else now
    exchange = crypto.make_exchange(d.exchange)
    result = resolve_exchange_universe(
        exchange, d.exchange_universe, now, sleep=sleep, base_delay_s=base_delay_s, stream=stream
    )
    path = write_exchange_universe(Path(case_dir), result)
    _say(
        stream,
        f"{result.exchange} universe as of {result.as_of}: {len(result.pairs)} pairs -> {path.name} "
        f"({result.counts()})",
    )
    return path
