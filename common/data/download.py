"""`marketgpt data download`: fetch a case's universe into its parquet cache, incrementally.

Assets with source "yfinance" go to Yahoo Finance in batches (common.data.yahoo), "ccxt" ones to
the configured exchange one by one (common.data.crypto). Each asset is saved as soon as it
arrives (Yahoo: after each batch), atomically, so a download that dies halfway keeps what it got
and the next run resumes.

Incremental: an asset already in the cache is fetched again only from its second-to-last cached
candle on (one candle of overlap; for round-the-clock markets that is the last one minus one
bar); the overlap is deduplicated with the new candle winning, because the last cached candle
may have been a still-forming bar. Yahoo's adjusted prices change backwards after every dividend
or split, so for Yahoo the overlap is also a check: when the re-fetched close of a complete
cached candle differs, the asset is fetched again in full and replaced instead of appended to.
A cache filled from another ccxt exchange than the configured one is replaced the same way.
History before the first cached candle is not fetched again: to extend data.start_date
backwards, delete the asset's files (or the cache) and download again.

The run prints progress (a tqdm bar when stderr is a terminal, plain lines otherwise, as in a
Slurm log) and a summary: assets ok / empty / failed / unreachable / inactive, rows added, date
range, and how many assets are usable for training under the case config (`check_usable`: the
same preparation training runs, on the cache; an asset with fewer candles before the first split
cut than a context window is not), also written to <cache>/training_check.json. `marketgpt data
check` prints the same from the cache alone. Statuses: "failed" means the source has no data for
the symbol (fix the universe); "unreachable" means it was rate limited or timed out (a rerun
fetches it); "inactive" means the exchange lists the pair as halted or delisted (its candles up to
then are kept). A source that stays unreachable after retries stops that source, the other source
still runs, and then `SourceUnavailable` is raised naming it (the CLI exits non-zero); nothing
partial is written. An exchange that refuses this machine's location stops the crypto part the
same way, with a `RestrictedLocation` error naming data.exchange and the alternatives.

Environment knobs:
  MARKETGPT_RETRY_DELAY_S   base delay in seconds of the retry backoff and of the pause between
                            Yahoo batches (default: Yahoo 5 s retries, 2 s pauses; ccxt 1 s).
                            0 makes an unreachable source fail at once (the wait of at least
                            60 s after a Yahoo 429 stays); the tests use it.
  MARKETGPT_YAHOO_HTTP      "requests" to talk to Yahoo through requests with yfinance's own
                            browser headers instead of its default curl_cffi client (machines
                            where curl_cffi can't be used; tests). Yahoo may rate-limit it sooner.
"""
from __future__ import annotations

import contextlib
import dataclasses
import io
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, TextIO

import numpy as np
import pandas as pd

from common.atomic import atomic_write_json
from common.config import Config
from common.data.cache import CandleCache
from common.data.universe import Asset, load_universe, universe_as_of
from common.errors import SourceUnavailable, UserError

__all__ = ["AssetResult", "DownloadSummary", "TRAINING_CHECK", "Usability", "check_usable", "download_case"]

TRAINING_CHECK = "training_check.json"  # in the cache folder: the last download's usable-for-training check

YAHOO_ORIGIN = "yahoo"
# Relative change of a complete cached close, re-fetched, that means Yahoo re-adjusted history:
# far above float and rounding noise, far below a dividend (a quarterly one is ~0.1% or more).
RESTATE_RTOL = 1e-4


@dataclass
class AssetResult:
    symbol: str
    source: str
    status: str = "pending"  # ok | empty | failed | unreachable | inactive
    rows_added: int = 0
    reason: str = ""
    first: pd.Timestamp | None = None  # cached range after this run
    last: pd.Timestamp | None = None


@dataclass
class DownloadSummary:
    case_dir: Path
    interval: str
    cache_dir: Path
    assets: dict[str, AssetResult] = field(default_factory=dict)  # universe order
    unavailable: dict[str, str] = field(default_factory=dict)  # source name -> why
    refused: dict[str, str] = field(default_factory=dict)  # source name -> why (a user error: e.g. location)
    notes: list[str] = field(default_factory=list)
    usable: Usability | None = None  # set after the download

    def with_status(self, status: str) -> list[AssetResult]:
        return [a for a in self.assets.values() if a.status == status]

    @property
    def ok(self) -> list[AssetResult]:
        return self.with_status("ok")

    @property
    def empty(self) -> list[AssetResult]:
        return self.with_status("empty")

    @property
    def failed(self) -> list[AssetResult]:
        return self.with_status("failed")

    @property
    def unreachable(self) -> list[AssetResult]:
        return self.with_status("unreachable")

    @property
    def inactive(self) -> list[AssetResult]:
        return self.with_status("inactive")

    @property
    def exit_code(self) -> int:
        """0: everything downloaded; 1: some assets failed, are inactive or were not reached."""
        return 1 if self.failed or self.inactive or self.unreachable else 0

    @property
    def rows_added(self) -> int:
        return sum(a.rows_added for a in self.assets.values())

    @property
    def date_range(self) -> tuple[pd.Timestamp, pd.Timestamp] | None:
        kept = self.ok + self.inactive
        firsts = [a.first for a in kept if a.first is not None]
        lasts = [a.last for a in kept if a.last is not None]
        return (min(firsts), max(lasts)) if firsts else None

    def format(self) -> str:
        span = self.date_range
        lines = [
            f"Download summary: {self.case_dir.name}, {self.interval} candles, cache {self.cache_dir}",
            f"  assets: {len(self.ok)} ok, {len(self.empty)} empty, {len(self.failed)} failed"
            + (f", {len(self.inactive)} inactive" if self.inactive else "")
            + (f", {len(self.unreachable)} not downloaded (unreachable: a rerun fetches them)"
               if self.unreachable else ""),
            f"  rows added: {self.rows_added:,}",
            f"  date range: {_day(span[0])} -> {_day(span[1])}" if span else "  date range: -",
        ]
        titles = (("failed (no data from the source: fix or replace them in the universe)", self.failed),
                  ("empty", self.empty),
                  ("inactive (halted or delisted on the exchange; candles up to then are kept)", self.inactive),
                  ("unreachable (rate limited or timed out; run the same command again later)", self.unreachable))
        for title, items in titles:
            if items:
                lines.append(f"  {title}:")
                lines += [f"    {a.symbol} ({a.source}): {a.reason}" for a in items]
        for source, why in self.unavailable.items():
            lines.append(f"  unreachable: {source}: {why}")
        for source, why in self.refused.items():
            lines.append(f"  refused: {source}: {why}")
        lines += [f"  note: {n}" for n in self.notes]
        if self.usable is not None:
            lines.append(self.usable.format())
        return "\n".join(lines)


def _day(ts: pd.Timestamp) -> str:
    return ts.strftime("%Y-%m-%d") if ts.hour == ts.minute == 0 else ts.strftime("%Y-%m-%d %H:%M")


class _Progress:
    """A tqdm bar on a terminal, plain lines otherwise (Slurm logs, pipes)."""

    def __init__(self, total: int, enabled: bool | None, stream: TextIO) -> None:
        self.total, self.done, self.stream = total, 0, stream
        if enabled is None:
            enabled = hasattr(stream, "isatty") and stream.isatty()
        self.bar = None
        if enabled:
            from tqdm import tqdm

            self.bar = tqdm(total=total, unit="asset", file=stream, dynamic_ncols=True)

    def advance(self, n: int, text: str) -> None:
        self.done += n
        if self.bar is not None:
            self.bar.update(n)
            self.bar.set_postfix_str(text, refresh=True)
        else:
            print(f"[{self.done}/{self.total}] {text}", file=self.stream, flush=True)

    def note(self, text: str) -> None:
        if self.bar is not None:
            self.bar.write(text, file=self.stream)
        else:
            print(text, file=self.stream, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _env_delay() -> float | None:
    text = os.environ.get("MARKETGPT_RETRY_DELAY_S")
    if text is None or not text.strip():
        return None
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value >= 0:
        raise UserError(f"MARKETGPT_RETRY_DELAY_S={text!r}: expected seconds (a number >= 0)")
    return value


def _env_yahoo_session() -> Any:
    choice = os.environ.get("MARKETGPT_YAHOO_HTTP", "").strip().lower()
    if choice in ("", "default"):
        return None
    if choice == "requests":
        from common.data.yahoo import requests_session

        return requests_session()
    raise UserError(f"MARKETGPT_YAHOO_HTTP={choice!r}: expected 'requests' or 'default'")


def _utc(value: str) -> pd.Timestamp:
    return pd.Timestamp(value, tz="UTC")


def _resume_from(frame: pd.DataFrame) -> pd.Timestamp:
    """Where an incremental fetch starts: one complete candle before the last cached one."""
    return frame.index[-2] if len(frame) >= 2 else frame.index[-1]


def _restated(old: pd.DataFrame, new: pd.DataFrame) -> bool:
    """True if re-fetched closes of complete cached candles differ (Yahoo re-adjusted history)."""
    common = old.index[:-1].intersection(new.index)  # the last cached candle may have been forming
    if common.empty:
        return False
    return not np.allclose(new.loc[common, "close"], old.loc[common, "close"], rtol=RESTATE_RTOL,
                           atol=0.0, equal_nan=True)


class _Run:
    """One download: the cache, the summary and the progress shared by both sources."""

    def __init__(self, cfg: Config, case_dir: Path, assets: list[Asset], *, progress: bool | None,
                 sleep: Callable[[float], None], now: pd.Timestamp | None, stream: TextIO) -> None:
        d = cfg.data
        self.cfg, self.interval, self.sleep, self.now = cfg, d.interval, sleep, now
        self.start = _utc(d.start_date)
        self.end = _utc(d.end_date) if d.end_date else None
        self.cache = CandleCache(case_dir / d.cache_dir)
        self.manifest = self.cache.manifest()
        self.delay = _env_delay()
        self.summary = DownloadSummary(case_dir=case_dir, interval=d.interval, cache_dir=self.cache.root,
                                       assets={a.symbol: AssetResult(a.symbol, a.source) for a in assets})
        self.progress = _Progress(len(assets), progress, stream)

    def cached(self, source: str, symbol: str, origin: str) -> tuple[pd.DataFrame | None, bool]:
        """(cached candles or None, whether a new download must replace rather than extend them)."""
        frame = self.cache.read(source, self.interval, symbol)
        if frame is None or frame.empty:
            return None, False
        key = self.cache.path_for(source, self.interval, symbol).relative_to(self.cache.root).as_posix()
        was = (self.manifest.get(key) or {}).get("origin")
        if was is not None and was != origin:
            self.progress.note(f"{symbol}: cached candles came from {was}, the config says {origin}: "
                               "downloading the full history again")
            return None, True
        return frame, False

    def save(self, source: str, symbol: str, frame: pd.DataFrame, *, adjusted: bool, origin: str,
             replace: bool) -> None:
        result = self.summary.assets[symbol]
        if replace:
            old = self.cache.read(source, self.interval, symbol)
            self.cache.write(source, self.interval, symbol, frame, adjusted, origin=origin)
            added = len(frame) - (0 if old is None else len(old))
        else:
            added = self.cache.append(source, self.interval, symbol, frame, adjusted, origin=origin)
        stored = self.cache.read(source, self.interval, symbol)
        result.status, result.reason = "ok", ""
        result.rows_added += max(added, 0)
        result.first, result.last = stored.index[0], stored.index[-1]

    def up_to_date(self, symbol: str, frame: pd.DataFrame) -> None:
        result = self.summary.assets[symbol]
        result.status, result.first, result.last = "ok", frame.index[0], frame.index[-1]
        self.progress.advance(1, f"{result.source} {symbol}: up to date")

    def mark(self, symbol: str, status: str, reason: str) -> None:
        result = self.summary.assets[symbol]
        result.status, result.reason = status, reason

    # ----------------------------------------------------------------------- Yahoo

    def yahoo(self, assets: list[Asset], session: Any) -> None:
        from common.data.yahoo import PAUSE_S, download_yahoo

        pause_s = PAUSE_S if self.delay is None else self.delay
        kwargs: dict[str, Any] = dict(session=session, sleep=self.sleep, now=self.now, pause_s=pause_s)
        if self.delay is not None:
            kwargs.update(retry_delay_s=self.delay)
        cached: dict[str, pd.DataFrame] = {}
        replace: set[str] = set()
        # One yf.download per fetch day: assets cached up to the same day (most of a universe)
        # share calls; each call starts at the earliest start of its group.
        groups: dict[pd.Timestamp, list[tuple[pd.Timestamp, str]]] = {}
        for asset in assets:
            frame, must_replace = self.cached("yfinance", asset.symbol, YAHOO_ORIGIN)
            if must_replace:
                replace.add(asset.symbol)
            if frame is not None:
                cached[asset.symbol] = frame
            start = _resume_from(frame) if frame is not None else self.start
            if frame is not None and self.end is not None and start >= self.end:
                self.up_to_date(asset.symbol, frame)  # holds everything up to data.end_date already
                continue
            groups.setdefault(start.floor("D"), []).append((start, asset.symbol))

        restate: list[str] = []

        def save_batch(part: Any) -> None:
            for symbol, frame in part.frames.items():
                if symbol in cached and _restated(cached[symbol], frame):
                    restate.append(symbol)
                    continue
                self.save("yfinance", symbol, frame, adjusted=True, origin=YAHOO_ORIGIN,
                          replace=symbol in replace)
            for symbol, reason in part.failed.items():
                self.mark(symbol, "failed", reason)
            for symbol, reason in part.unreachable.items():
                self.mark(symbol, "unreachable", reason)
            done = len(part.frames) + len(part.failed) + len(part.unreachable)
            self.progress.advance(done, f"yfinance: {len(part.frames)} ok, {len(part.failed)} failed"
                                  + (f", {len(part.unreachable)} unreachable" if part.unreachable else ""))

        for number, (_, members) in enumerate(sorted(groups.items())):
            if number:
                self.sleep(pause_s)
            start = min(start for start, _ in members)
            symbols = [symbol for _, symbol in members]
            result = download_yahoo(symbols, self.interval, start, self.end, on_batch=save_batch, **kwargs)
            if result.clamped_start is not None:
                self.summary.notes.append(
                    f"Yahoo keeps {self.interval} bars for a limited time only: fetched from "
                    f"{_day(result.clamped_start)} instead of {_day(start)}")

        if restate:
            self.progress.note(f"yfinance: adjusted prices changed since the last download (dividend or "
                               f"split) for {', '.join(restate)}: downloading their full history again")

            def replace_batch(part: Any) -> None:
                for symbol, frame in part.frames.items():
                    self.save("yfinance", symbol, frame, adjusted=True, origin=YAHOO_ORIGIN, replace=True)
                for symbol, reason in part.failed.items():
                    self.mark(symbol, "failed", reason)
                for symbol, reason in part.unreachable.items():
                    self.mark(symbol, "unreachable", reason)

            self.sleep(pause_s)
            download_yahoo(restate, self.interval, self.start, self.end, on_batch=replace_batch, **kwargs)

    # ----------------------------------------------------------------------- ccxt

    def ccxt(self, assets: list[Asset]) -> None:
        import ccxt

        from common.data import crypto

        exchange = crypto.make_exchange(self.cfg.data.exchange)
        quote = self.cfg.data.quote_currency
        # Candles of BTC/USD and BTC/USDT differ a little: a cache filled with another quote is replaced.
        origin = exchange.id if not quote else f"{exchange.id} {quote}"
        retry: dict[str, Any] = dict(sleep=self.sleep)
        if self.delay is not None:
            retry["base_delay_s"] = self.delay
        crypto.ensure_markets(exchange, **retry)  # once, up front: a refusal by location stops here
        now_ms = None if self.now is None else int(self.now.timestamp() * 1000)
        until_ms = None if self.end is None else int(self.end.timestamp() * 1000)
        for asset in assets:
            frame, replace = self.cached("ccxt", asset.symbol, origin)
            start = _resume_from(frame) if frame is not None else self.start
            if frame is not None and self.end is not None and start >= self.end:
                self.up_to_date(asset.symbol, frame)
                continue
            market = crypto.with_quote(asset.symbol, quote)
            try:
                new = crypto.fetch_ohlcv_history(exchange, market, self.interval,
                                                 int(start.timestamp() * 1000), until_ms, now_ms=now_ms, **retry)
            except crypto.BadSymbolError as e:
                self.mark(asset.symbol, "failed", str(e))
                self.progress.advance(1, f"ccxt {asset.symbol}: failed")
                continue
            except ccxt.NetworkError as e:  # should arrive as SourceUnavailable; never as a traceback
                raise SourceUnavailable(f"{origin}: {type(e).__name__}: {e}") from e
            if new.empty:
                self.mark(asset.symbol, "empty", f"{origin} returned no {self.interval} candles from {_day(start)}")
                if frame is not None:
                    self.summary.assets[asset.symbol].first = frame.index[0]
                    self.summary.assets[asset.symbol].last = frame.index[-1]
                self.progress.advance(1, f"ccxt {asset.symbol}: no candles")
                continue
            self.save("ccxt", asset.symbol, new, adjusted=False, origin=origin, replace=replace)
            inactive = crypto.inactive_reason(exchange, market) if exchange.markets else None
            if inactive:
                self.mark(asset.symbol, "inactive", inactive)
            self.progress.advance(1, f"ccxt {asset.symbol}: +{self.summary.assets[asset.symbol].rows_added} rows"
                                  + (" (inactive)" if inactive else ""))


def download_case(cfg: Config, case_dir: Path, *, progress: bool | None = None,
                  sleep: Callable[[float], None] = time.sleep, yahoo_session: Any = None,
                  now: pd.Timestamp | None = None, stream: TextIO | None = None) -> DownloadSummary:
    """Download (or update) every asset of the case universe into case_dir / cfg.data.cache_dir.

    Prints progress to `stream` (default stderr; `progress` None: a bar only on a terminal) and
    the summary to stdout. Raises SourceUnavailable, after the summary, if a source could not
    be reached; failed assets (delisted, unknown symbol) are only reported, in the summary.
    `sleep`, `yahoo_session` and `now` are for tests (see also the env knobs above).
    """
    case_dir = Path(case_dir)
    d = cfg.data
    assets = load_universe(case_dir / d.universe, d.universe_counts or None)
    run = _Run(cfg, case_dir, assets, progress=progress, sleep=sleep, now=now, stream=stream or sys.stderr)
    session = yahoo_session if yahoo_session is not None else _env_yahoo_session()

    for asset in assets:
        if asset.source not in ("yfinance", "ccxt"):
            run.mark(asset.symbol, "failed", f"source '{asset.source}' can't be downloaded (the sample ships "
                                             "with the package); use source yfinance or ccxt in the universe")
            run.progress.advance(1, f"{asset.symbol}: skipped")

    from common.data.yahoo import YAHOO

    parts = ((YAHOO, "yfinance", lambda group: run.yahoo(group, session)),
             (f"ccxt exchange {d.exchange}", "ccxt", run.ccxt))
    try:
        for name, source, fetch in parts:
            group = [a for a in assets if a.source == source]
            if not group:
                continue
            try:
                fetch(group)
            except SourceUnavailable as e:
                run.summary.unavailable[name] = str(e)
                for asset in group:
                    if run.summary.assets[asset.symbol].status == "pending":
                        run.mark(asset.symbol, "unreachable", f"{name} unreachable")
                run.progress.note(f"{name}: unreachable, skipping its remaining assets")
            except UserError as e:  # e.g. the exchange refuses this location: no asset of it can come
                run.summary.refused[name] = str(e)
                for asset in group:
                    if run.summary.assets[asset.symbol].status == "pending":
                        run.mark(asset.symbol, "failed", f"{name} refused: see below")
                run.progress.note(f"{name}: refused, skipping its remaining assets")
    finally:
        run.progress.close()

    summary = run.summary
    summary.usable = check_usable(cfg, case_dir)
    atomic_write_json(run.cache.root / TRAINING_CHECK, summary.usable.to_json())
    print(summary.format(), flush=True)
    if summary.refused:
        raise UserError(" | ".join(summary.refused.values()))
    if summary.unavailable:
        names = " and ".join(summary.unavailable)
        raise SourceUnavailable(
            f"could not reach {names}; {len(summary.unreachable)} of {len(summary.assets)} assets not "
            f"downloaded. {' | '.join(summary.unavailable.values())}. The cache keeps what it had; run the "
            "same command again when the network is back, it resumes")
    return summary


# --------------------------------------------------------------------------- usable for training


@dataclass
class Usability:
    """Which cached assets training under a config would use, and why the others would not."""
    case_dir: Path
    interval: str
    context_length: int
    total: int
    usable: list[str]
    unusable: dict[str, str]  # symbol -> why, universe order
    problem: str | None = None  # why nothing is usable, when nothing is
    fixes: dict[str, int] = field(default_factory=dict)  # cleaning fixes over the usable assets
    universe_as_of: str | None = None

    def format(self) -> str:
        lines = [f"Usable for training ({self.interval}, context {self.context_length}): "
                 f"{len(self.usable)} of {self.total} assets"]
        if self.problem:
            lines.append(f"  none: {self.problem}")
        if self.unusable:
            lines.append("  not usable:")
            lines += [f"    {symbol}: {why}" for symbol, why in self.unusable.items()]
        repaired = {k: v for k, v in self.fixes.items() if v}
        if repaired:
            lines.append("  cleaning: " + ", ".join(f"{k} {v}" for k, v in repaired.items()))
        if self.universe_as_of:
            lines.append(f"  universe as of {self.universe_as_of}: today's constituents trained on past data "
                         "(survivorship bias: assets that failed or were delisted before then are absent)")
        return "\n".join(lines)

    def to_json(self) -> dict:
        return {"case": self.case_dir.name, "interval": self.interval, "context_length": self.context_length,
                "assets": self.total, "usable": len(self.usable), "usable_symbols": self.usable,
                "not_usable": self.unusable, "problem": self.problem, "fixes": self.fixes,
                "universe_as_of": self.universe_as_of,
                "checked_at": pd.Timestamp.now(tz="UTC").isoformat(timespec="seconds")}


def check_usable(cfg: Config, case_dir: Path) -> Usability:
    """Run training's own loading and preparation on the cache (no network) and report the result."""
    from common.data.loading import load_market_data
    from common.data.prepare import prepare_data

    case_dir = Path(case_dir)
    if cfg.data.source != "files":  # the cache, even under a config that trains on the sample
        cfg = dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, source="download"))
    d = cfg.data
    listed = d.universe != "files"  # data.universe = "files": the files are the universe
    assets = load_universe(case_dir / d.universe, d.universe_counts or None) if listed else []
    result = Usability(case_dir=case_dir, interval=d.interval, context_length=cfg.model.context_length,
                       total=len(assets), usable=[], unusable={},
                       universe_as_of=universe_as_of(case_dir / d.universe) if listed else None)
    try:
        with contextlib.redirect_stderr(io.StringIO()):  # loading's "left out" warning: reported below
            market = load_market_data(cfg, case_dir)
            result.total = len(market.assets)
            prepared = prepare_data(cfg, market)
    except UserError as e:
        result.problem = str(e)
        return result
    result.usable = [a.symbol for a in prepared.assets]
    result.unusable = dict(prepared.dropped)
    result.fixes = dict(prepared.info["totals"]["fixes"])
    return result
