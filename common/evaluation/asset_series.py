"""The scorecard's inputs: each asset's whole cleaned candles with the run's train / test
ranges into them, and the price baselines fitted on the train split.

`series_from_run(run_dir)` rebuilds them from a run folder (its config's candles, cleaned as
training did, and the split ranges recorded in its token folder); `series_from_prepared` from
candles prepared in memory (tests, benchmarks).

A run's series read their candles when asked (`LazyCandles`), keeping the last assets read up to
2M candles in all (about 100 MB): a rank scoring a 10^8-candle corpus holds some assets' candles
rather than all of them (about 50 bytes a candle: 5 GB at 10^8), and a smaller corpus is read once
however many passes the scorecard makes over its assets (origins, fits, forecasts, factors).
"""

from __future__ import annotations

import contextlib
import io
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Optional, Sequence

import numpy as np
import pandas as pd

from common.config import load_config
from common.data.cleaning import clean_asset
from common.data.loading import load_market_data
from common.data.market_data import MarketData
from common.data.universe import Asset
from common.errors import UserError
from common.evaluation.har_baselines import HarFit
from common.evaluation.price_baselines import (
    ForecastFn,
    GarchT,
    HistoricalBootstrap,
    RandomWalkEWMA,
    ewma_lambda,
    log_returns,
)
from common.markets import interval_step
from common.run.files import ASSET_INFO_JSON, CONFIG_JSON
from common.tokens.ids import RunInfo
from common.tokens.token_set import TokenSet, token_path

__all__ = ["AssetSeries", "LazyCandles", "fit_price_baselines", "series_from_prepared", "series_from_run"]


@dataclass
class AssetSeries:
    """One asset: its whole cleaned candle frame and the run's split ranges into it."""

    symbol: str
    category: str
    candles: pd.DataFrame  # or LazyCandles, which reads them when used
    train: range
    test: range  # starts after the purge gap
    val: range = range(0)  # the validation split (after its own purge gap): common.evaluation.calibration's


def series_from_prepared(prepared) -> list[AssetSeries]:
    """AssetSeries of every kept asset of a `common.data.prepare.PreparedData`."""
    return [
        AssetSeries(
            a.symbol,
            a.category,
            prepared.candles[a.symbol],
            prepared.splits[a.symbol].train,
            prepared.splits[a.symbol].test,
            prepared.splits[a.symbol].val,
        )
        for a in prepared.assets
    ]


class LazyCandles:
    """One asset's candle frame, made by `load()` each time it is used unless it is among the
    frames its group used last (`recent`, shared by a run's series), which are kept up to
    `KEPT_ROWS` candles in all (the last one always). It stands in for the frame: `.iloc`,
    `["close"]`, `.index` and `len()` are the frame's (`rows`, when known, is its length without
    reading it)."""

    KEPT_ROWS = 2_000_000

    def __init__(
        self,
        key: str,
        load: Callable[[], pd.DataFrame],
        recent: "OrderedDict[str, pd.DataFrame]",
        rows: Optional[int] = None,
    ) -> None:
        self._key, self._load, self._recent, self._rows = key, load, recent, rows

    def frame(self) -> pd.DataFrame:
        if self._key in self._recent:
            self._recent.move_to_end(self._key)
            return self._recent[self._key]
        frame = self._load()
        self._recent[self._key] = frame
        kept = sum(len(f) for f in self._recent.values())
        while len(self._recent) > 1 and kept > self.KEPT_ROWS:
            kept -= len(self._recent.popitem(last=False)[1])
        return frame

    def __getattr__(self, name: str) -> Any:  # .iloc, .index, .columns, ...: the frame's
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self.frame(), name)

    def __getitem__(self, key: Any) -> Any:
        return self.frame()[key]

    def __len__(self) -> int:
        return self._rows if self._rows is not None else len(self.frame())


def _cleaned(market: MarketData, asset: Asset, rows: int, run_dir: Path) -> Callable[[], pd.DataFrame]:
    """A loader of one series' candles cleaned as training did, checked against the run's tokens."""
    symbol = asset.symbol

    def load() -> pd.DataFrame:
        with contextlib.redirect_stderr(io.StringIO()):  # the cleaning's notes: training printed them
            frame, _, _ = clean_asset(
                asset,
                market.candles[symbol],
                interval_step(market.interval_of(symbol)),
                reader_fixes=market.fixes.get(symbol),
                file=market.files.get(symbol),
            )
        if frame is None or len(frame) != rows:
            raise UserError(
                f"{run_dir}: the candles of {symbol} are no longer those the run was trained on "
                "(the data cache changed since); score the run on a copy of the old cache"
            )
        return frame

    return load


def series_from_run(run_dir: str | Path, interval: Optional[str] = None) -> tuple[list[AssetSeries], str]:
    """(series, interval) of a run folder: its config's candles, cleaned as training did (read
    when used, LazyCandles), with the split ranges the run recorded in its token set (so the
    test split and purge gap are the run's).
    interval: which of a run's data.intervals (None: its first); its series under their assets' symbols."""
    run_dir = Path(run_dir)
    for name in (CONFIG_JSON, token_path(run_dir).name):
        if not (run_dir / name).exists():
            raise UserError(
                f"{run_dir}: missing {name}; pass a run folder like "
                "case_c_crypto/checkpoints/<experiment>_YYYYMMDD_HHMMSS"
            )
    cfg = load_config(run_dir / CONFIG_JSON)
    tokens = TokenSet.load(token_path(run_dir))
    market = load_market_data(cfg.data, run_dir.parent.parent)
    assets = {a.symbol: a for a in market.assets}
    # only a run of several intervals needs asset_info.json here (its series names and intervals)
    info = RunInfo.read(run_dir / ASSET_INFO_JSON) if (run_dir / ASSET_INFO_JSON).is_file() else RunInfo((), {})
    interval, _ = info.interval(cfg.data.interval, interval)
    names = info.interval_series(interval) if info.intervals else {s: s for s in tokens.symbols}
    out: list[AssetSeries] = []
    recent: OrderedDict[str, pd.DataFrame] = OrderedDict()
    for symbol in (s for s in tokens.symbols if s in names):
        if symbol not in assets:
            raise UserError(
                f"{run_dir}: {symbol} is no longer in the data the run was trained on "
                "(the data cache changed since); score the run on a copy of the old cache"
            )
        ranges, rows = tokens.ranges[symbol], len(tokens.tokens[symbol])
        candles = LazyCandles(symbol, _cleaned(market, assets[symbol], rows, run_dir), recent, rows)
        out.append(
            AssetSeries(
                names[symbol],
                assets[symbol].category,
                candles,
                range(*ranges["train"]),
                range(*ranges["test"]),
                range(*ranges["val"]),
            )
        )
    return out, interval


def fit_price_baselines(series: Sequence[AssetSeries], interval: str) -> dict[str, ForecastFn]:
    """The sampling baselines; GARCH and the HAR family see each asset's train split only."""
    lam = ewma_lambda(interval)
    har = HarFit(interval)

    def train_returns() -> Iterator[tuple[str, np.ndarray]]:  # one asset at a time, its candles read once
        for s in series:
            train = s.candles.iloc[s.train.start : s.train.stop]
            har.add(s.symbol, train)
            yield s.symbol, log_returns(train)

    garch = GarchT.fit(train_returns(), lam)
    return {"rw_ewma": RandomWalkEWMA(lam), "bootstrap": HistoricalBootstrap(), "garch": garch, **har.baselines()}
