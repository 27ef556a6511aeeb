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
backwards, delete the asset's files (or the cache) and download again. data.start_date = "max"
asks for each asset's whole history (ccxt: from crypto.HISTORY_START_MS, answered from the
listing; Yahoo: yahoo.earliest_start, clamped to Yahoo's intraday windows, said in the summary).

Long ccxt histories (4M+ 1-minute candles since 2017) come through crypto_history.iter_ohlcv_history
(common.data.download_ccxt) in chunks of SAVE_EVERY_CANDLES, each appended to the cache as it
arrives, so a kill or a network drop loses one chunk at most and the rerun resumes after the
last saved candle; progress lines (candles, pages, how far, rate, ETA) come at each save and
every PROGRESS_EVERY_S.

The run prints progress (a tqdm bar when stderr is a terminal, plain lines otherwise, as in a
Slurm log) and a summary: assets ok / empty / failed / unreachable / inactive, rows added, date
range, and how many assets are usable for training under the case config (common.data.check: the
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

import dataclasses
import os
import sys
import time
from pathlib import Path
from typing import Any, Callable, TextIO

import numpy as np
import pandas as pd

from common.atomic import atomic_write_json
from common.config import Config, DataConfig
from common.data.cache import CandleCache
from common.data.check import Usability, check_usable
from common.data.download_report import AssetResult, DownloadSummary, Progress, format_day, resume_from
from common.data.loading import start_bound
from common.data.universe import EXCHANGE_UNIVERSE, Asset, load_universe, universe_path
from common.data.yahoo import (
    PAUSE_S,
    YAHOO,
    YAHOO_RETRY,
    YahooPacing,
    YahooResult,
    download_yahoo,
    earliest_start,
    window_text,
)
from common.data.yahoo_requests import requests_session
from common.errors import SourceUnavailable, UserError

__all__ = ["TRAINING_CHECK", "DownloadRun", "download_case"]

TRAINING_CHECK = "training_check.json"  # in the cache folder: the last download's usable-for-training check

YAHOO_ORIGIN = "yahoo"
# Relative change of a complete cached close, re-fetched, that means Yahoo re-adjusted history:
# far above float and rounding noise, far below a dividend (a quarterly one is ~0.1% or more).
RESTATE_RTOL = 1e-4


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
        return requests_session()
    raise UserError(f"MARKETGPT_YAHOO_HTTP={choice!r}: expected 'requests' or 'default'")


def _utc(value: str) -> pd.Timestamp:
    return pd.Timestamp(value, tz="UTC")


def _restated(old: pd.DataFrame, new: pd.DataFrame) -> bool:
    """True if re-fetched closes of complete cached candles differ (Yahoo re-adjusted history)."""
    common = old.index[:-1].intersection(new.index)  # the last cached candle may have been forming
    if common.empty:
        return False
    return not np.allclose(
        new.loc[common, "close"], old.loc[common, "close"], rtol=RESTATE_RTOL, atol=0.0, equal_nan=True
    )


class DownloadRun:
    """One download: the cache, the summary and the progress shared by both sources."""

    def __init__(
        self,
        d: DataConfig,
        case_dir: Path,
        assets: list[Asset],
        *,
        progress: bool | None,
        sleep: Callable[[float], None],
        now: pd.Timestamp | None,
        stream: TextIO,
    ) -> None:
        self.data, self.interval, self.sleep, self.now = d, d.interval, sleep, now
        self.start = start_bound(d.start_date)  # None: "max", each asset's whole history
        self.end = _utc(d.end_date) if d.end_date else None
        self.cache = CandleCache(case_dir / d.cache_dir)
        self.manifest = self.cache.manifest()
        self.delay = _env_delay()
        self.summary = DownloadSummary(
            case_dir=case_dir,
            interval=d.interval,
            cache_dir=self.cache.root,
            assets={a.symbol: AssetResult(a.symbol, a.source) for a in assets},
        )
        self.progress = Progress(len(assets), progress, stream)

    def cached(self, source: str, symbol: str, origin: str) -> tuple[pd.DataFrame | None, bool]:
        """(cached candles or None, whether a new download must replace rather than extend them)."""
        frame = self.cache.read(source, self.interval, symbol)
        if frame is None or frame.empty:
            return None, False
        path = self.cache.path_for(source, self.interval, symbol)
        entry = self.manifest.get(path.relative_to(self.cache.root).as_posix()) or self.cache.file_record(path)
        if entry is None:  # no record of where they came from: extending them could mix two exchanges
            self.progress.note(
                f"{symbol}: the cache records no origin for its candles (a file of an older version whose "
                f"manifest entry is gone), the config says {origin}: downloading the full history again"
            )
            return None, True
        was = entry.get("origin")
        if was is not None and was != origin:
            self.progress.note(
                f"{symbol}: cached candles came from {was}, the config says {origin}: "
                "downloading the full history again"
            )
            return None, True
        return frame, False

    def save(
        self, source: str, symbol: str, frame: pd.DataFrame, *, adjusted: bool, origin: str, replace: bool
    ) -> None:
        result = self.summary.assets[symbol]
        if replace:
            old = self.cache.read(source, self.interval, symbol)
            self.cache.write(source, self.interval, symbol, frame, adjusted, origin=origin)
            added = len(frame) - (0 if old is None else len(old))
        else:
            added = self.cache.append(source, self.interval, symbol, frame, adjusted, origin=origin)
        stored = self.cache.read(source, self.interval, symbol)
        assert stored is not None  # written just above
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
        pause_s = PAUSE_S if self.delay is None else self.delay
        retry = dataclasses.replace(YAHOO_RETRY, sleep=self.sleep)
        if self.delay is not None:
            retry = dataclasses.replace(retry, base_delay_s=self.delay)
        kwargs: dict[str, Any] = dict(session=session, now=self.now, retry=retry, pacing=YahooPacing(pause_s=pause_s))
        cached, replace, groups = self._yahoo_groups(assets)
        restate: list[str] = []

        def save_batch(part: YahooResult) -> None:
            for symbol, frame in part.frames.items():
                if symbol in cached and _restated(cached[symbol], frame):
                    restate.append(symbol)
                else:
                    self.save("yfinance", symbol, frame, adjusted=True, origin=YAHOO_ORIGIN, replace=symbol in replace)
            self._mark_missing(part)
            done = len(set(part.frames) | set(part.failed) | set(part.unreachable))
            self.progress.advance(
                done,
                f"yfinance: {len(part.frames)} ok, {len(part.failed)} failed"
                + (f", {len(part.unreachable)} unreachable" if part.unreachable else ""),
            )

        for number, (_, members) in enumerate(sorted(groups.items())):
            if number:
                self.sleep(pause_s)
            start = min(start for start, _ in members)
            symbols = [symbol for _, symbol in members]
            result = download_yahoo(symbols, self.interval, start, self.end, on_batch=save_batch, **kwargs)
            if result.clamped_start is not None:
                wanted = (
                    format_day(start)
                    if self.start is not None or start != self._yahoo_first()
                    else 'the whole history (data.start_date = "max")'
                )
                self.summary.notes.append(
                    f"{window_text(self.interval)}: fetched from {format_day(result.clamped_start)} instead of {wanted}"
                )
        if restate:
            self._yahoo_full_history(restate, pause_s, kwargs)

    def _yahoo_groups(
        self, assets: list[Asset]
    ) -> tuple[dict[str, pd.DataFrame], set[str], dict[pd.Timestamp, list[tuple[pd.Timestamp, str]]]]:
        """(cached frames, symbols to replace, fetch groups) for the assets that need a fetch.

        One yf.download per fetch day: assets cached up to the same day (most of a universe)
        share calls; each call starts at the earliest start of its group."""
        cached: dict[str, pd.DataFrame] = {}
        replace: set[str] = set()
        groups: dict[pd.Timestamp, list[tuple[pd.Timestamp, str]]] = {}
        for asset in assets:
            frame, must_replace = self.cached("yfinance", asset.symbol, YAHOO_ORIGIN)
            if must_replace:
                replace.add(asset.symbol)
            if frame is not None:
                cached[asset.symbol] = frame
            start = resume_from(frame) if frame is not None else self._yahoo_first()
            if frame is not None and self.end is not None and start >= self.end:
                self.up_to_date(asset.symbol, frame)  # holds everything up to data.end_date already
                continue
            groups.setdefault(start.floor("D"), []).append((start, asset.symbol))
        return cached, replace, groups

    def _yahoo_full_history(self, restate: list[str], pause_s: float, kwargs: dict[str, Any]) -> None:
        """Fetch again in full, and replace, the assets whose adjusted prices Yahoo changed."""
        self.progress.note(
            f"yfinance: adjusted prices changed since the last download (dividend or "
            f"split) for {', '.join(restate)}: downloading their full history again"
        )

        def replace_batch(part: YahooResult) -> None:
            for symbol, frame in part.frames.items():
                self.save("yfinance", symbol, frame, adjusted=True, origin=YAHOO_ORIGIN, replace=True)
            self._mark_missing(part)

        self.sleep(pause_s)
        download_yahoo(restate, self.interval, self._yahoo_first(), self.end, on_batch=replace_batch, **kwargs)

    def _yahoo_first(self) -> pd.Timestamp:
        """Where a Yahoo history starts: data.start_date, or for "max" the first trade (99 years back,
        as yfinance's period="max"; download_yahoo clamps intraday bars to Yahoo's window and says so)."""
        if self.start is not None:
            return self.start
        return earliest_start("1d", self.now if self.now is not None else pd.Timestamp.now(tz="UTC"))

    def _mark_missing(self, part: YahooResult) -> None:
        for symbol, reason in part.failed.items():
            self.mark(symbol, "failed", reason)
        for symbol, reason in part.unreachable.items():
            self.mark(symbol, "unreachable", reason)


def download_case(
    cfg: Config,
    case_dir: Path,
    *,
    progress: bool | None = None,
    sleep: Callable[[float], None] = time.sleep,
    yahoo_session: Any = None,
    now: pd.Timestamp | None = None,
    stream: TextIO | None = None,
) -> DownloadSummary:
    """Download (or update) every asset of the case universe into case_dir / cfg.data.cache_dir.

    Prints progress to `stream` (default stderr; `progress` None: a bar only on a terminal) and
    the summary to stdout. Raises SourceUnavailable, after the summary, if a source could not
    be reached; failed assets (delisted, unknown symbol) are only reported, in the summary.
    `sleep`, `yahoo_session` and `now` are for tests (see also the env knobs above).
    """
    case_dir = Path(case_dir)
    d = cfg.data
    if d.universe == EXCHANGE_UNIVERSE:  # the pairs that pass data.exchange_universe today, to a dated file
        from common.data.exchange_universe import resolve_to_file  # lazy: imports ccxt

        resolve_to_file(d, case_dir, now=now, sleep=sleep, base_delay_s=_env_delay(), stream=stream or sys.stderr)
    assets = load_universe(universe_path(case_dir, d.universe, d.exchange), d.universe_counts or None)
    run = DownloadRun(d, case_dir, assets, progress=progress, sleep=sleep, now=now, stream=stream or sys.stderr)
    session = yahoo_session if yahoo_session is not None else _env_yahoo_session()

    for asset in assets:
        if asset.source not in ("yfinance", "ccxt"):
            run.mark(
                asset.symbol,
                "failed",
                f"source '{asset.source}' can't be downloaded (the sample ships "
                "with the package); use source yfinance or ccxt in the universe",
            )
            run.progress.advance(1, f"{asset.symbol}: skipped")
    parts = (
        (YAHOO, "yfinance", lambda group: run.yahoo(group, session)),
        (f"ccxt exchange {d.exchange}", "ccxt", lambda group: _ccxt(run, group)),
    )
    try:
        for name, source, fetch in parts:
            group = [a for a in assets if a.source == source]
            if group:
                _fetch_source(run, name, group, fetch)
    finally:
        run.progress.close()
    # the whole config: the check keys the token shard it looks for by the model and tokenizer too
    return _report(run, check_usable(cfg, case_dir))


def _ccxt(run: DownloadRun, group: list[Asset]) -> None:
    from common.data.download_ccxt import fetch_ccxt  # lazy: imports ccxt (about 2 s)

    fetch_ccxt(run, group)


def _fetch_source(run: DownloadRun, name: str, group: list[Asset], fetch: Callable[[list[Asset]], None]) -> None:
    """Fetch one source's assets; a source that is down or refuses marks what it did not fetch."""
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


def _report(run: DownloadRun, usable: Usability) -> DownloadSummary:
    """Record what training could use now and print the summary; raise if a source failed."""
    summary = run.summary
    summary.usable = usable
    atomic_write_json(run.cache.root / TRAINING_CHECK, summary.usable.to_json())
    print(summary.format(), flush=True)
    if summary.refused:
        raise UserError(" | ".join(summary.refused.values()))
    if summary.unavailable:
        names = " and ".join(summary.unavailable)
        raise SourceUnavailable(
            f"could not reach {names}; {len(summary.unreachable)} of {len(summary.assets)} assets not "
            f"downloaded. {' | '.join(summary.unavailable.values())}. The cache keeps what it had; run the "
            "same command again when the network is back, it resumes"
        )
    return summary
