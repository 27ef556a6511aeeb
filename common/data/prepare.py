"""Split every cleaned asset by time (the cleaning itself: common.data.cleaning; where the cuts fall:
common.data.split_cuts).

    raw frames ──clean_candles──► valid candles ──fill_gaps (crypto)──► regular grid
        ──► global cut timestamps (quantiles of all candles) ──► per-asset index ranges

The split cuts are the same calendar instants for every asset, so no asset's test period
overlaps another asset's training period. Assets in eras that overlap no other asset's (the
shipped hourly sample: BTC 2021, EURUSD 2017) are split on their own era's dates, recorded as
split_eras in data_info.json. A purge gap of at least one context length is left
out at the start of val and of test, so no training window touches a val or test window; the
val and test windows read their context from that gap (common.training.batches), so those
splits need only EVAL_MIN_CANDLES candles, not a whole window.
Splits are integer ranges into each asset's cleaned frame; the token arrays align with it.
With several intervals (data.intervals), a split that leaves an interval without training,
validation or test windows is refused, naming the fix (docs/data.md, several intervals in one model).
Everything here is vectorized per asset: case A (600 assets x 5000 candles) takes about a second.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Mapping

import numpy as np
import pandas as pd

from common.config import DataConfig
from common.data.cleaning import FIX_KINDS, clean_asset, real_rows
from common.data.market_data import MarketData
from common.data.split_cuts import iso_ns, split_cuts, split_eras
from common.data.universe import Asset
from common.errors import UserError
from common.markets import interval_step, split_series

__all__ = [
    "EVAL_MIN_CANDLES",
    "AssetSplit",
    "PreparedData",
    "drop_kind",
    "lost_text",
    "prepare_data",
    "short_intervals_error",
    "split_data",
]

SPLITS = ("train", "val", "test")
# Candles a val or test split needs after its purge gap to be scored: the trainer's val windows
# take their context from the gap (one candle is a target), the test evaluation predicts each test
# candle from the test candles before it (common.evaluation.token_scoring: the first is context).
EVAL_MIN_CANDLES = {"val": 1, "test": 2}


@dataclass(frozen=True)
class AssetSplit:
    """Index ranges into one asset's cleaned frame; purged candles belong to no range."""

    train: range
    val: range
    test: range
    short: tuple[str, ...] = ()  # splits (val, test) with fewer than EVAL_MIN_CANDLES: no windows there


@dataclass
class PreparedData:
    assets: list[Asset]  # the kept assets, in universe order
    candles: Mapping[str, pd.DataFrame]  # symbol -> cleaned frame (crypto gaps are NaN rows)
    splits: dict[str, AssetSplit]
    # val starts at cuts[0], test at cuts[1] (UTC); with several eras, those of the one with most candles
    cuts: tuple[pd.Timestamp, pd.Timestamp]
    purge_gap: int
    dropped: dict[str, str]  # symbol -> why it was left out
    interval: str
    info: dict[str, Any]  # JSON-ready: data_info.json


# --------------------------------------------------------------------------- splitting


def prepare_data(d: DataConfig, context_length: int, market: MarketData) -> PreparedData:
    """Clean every asset, split all of them at the same instants, and record what was done;
    context_length (model.context_length) sets the windows and the default purge gap."""
    cleaned: dict[str, pd.DataFrame] = {}
    real_ts: dict[str, np.ndarray] = {}  # valid candles only: gap rows do not move the cuts
    records: dict[str, dict[str, Any]] = {}
    dropped: dict[str, str] = {}
    for asset in market.assets:
        step = interval_step(market.interval_of(asset.symbol))  # a series' own interval (data.intervals)
        frame, records[asset.symbol], why = clean_asset(
            asset,
            market.candles[asset.symbol],
            step,
            reader_fixes=market.fixes.get(asset.symbol),
            file=market.files.get(asset.symbol),
        )
        if frame is None:
            assert why is not None  # clean_asset gives the reason with every dropped asset
            dropped[asset.symbol] = why
            continue
        cleaned[asset.symbol] = frame
        real_ts[asset.symbol] = frame.index.asi8[real_rows(frame)]
    stamps = {s: f.index.asi8 for s, f in cleaned.items()}
    return split_data(d, context_length, market.assets, market.interval, stamps, real_ts, records, dropped, cleaned)


def split_data(
    d: DataConfig,
    context_length: int,
    universe: list[Asset],
    interval: str,
    stamps: Mapping[str, np.ndarray],
    real_ts: Mapping[str, np.ndarray],
    records: dict[str, dict[str, Any]],
    dropped: dict[str, str],
    candles: Mapping[str, pd.DataFrame],
) -> PreparedData:
    """Split the cleaned assets at the same instants, from their timestamps alone.

    universe: every asset asked for, in order; stamps / real_ts: symbol -> the timestamps of each
    cleaned asset's rows / real candles; records, dropped: from clean_asset (dropped grows here);
    candles: symbol -> cleaned frame, kept as given (a dict, or frames read from disk on access).
    """
    window = context_length + 1  # a training window: context inputs plus the next-token target
    purge = d.purge_gap or context_length
    if not stamps:
        raise UserError(
            f"none of the {len(universe)} assets has a valid candle; check the data "
            f"source ({d.source}) and interval ({interval})"
        )
    spans = {s: (int(ts[0]), int(ts[-1]), len(ts)) for s, ts in ((s, real_ts[s]) for s in real_ts)}
    per_interval = bool(d.intervals) and d.interval_split == "per_interval"
    eras, era_cuts = split_cuts(d, spans, real_ts, per_interval)
    cut_of = {s: cuts for era, cuts in zip(eras, era_cuts) for s in era}
    main = max(range(len(eras)), key=lambda i: sum(spans[s][2] for s in eras[i]))  # most candles
    splits = _split_all(stamps, cut_of, purge, window, records, dropped)
    cut1, cut2 = era_cuts[main]
    if not splits:
        raise _too_short(stamps, context_length, cut1)
    lost = _lost_intervals(d.intervals, universe, splits)
    if lost:
        raise _intervals_error(d, context_length, lost, universe, stamps, real_ts, spans, era_cuts[main], per_interval)

    kept = [a for a in universe if a.symbol in splits]
    info = _info(d, context_length, interval, universe, kept, records, dropped, cut1, cut2, purge)
    if len(eras) > 1:
        info["split_eras"] = split_eras(eras, era_cuts, spans, by_interval=d.interval_split == "per_interval")
    return PreparedData(
        assets=kept,
        candles=candles if not isinstance(candles, dict) else {a.symbol: candles[a.symbol] for a in kept},
        splits={a.symbol: splits[a.symbol] for a in kept},
        cuts=(pd.Timestamp(cut1, tz="UTC"), pd.Timestamp(cut2, tz="UTC")),
        purge_gap=purge,
        dropped={a.symbol: dropped[a.symbol] for a in universe if a.symbol in dropped},
        interval=interval,
        info=info,
    )


def _lost_intervals(
    intervals: Iterable[str], universe: list[Asset], splits: Mapping[str, AssetSplit]
) -> dict[str, list[str]]:
    """interval -> the splits ("train", "val", "test") in which none of its series has a window.

    A run of several intervals that silently trained, validated or tested without one of them
    would report on fewer intervals than it was asked for."""
    lost = {}
    for interval in intervals:
        mine = [splits[a.symbol] for a in universe if a.symbol in splits and split_series(a.symbol)[1] == interval]
        lacks = ["train"] if not mine else [name for name in ("val", "test") if all(name in s.short for s in mine)]
        if lacks:
            lost[interval] = lacks
    return lost


_SPLIT_WORDS = {"train": "training", "val": "validation", "test": "test"}


def lost_text(interval: str, lacks: list[str], about: str) -> str:
    """'interval 4h would get no validation or test windows (<about>)': one interval's part of the error."""
    return f"interval {interval} would get no {' or '.join(_SPLIT_WORDS[n] for n in lacks)} windows ({about})"


def short_intervals_error(texts: list[str], intervals: Iterable[str], context: int, purge: int) -> UserError:
    """The error for intervals whose series are too short for a window in some split, whatever the cuts."""
    return UserError(
        f"{'; '.join(texts)}: training needs context_length + 1 = {context + 1} candles before the "
        f"train/val cut, validation at least {EVAL_MIN_CANDLES['val']} and test {EVAL_MIN_CANDLES['test']} "
        f"after their purge gap of {purge}; lower model.context_length, use longer histories (earlier "
        f"data.start_date), or leave {', '.join(intervals)} out of data.intervals"
    )


def _intervals_error(
    d: DataConfig,
    context: int,
    lost: dict[str, list[str]],
    universe: list[Asset],
    stamps: Mapping[str, np.ndarray],
    real_ts: Mapping[str, np.ndarray],
    spans: dict[str, tuple[int, int, int]],
    cuts: tuple[int, int],
    per_interval: bool,
) -> UserError:
    """The one-line error for intervals left without training, validation or test windows, with
    the fix: per_interval cuts where they give every lost interval its windows, else more candles."""
    purge = d.purge_gap or context
    for interval in lost:
        if not any(split_series(s)[1] == interval for s in spans):  # no split setting can help
            return UserError(
                f'interval {interval}: none of its series has a valid candle (see "dropped" in '
                f"data_info.json); check the data source ({d.source}) or leave {interval} "
                "out of data.intervals"
            )
    fixed = False
    if not per_interval:  # would each interval's own dates give it its windows?
        eras, era_cuts = split_cuts(d, spans, real_ts, True)
        cut_of = {s: c for era, c in zip(eras, era_cuts) for s in era}
        alone = _split_all(stamps, cut_of, purge, context + 1, {s: {} for s in stamps}, {})
        fixed = not _lost_intervals(lost, universe, alone)
    texts = []
    for interval, lacks in lost.items():
        mine = [s for s in spans if split_series(s)[1] == interval]
        first = pd.Timestamp(min(spans[s][0] for s in mine), tz="UTC").date()
        last = pd.Timestamp(max(spans[s][1] for s in mine), tz="UTC").date()
        texts.append(
            lost_text(
                interval,
                lacks,
                f"its {len(mine)} series: {first} to {last}, longest {max(spans[s][2] for s in mine):,} candles",
            )
        )
    if fixed:
        return UserError(
            f"{'; '.join(texts)} under data.interval_split 'pooled' (cuts {iso_ns(cuts[0])[:10]} and "
            f"{iso_ns(cuts[1])[:10]}, shared by every interval): split each interval on its own dates "
            "with --set data.interval_split=per_interval (docs/data.md, several intervals in one model)"
        )
    return short_intervals_error(texts, lost, context, purge)


def _split_all(
    stamps: Mapping[str, np.ndarray],
    cut_of: dict[str, tuple[int, int]],
    purge: int,
    window: int,
    records: dict[str, dict[str, Any]],
    dropped: dict[str, str],
) -> dict[str, AssetSplit]:
    """Each asset's train/val/test rows at its era's cuts, with `purge` rows left out after each cut;
    an asset with less than a window before its first cut goes to `dropped`."""
    splits: dict[str, AssetSplit] = {}
    for symbol in stamps:
        ts = stamps[symbol]
        n = len(ts)
        c1, c2 = cut_of[symbol]
        i1, i2 = (int(i) for i in np.searchsorted(ts, [c1, c2], side="left"))
        split = AssetSplit(train=range(0, i1), val=range(min(i1 + purge, i2), i2), test=range(min(i2 + purge, n), n))
        if len(split.train) < window:
            dropped[symbol] = (
                f"{len(split.train)} candles before the train/val cut {iso_ns(c1)} "
                f"(of {n}); a training window needs context_length + 1 = {window}"
            )
            continue
        short = tuple(name for name in ("val", "test") if len(getattr(split, name)) < EVAL_MIN_CANDLES[name])
        splits[symbol] = AssetSplit(split.train, split.val, split.test, short)
        record = records[symbol]
        record.update({name: len(getattr(split, name)) for name in SPLITS})
        record["no_windows_in"] = list(short)
    return splits


def drop_kind(reason: str, window: int) -> str:
    """One asset's reason in `dropped` (as clean_asset and _split_all write it) in the words of the
    summaries that count assets per reason; an unknown reason is its own kind."""
    if "before the train/val cut" in reason:
        return f"fewer than context_length + 1 = {window} candles before the train/val cut"
    if reason.startswith("no valid candles"):
        return "no valid candles after cleaning"
    if reason.startswith("no candles"):
        return "no candles (not in the cache, or none in the date range)"
    return reason


def _too_short(stamps: Mapping[str, np.ndarray], context: int, cut1: int) -> UserError:
    """The error when no asset has a training window before the train/val cut."""
    window = context + 1
    longest = max(len(ts) for ts in stamps.values())
    longest_train = max(int(np.searchsorted(ts, cut1)) for ts in stamps.values())
    return UserError(
        f"context length {context} is longer than any asset's history (longest: {longest} candles, "
        f"of which {longest_train} fall before the train/val cut {iso_ns(cut1)}; a training window "
        f"needs {window}): lower model.context_length to at most {max(longest_train - 1, 1)} "
        "(e.g. --set model.context_length=...) or use a longer history (earlier data.start_date)"
    )


def _info(
    d: DataConfig,
    context: int,
    interval: str,
    universe: list[Asset],
    kept: list[Asset],
    records: dict[str, dict[str, Any]],
    dropped: dict[str, str],
    cut1: int,
    cut2: int,
    purge: int,
) -> dict[str, Any]:
    kept_records = {a.symbol: records[a.symbol] for a in kept}
    totals: dict[str, Any] = {
        "raw_rows": sum(r["raw_rows"] for r in kept_records.values()),
        "rows": sum(r["rows"] for r in kept_records.values()),
        "fixes": {
            k: sum(r["fixes"].get(k, 0) for r in kept_records.values())
            for k in dict.fromkeys([*FIX_KINDS, *(k for r in kept_records.values() for k in r["fixes"])])
        },
        "gaps_filled": sum(r["gaps_filled"] for r in kept_records.values()),
    }
    totals.update({name: sum(r[name] for r in kept_records.values()) for name in SPLITS})
    return {
        "source": d.source,
        "interval": interval,
        **({"intervals": list(d.intervals)} if d.intervals else {}),
        "context_length": context,
        "purge_gap": purge,
        "ratios": {"train": d.train_ratio, "val": d.val_ratio, "test": d.test_ratio},
        "split_cuts": {"val_start": iso_ns(cut1), "test_start": iso_ns(cut2)},
        "num_assets": len(kept),
        "num_dropped": len(dropped),
        "totals": totals,
        "assets": kept_records,
        "dropped": [
            {"symbol": s, "reason": dropped[s], **records[s]} for s in (a.symbol for a in universe) if s in dropped
        ],
    }
