"""The scorecard's inputs: each asset's whole cleaned candles with the run's train / test
ranges into them, and the price baselines fitted on the train split.

`series_from_run(run_dir)` rebuilds them from a run folder (its config's candles, cleaned as
training did, and the split ranges recorded in its token folder); `series_from_prepared` from
candles prepared in memory (tests, benchmarks).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

import pandas as pd

from common.atomic import read_json
from common.config import load_config
from common.data.loading import load_market_data
from common.data.prepare import prepare_data
from common.data.universe import interval_series, pick_interval
from common.tokens.token_set import TokenSet, token_path
from common.errors import UserError
from common.evaluation.price_baselines import (ForecastFn, GarchT, HistoricalBootstrap, RandomWalkEWMA, ewma_lambda,
                                               log_returns)

__all__ = ["AssetSeries", "fit_price_baselines", "series_from_prepared", "series_from_run"]


@dataclass
class AssetSeries:
    """One asset: its whole cleaned candle frame and the run's split ranges into it."""
    symbol: str
    category: str
    candles: pd.DataFrame
    train: range
    test: range  # starts after the purge gap
    val: range = range(0)  # the validation split (after its own purge gap): common.evaluation.calibration's


def series_from_prepared(prepared) -> list[AssetSeries]:
    """AssetSeries of every kept asset of a `common.data.prepare.PreparedData`."""
    return [AssetSeries(a.symbol, a.category, prepared.candles[a.symbol], prepared.splits[a.symbol].train,
                        prepared.splits[a.symbol].test, prepared.splits[a.symbol].val) for a in prepared.assets]


def series_from_run(run_dir: str | Path, interval: Optional[str] = None) -> tuple[list[AssetSeries], str]:
    """(series, interval) of a run folder: its config's candles, cleaned as training did, with the
    split ranges the run recorded in its token set (so the test split and purge gap are the run's).
    interval: which of a run's data.intervals (None: its first); its series under their assets' symbols."""
    run_dir = Path(run_dir)
    for name in ("config.json", token_path(run_dir).name):
        if not (run_dir / name).exists():
            raise UserError(f"{run_dir}: missing {name}; pass a run folder like "
                            "case_c_crypto/checkpoints/<experiment>_YYYYMMDD_HHMMSS")
    cfg = load_config(run_dir / "config.json")
    tokens = TokenSet.load(token_path(run_dir))
    prepared = prepare_data(cfg, load_market_data(cfg, run_dir.parent.parent))
    by_symbol = {s.symbol: s for s in series_from_prepared(prepared)}
    # only a run of several intervals needs asset_info.json here (its series names and intervals)
    info = read_json(run_dir / "asset_info.json") if (run_dir / "asset_info.json").is_file() else {}
    interval, _ = pick_interval(info, cfg.data.interval, interval)
    names = interval_series(info, interval) if "series" in info else {s: s for s in tokens.symbols}
    out = []
    for symbol in (s for s in tokens.symbols if s in names):
        s = by_symbol.get(symbol)
        if s is None or len(s.candles) != len(tokens.tokens[symbol]):
            raise UserError(f"{run_dir}: the candles of {symbol} are no longer those the run was trained on "
                            "(the data cache changed since); score the run on a copy of the old cache")
        ranges = tokens.ranges[symbol]
        out.append(AssetSeries(names[symbol], s.category, s.candles, range(*ranges["train"]), range(*ranges["test"]),
                               range(*ranges["val"])))
    return out, interval


def fit_price_baselines(series: Sequence[AssetSeries], interval: str) -> dict[str, ForecastFn]:
    """The sampling baselines; GARCH sees each asset's train-split returns only."""
    lam = ewma_lambda(interval)
    train = {s.symbol: log_returns(s.candles.iloc[s.train.start:s.train.stop]) for s in series}
    return {"rw_ewma": RandomWalkEWMA(lam), "bootstrap": HistoricalBootstrap(), "garch": GarchT.fit(train, lam)}
