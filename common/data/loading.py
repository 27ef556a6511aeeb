"""One entry point for candles: the shipped sample or the case's downloaded cache.

Training calls `load_market_data(cfg.data, case_dir)` and never cares where the candles came from;
the config's data.source picks. Nothing here touches the network: "download" reads only what
`marketgpt data download` already put in the cache, and says so when it is not there.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Mapping

import numpy as np
import pandas as pd

from common.config import DataConfig, at_interval
from common.config.checks import START_MAX
from common.data.cache import CandleCache
from common.data.cleaning import COLUMNS
from common.data.files import FILES_UNIVERSE, files_root, load_files
from common.data.market_data import LazyFrames, MarketData
from common.data.sample import load_sample, sample_assets, sample_file
from common.data.synthetic import aggregate, generate_asset, synthetic_assets, synthetic_spec
from common.data.universe import EXCHANGE_UNIVERSE, Asset, load_universe, universe_as_of, universe_path
from common.errors import UserError
from common.markets import INTERVAL_SECONDS, series_name
from common.paths import REPO_ROOT

__all__ = ["MarketData", "input_files", "load_market_data", "placeholder_frame", "start_bound"]


def start_bound(start_date: str) -> pd.Timestamp | None:
    """data.start_date as a UTC timestamp; None for "max" (each asset's whole history: no lower bound)."""
    return None if start_date == START_MAX else pd.Timestamp(start_date, tz="UTC")


def load_market_data(d: DataConfig, case_dir: Path, times_only: bool = False) -> MarketData:
    """Candles for every asset of the case, as canonical frames keyed by symbol.

    "sample": the real sample inside the package, at data.interval, whole (the date range
    of the config does not apply to it). "download": the case universe read from the parquet
    cache, cut to [data.start_date, data.end_date) (no lower bound when data.start_date is
    "max"). "files": the user's CSV or parquet files in data.files_dir, whole
    (common.data.files). "synthetic": the market of data.synthetic from data.start_date
    (common.data.synthetic), each asset's candles made when they are looked up.
    data.categories keeps only those categories. data.intervals: one series per asset and
    interval, named symbol@interval (_load_series).
    """
    case_dir = Path(case_dir)
    if d.intervals:
        return _load_series(d, case_dir, times_only)
    if d.source == "sample":
        market = _load_sample(d.interval)
    elif d.source == "download":
        market = _load_cache(d, case_dir, times_only)
    elif d.source == "files":
        market = load_files(d, case_dir, times_only)
    elif d.source == "synthetic":
        market = _load_synthetic(d)
    else:
        raise UserError(f"data.source = {d.source!r}: expected 'sample', 'download', 'files' or 'synthetic'")
    return _only_categories(market, d.categories)


def input_files(d: DataConfig, case_dir: Path) -> list[Path]:
    """The files load_market_data reads for this config (those that exist), in a fixed order: a
    change to any of them (size or time stamp) means the candles may have changed."""
    case_dir = Path(case_dir)
    if d.source == "sample":
        return [sample_file()]
    if d.intervals:  # every interval's files, once each
        return list(dict.fromkeys(p for iv in d.intervals for p in input_files(at_interval(d, iv), case_dir)))
    if d.source == "download":
        cache = CandleCache(case_dir / d.cache_dir)
        universe = universe_path(case_dir, d.universe, d.exchange)
        paths = [
            cache.path_for(a.source, d.interval, a.symbol)
            for a in _in_categories(load_universe(universe, d.universe_counts or None), d.categories)
        ]
        return [universe, *(p for p in paths if p.is_file())]
    if d.source == "files" and d.files_dir:
        root = files_root(d, case_dir)
        found = sorted(p for p in root.rglob("*") if p.is_file()) if root.is_dir() else [root]
        listed = [] if d.universe == FILES_UNIVERSE else [case_dir / d.universe]
        return [*listed, *(p for p in found if p.is_file())]
    return []  # "synthetic": the config alone decides the candles


def _in_categories(assets: list, categories: list[str]) -> list:
    """The assets of `categories` ([] keeps all); a UserError for a category with none."""
    if not categories:
        return assets
    have = sorted({a.category for a in assets})
    empty = [c for c in categories if c not in have]
    if empty:
        raise UserError(
            f"data.categories = {categories}: no asset of {', '.join(empty)} in this universe "
            f"(it has {', '.join(have)})"
        )
    return [a for a in assets if a.category in categories]


def _only_categories(market: MarketData, categories: list[str]) -> MarketData:
    """data.categories: keep those categories' assets (fine-tuning per market); [] keeps all."""
    if not categories:
        return market
    kept = _in_categories(market.assets, categories)
    if len(kept) == len(market.assets):  # nothing to leave out: a lazy mapping stays lazy
        return market
    symbols = {a.symbol for a in kept}
    return MarketData(
        assets=kept,
        candles=_only(market.candles, symbols),
        interval=market.interval,
        fixes=_only(market.fixes, symbols),
        files=_only(market.files, symbols),
    )


def _only(mapping: Mapping, symbols: set[str]) -> Mapping:
    """The entries of `symbols`; a lazy mapping stays lazy (the files source reads nothing here)."""
    if isinstance(mapping, LazyFrames):
        return mapping.only(symbols)
    return {s: v for s, v in mapping.items() if s in symbols}


def _load_series(d: DataConfig, case_dir: Path, times_only: bool = False) -> MarketData:
    """data.intervals: one series per asset and interval (common.markets.series_name), asset-major,
    each read at its own interval as a one-interval run would read it; the synthetic market is
    made once, at its finest interval, and aggregated to the others (common.data.synthetic.aggregate)."""
    intervals = d.intervals
    if d.source == "synthetic":
        finest = min(intervals, key=INTERVAL_SECONDS.__getitem__)
        base = load_market_data(at_interval(d, finest), case_dir)
        markets = {iv: base for iv in intervals}
    else:
        markets = {iv: load_market_data(at_interval(d, iv), case_dir, times_only) for iv in intervals}
    assets, where = [], {}
    for asset in dict.fromkeys(a for m in markets.values() for a in m.assets):
        for iv in intervals:
            if asset.symbol in markets[iv].candles:
                name = series_name(asset.symbol, iv)
                assets.append(Asset(name, asset.source, asset.category, asset.name))
                where[name] = (iv, asset.symbol)

    def read(name: str) -> pd.DataFrame:
        iv, symbol = where[name]
        frame = markets[iv].candles[symbol]
        return aggregate(frame, iv) if d.source == "synthetic" and iv != finest else frame

    def fixes(name: str) -> dict[str, int]:  # looked up after the series' candles: lazy for the files source
        iv, symbol = where[name]
        return markets[iv].fixes.get(symbol) or {}

    names = [a.symbol for a in assets]
    return MarketData(
        assets=assets,
        candles=LazyFrames(names, read),
        interval=intervals[0],
        fixes=LazyFrames(names, fixes),
        series_intervals={name: iv for name, (iv, _) in where.items()},
    )


def _load_sample(interval: str) -> MarketData:
    assets = sample_assets(interval)  # a UserError naming the sample's intervals if it lacks this one
    frames = load_sample(interval)
    return MarketData(assets=assets, candles={a.symbol: frames[a.symbol] for a in assets}, interval=interval)


def _load_synthetic(d: DataConfig) -> MarketData:
    spec = synthetic_spec(d)
    # data.categories first, as for the cache: the lazy candles then hold the kept assets only
    assets = _in_categories(synthetic_assets(spec), d.categories)
    index = {spec.symbol(i): i for i in range(spec.assets)}
    candles = LazyFrames([a.symbol for a in assets], lambda symbol: generate_asset(spec, index[symbol]).candles)
    return MarketData(assets=assets, candles=candles, interval=spec.interval)


def _load_cache(d: DataConfig, case_dir: Path, times_only: bool = False) -> MarketData:
    # data.categories first: a per-market run of case A reads its own markets' files, not all 600
    universe = universe_path(case_dir, d.universe, d.exchange)
    if d.universe == EXCHANGE_UNIVERSE:  # say which of the dated files this run reads
        print(
            f"data.universe = 'exchange': {universe.name}, the newest for {d.exchange} (as of "
            f"{universe_as_of(universe)})",
            file=sys.stderr,
        )
    assets = _in_categories(load_universe(universe, d.universe_counts or None), d.categories)
    cache_root = case_dir / d.cache_dir
    cache = CandleCache(cache_root)
    start = start_bound(d.start_date)
    end = pd.Timestamp(d.end_date, tz="UTC") if d.end_date else None

    def read(symbol: str) -> pd.DataFrame:
        if times_only:
            times = cache.read_times(source_of[symbol], d.interval, symbol)
            frame = None if times is None else placeholder_frame(times)
        else:
            frame = cache.read(source_of[symbol], d.interval, symbol)
        if frame is None:  # a file that vanished since the check below: no candles, dropped later
            return _EMPTY.copy()
        # The index is sorted (cache contract), so two binary searches cut the date range.
        lo = frame.index.searchsorted(start, side="left") if start is not None else 0
        hi = frame.index.searchsorted(end, side="left") if end is not None else len(frame)
        return frame.iloc[lo:hi]

    # each asset is read when training's preparation reaches it, so memory holds one at a time
    source_of = {a.symbol: a.source for a in assets}
    missing = [a.symbol for a in assets if not cache.path_for(a.source, d.interval, a.symbol).is_file()]
    if missing:
        command = f"marketgpt data download --case {_case_arg(case_dir)}"
        if len(missing) == len(assets):
            raise UserError(
                f"no {d.interval} candles in the cache {cache_root} for the "
                f"{len(assets)} assets of {universe}: run `{command}` first "
                "(needs network), or set data.source to 'sample' to train on the shipped sample"
            )
        # A few tickers that failed to download (delisted, renamed) should not cost a queued
        # job: train on the rest, say so, and record them as dropped in data_info.json.
        shown = ", ".join(missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
        print(
            f"warning: {len(missing)} of {len(assets)} assets have no {d.interval} candles in the cache "
            f"{cache_root} ({shown}) and are left out; run `{command}` to fetch them, or replace "
            f"them in {universe} if the download reports them as failed",
            file=sys.stderr,
        )
    return MarketData(assets=assets, candles=LazyFrames([a.symbol for a in assets], read), interval=d.interval)


def placeholder_frame(index: pd.DatetimeIndex) -> pd.DataFrame:
    """Candles at these timestamps, every price and volume 1.0: a frame for counting, not for training."""
    return pd.DataFrame(np.ones((len(index), len(COLUMNS))), index=index, columns=list(COLUMNS))


_EMPTY = pd.DataFrame(
    {c: pd.Series(dtype="float64") for c in ("open", "high", "low", "close", "volume")},
    index=pd.DatetimeIndex([], tz="UTC", name="timestamp"),
)


def _case_arg(case_dir: Path) -> str:
    """The shortest --case value that finds this folder: its name for the repo's own cases."""
    resolved = case_dir.resolve()
    return resolved.name if resolved == REPO_ROOT / resolved.name else str(case_dir)
