"""The data side of `marketgpt plan`: how many candles (= tokens) a config trains, validates and
tests on, per series, interval and category.

Exact from the config's prepared token shard when there is one (its index.json and
data_info.json: no candle read), or from the shipped sample; from the timestamps alone where the
candles are here (your files, or the parquet cache: training's own cleaning and split, asset by
asset, on every candle's timestamp with placeholder prices, so only the rows cleaning drops for
bad prices are counted too: an estimate, `marketgpt data check` counts exactly); otherwise
estimated from the universe, the dates, the interval and each market's trading hours, or from
data.synthetic (the synthetic market is not generated for a plan), and split as preparation
splits (common.data.prepare.split_data: the cut dates pooled over every series, the purge gap) with
each series' estimated candles spread evenly over its estimated span. Memory holds one asset's
timestamps, whatever the corpus' size.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Sequence

import numpy as np
import pandas as pd

from common.commands.plan_figures import DataFigures, asset_windows, epoch_windows
from common.config import Config, DataConfig, at_interval
from common.data.cache import CandleCache
from common.data.check import Row, breakdown, left_out, prepare_streamed, prepared_rows, shard_summary
from common.data.loading import load_market_data, start_bound
from common.data.market_data import LazyFrames
from common.data.prepare import SPLITS, PreparedData, prepare_data, split_data
from common.data.synthetic import synthetic_assets, synthetic_spec
from common.data.universe import EXCHANGE_UNIVERSE, Asset, load_universe, universe_as_of, universe_path
from common.data.yahoo import LOOKBACK_LIMITS, window_text
from common.markets import INTERVAL_SECONDS, interval_step, series_name

__all__ = ["MAX_ESTIMATE_START", "data_figures", "estimated_series"]

# Estimated candles per year: category -> (trading days per year, trading hours per day).
# Stock exchanges and indices trade ~252 days of ~6.5 h; FX 24 h on weekdays; crypto 24/7.
_SESSIONS: dict[str, tuple[int, float]] = {"crypto": (365, 24.0), "fx": (260, 24.0), "commodity": (252, 23.0)}
_STOCK_SESSION = (252, 6.5)
# the first candle a source can give: Binance (the cases' ccxt exchange) opened on 2017-07-14
_FIRST_CANDLE = {"ccxt": pd.Timestamp("2017-07-14", tz="UTC")}
# data.start_date = "max" in an estimate: where a Yahoo asset's first trade is taken to be (it is
# known only once downloaded; most of a stock universe trades since before then)
MAX_ESTIMATE_START = pd.Timestamp("2000-01-01", tz="UTC")


def data_figures(cfg: Config, case_dir: Path) -> DataFigures:
    """Exact counts from a prepared shard or the sample; counted from the timestamps where the
    candles are here (files, cache); else an estimate."""
    d, context = cfg.data, cfg.model.context_length
    if d.source == "sample":
        return _exact(d, context, case_dir, "exact (the shipped sample)")
    shard = shard_summary(cfg, case_dir) if d.source in ("files", "download") else None
    if shard is not None:
        return _figures(
            d, context, shard.rows, f"exact (the prepared token shard {shard.folder.name}; no candle read)", shard.info
        )
    if d.source == "files":
        return _from_times(d, context, case_dir, f"your files in {d.files_dir}")
    if d.source == "synthetic":
        return _synthetic_estimate(d, context)
    assets = _universe(d, case_dir)
    cache = CandleCache(case_dir / d.cache_dir)
    per_interval = [sum(cache.path_for(a.source, iv, a.symbol).exists() for a in assets) for iv in d.run_intervals()]
    cached = sum(per_interval)
    figures = (
        _estimate(d, context, assets)
        if min(per_interval) == 0
        else _from_times(
            d,
            context,
            case_dir,
            f"the cache: {cached} of {len(assets) * len(per_interval)} {'series' if d.intervals else 'assets'}",
        )
    )
    if d.universe == EXCHANGE_UNIVERSE:  # which of the dated files
        universe = universe_path(case_dir, d.universe, d.exchange)
        figures.basis += f"; universe {universe.name} (as of {universe_as_of(universe)})"
    figures.notes += [n for iv in d.run_intervals() for n in _yahoo_window_notes(at_interval(d, iv), assets)]
    return figures


def _yahoo_window_notes(d: DataConfig, assets: Sequence[Asset]) -> list[str]:
    """A line when Yahoo's intraday window cuts data.start_date for the config's Yahoo assets."""
    yahoo = sum(a.source == "yfinance" for a in assets)
    if not yahoo or d.interval not in LOOKBACK_LIMITS:
        return []
    end = _end(d)
    earliest = end - LOOKBACK_LIMITS[d.interval]
    start = start_bound(d.start_date)
    if start is not None and start >= earliest:
        return []
    wanted = 'the whole history (data.start_date = "max")' if start is None else d.start_date
    return [
        f"{window_text(d.interval)}: the {yahoo} Yahoo assets start about {earliest:%Y-%m-%d} instead of "
        f"{wanted}; each download adds the newest bars to the cache, so the history grows run by run"
    ]


def _end(d: DataConfig) -> pd.Timestamp:
    return pd.Timestamp(d.end_date, tz="UTC") if d.end_date else pd.Timestamp.now(tz="UTC").floor("D")


def _universe(d: DataConfig, case_dir: Path) -> list[Asset]:
    assets = load_universe(universe_path(case_dir, d.universe, d.exchange), d.universe_counts or None)
    return [a for a in assets if not d.categories or a.category in d.categories]


def _exact(d: DataConfig, context_length: int, case_dir: Path, basis: str) -> DataFigures:
    """The candles training would use: load_market_data + prepare_data (offline; the sample is small)."""
    prepared = prepare_data(d, context_length, load_market_data(d, case_dir))
    return _prepared_figures(d, context_length, prepared, basis)


def _from_times(d: DataConfig, context_length: int, case_dir: Path, where: str) -> DataFigures:
    """The candles training would use, from their timestamps alone (no price read), one asset at
    a time: exact unless cleaning drops rows for bad prices (NaN, <= 0), which are counted here."""
    market = load_market_data(d, case_dir, times_only=True)
    # no per-file cleaning report: without the prices it would be half of one (data check's job)
    prepared = prepare_streamed(d, context_length, dataclasses.replace(market, files={}))
    basis = (
        f"estimated from the timestamps in {where} (prices not read, so rows that cleaning drops for bad "
        "prices still count; `marketgpt data check` is exact)"
    )
    return _prepared_figures(d, context_length, prepared, basis)


def _prepared_figures(d: DataConfig, context_length: int, prepared: PreparedData, basis: str) -> DataFigures:
    return _figures(d, context_length, prepared_rows(prepared, d.interval, bool(d.intervals)), basis, prepared.info)


def _figures(d: DataConfig, context_length: int, rows: Sequence[Row], basis: str, info: dict) -> DataFigures:
    """Counts from the kept series' (asset, interval, category, (train, val, test) candles) rows
    and the data_info of their split (exact or estimated), which says what was left out and why."""
    window = context_length + 1
    windows = [asset_windows(r[3][0], window, d.window_stride) for r in rows]
    candles = {split: sum(r[3][i] for r in rows) for i, split in enumerate(SPLITS)}
    lines, warnings = left_out(info)
    return DataFigures(
        candles,
        sum(windows),
        epoch_windows(windows, d.epoch_stride),
        basis,
        len({r[0] for r in rows}),
        len({r[2] for r in rows}),
        by=breakdown(list(rows)),
        left_out=lines,
        warnings=warnings,
    )


def estimated_series(asset: Asset, interval: str, start: pd.Timestamp, end: pd.Timestamp) -> tuple[pd.Timestamp, int]:
    """(first candle, candles) of one asset between start and end from its market's trading calendar."""
    first = max(start, _FIRST_CANDLE.get(asset.source, start))
    if asset.source == "yfinance" and interval in LOOKBACK_LIMITS:  # Yahoo serves recent intraday only
        first = max(first, end - LOOKBACK_LIMITS[interval])
    days, hours = _SESSIONS.get(asset.category, _STOCK_SESSION)
    per_day = 1.0 if interval == "1d" else hours * 3600 / INTERVAL_SECONDS[interval]
    years = max(0.0, (end - first).total_seconds() / (365.25 * 86400))
    return first, int(years * days * per_day)


def _estimate(d: DataConfig, context_length: int, assets: Sequence[Asset]) -> DataFigures:
    start, end = start_bound(d.start_date), _end(d)
    since = d.start_date
    if start is None:  # each asset from its first candle: ccxt's since the exchange opened (_FIRST_CANDLE)
        start = MAX_ESTIMATE_START
        sources = {a.source for a in assets}
        firsts = [
            f"{source} assets from {when:%Y-%m-%d}" for source, when in _FIRST_CANDLE.items() if source in sources
        ]
        if sources - set(_FIRST_CANDLE):
            firsts.append(f"the others from {start:%Y-%m-%d}: their first trades are known once downloaded")
        since = f"max ({', '.join(firsts)})"
    series = []
    for a in assets:
        for iv in d.run_intervals():
            first, n = estimated_series(a, iv, start, end)
            series.append((a, iv, first, end, n))
    prepared = _split_estimate(d, context_length, series)
    basis = (
        f"estimated from the universe, {since} to {d.end_date or 'today'}, {', '.join(d.run_intervals())} "
        "candles and each market's trading hours (nothing cached)"
    )
    figures = _prepared_figures(d, context_length, prepared, basis)
    figures.notes += _listing_notes(assets, start)
    return figures


def _listing_notes(assets: Sequence[Asset], start: pd.Timestamp) -> list[str]:
    """A line where the estimate starts a source's assets on the exchange's opening: their own
    listing dates are not known offline (the universe files have none; the exchange gives them
    with the candles), so a pair listed later holds fewer candles than estimated."""
    notes = []
    for source, opening in _FIRST_CANDLE.items():
        count = sum(a.source == source for a in assets)
        if count and start < opening:
            notes.append(
                f"the {count} {source} pairs are estimated from {opening:%Y-%m-%d} (Binance's opening): "
                "a pair's own listing date is known only once its candles are downloaded, so a pair listed "
                "later holds fewer candles than shown; `marketgpt data download`, then `plan`, counts them"
            )
    return notes


def _split_estimate(
    d: DataConfig, context_length: int, series: Sequence[tuple[Asset, str, pd.Timestamp, pd.Timestamp, int]]
) -> PreparedData:
    """Preparation's own split (split_data: the same cut dates for every series, pooled from all
    their candles, and the purge gap) of estimated series: (asset, interval, first, last candle,
    candles), each series' candles spread evenly from its first to its last."""
    several = bool(d.intervals)
    universe: list[Asset] = []
    spans: dict[str, tuple[int, int, int]] = {}
    records: dict[str, dict] = {}
    dropped: dict[str, str] = {}
    for asset, interval, first, last, n in series:
        name = series_name(asset.symbol, interval) if several else asset.symbol
        universe.append(dataclasses.replace(asset, symbol=name))
        records[name] = {"category": asset.category, "raw_rows": n, "rows": n, "fixes": {}, "gaps_filled": 0}
        if n:
            spans[name] = (first.value, last.value, n)
        else:
            dropped[name] = "no candles in the configured date range (estimated)"

    def stamps(name: str) -> np.ndarray:  # made on each read: memory holds one series' stamps
        first, last, n = spans[name]
        return np.linspace(first, last, n, dtype=np.int64)

    frames = LazyFrames(list(spans), stamps)
    interval = d.intervals[0] if several else d.interval
    return split_data(d, context_length, universe, interval, frames, frames, records, dropped, LazyFrames([], stamps))


def _synthetic_estimate(d: DataConfig, context_length: int) -> DataFigures:
    """data.source = "synthetic" from its spec alone: candles * (1 - gap_prob) rows per asset, or
    every slot of the grid for crypto assets (training fills their gaps with empty candles)."""
    # several intervals: the market is made at the finest and aggregated (common.data.loading)
    finest = min(d.run_intervals(), key=INTERVAL_SECONDS.__getitem__)
    spec = synthetic_spec(at_interval(d, finest))
    assets = [a for a in synthetic_assets(spec) if not d.categories or a.category in d.categories]
    start = pd.Timestamp(start_bound(d.start_date) or MAX_ESTIMATE_START)
    series = []
    for iv in d.run_intervals():
        slots = -(-spec.candles * INTERVAL_SECONDS[finest] // INTERVAL_SECONDS[iv])
        last = start + (slots - 1) * interval_step(iv)
        series += [
            (a, iv, start, last, slots if a.category == "crypto" else round(slots * (1 - spec.gap_prob)))
            for a in assets
        ]
    prepared = _split_estimate(d, context_length, series)
    basis = (
        f"estimated from data.synthetic: {spec.assets} assets x {spec.candles:,} {finest} slots from "
        f"{d.start_date}, gap_prob {spec.gap_prob:g} (nothing generated)"
    )
    return _prepared_figures(d, context_length, prepared, basis)
