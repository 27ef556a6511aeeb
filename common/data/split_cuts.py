"""Where the train/val/test splits cut: the same instants for every asset, from quantiles of all
candles pooled (global_cuts, memory bounded by the days spanned), and eras: groups of assets whose
spans overlap, each split on its own dates when there are several (data_info.json's split_eras).
common.data.prepare applies the cuts."""

from __future__ import annotations

import sys
from typing import Any, Callable, Iterable, Mapping

import numpy as np
import pandas as pd

from common.config import DataConfig
from common.markets import split_series

__all__ = ["era_text", "eras_of", "global_cuts", "iso_ns", "split_cuts", "split_eras"]

_NS = 1_000_000_000


def iso_ns(ns: int) -> str:
    """A timestamp in ns as ISO 8601 in UTC."""
    return pd.Timestamp(ns, tz="UTC").isoformat()


_DAY_NS = 86_400 * _NS


def global_cuts(stamps: Callable[[], Iterable[np.ndarray]], q1: float, q2: float) -> tuple[int, int]:
    """The q1 and q2 quantiles (lower) of all candle timestamps pooled, in ns.

    stamps() yields each asset's sorted timestamps; it is walked twice, and memory stays bounded
    by the days the assets span, not by their candles or their count: add up the candles of each
    UTC day, find the day that holds each quantile, then sort only that day's candles.
    """
    first, per_day = 0, np.zeros(0, np.int64)  # per_day[i]: the candles of day first + i
    for ts in stamps():
        if not len(ts):
            continue
        d = ts // _DAY_NS
        if not len(per_day):
            first, per_day = int(d[0]), np.zeros(int(d[-1] - d[0]) + 1, np.int64)
        lo, hi = min(first, int(d[0])), max(first + len(per_day), int(d[-1]) + 1)
        if (lo, hi) != (first, first + len(per_day)):  # widen to this asset's days
            grown = np.zeros(hi - lo, np.int64)
            grown[first - lo : first - lo + len(per_day)] = per_day
            first, per_day = lo, grown
        per_day += np.bincount(d - first, minlength=len(per_day))
    day = first + np.arange(len(per_day))
    before = np.concatenate([[0], np.cumsum(per_day)])  # candles before each day
    n = int(before[-1])
    ranks = [int(np.floor(q * (n - 1))) for q in (q1, q2)]
    which = [int(np.searchsorted(before, k, side="right")) - 1 for k in ranks]  # the day of the k-th
    chosen: dict[int, list[np.ndarray]] = {i: [] for i in which}
    for ts in stamps():
        for i in chosen:
            lo, hi = np.searchsorted(ts, [day[i] * _DAY_NS, (day[i] + 1) * _DAY_NS])
            chosen[i].append(ts[lo:hi].copy())  # a copy: a view would keep the whole asset's stamps alive
    cut1, cut2 = (int(np.sort(np.concatenate(chosen[i]))[k - before[i]]) for i, k in zip(which, ranks))
    return cut1, cut2


def eras_of(spans: dict[str, tuple[int, int, int]]) -> list[list[str]]:
    """Groups of assets whose [first, last] candle spans overlap, chained; in time order.
    spans: symbol -> (first, last, candles).

    One group (the usual case): every asset is split at the same instants. Several: no asset of
    one group has a candle during another group's span, so each group can be split on its own
    dates and still no asset's test period overlaps another asset's training period.
    """
    order = sorted(spans, key=lambda s: (spans[s][0], s))
    eras: list[list[str]] = []
    end = None
    for symbol in order:
        first, last, _ = spans[symbol]
        if end is None or first > end:
            eras.append([])
            end = last
        eras[-1].append(symbol)
        end = max(end, last)
    return eras


def era_text(era: list[str], spans: dict[str, tuple[int, int, int]]) -> str:
    first = pd.Timestamp(min(spans[s][0] for s in era), tz="UTC").date()
    last = pd.Timestamp(max(spans[s][1] for s in era), tz="UTC").date()
    names = ", ".join(era[:3]) + (f" and {len(era) - 3} more" if len(era) > 3 else "")
    return f"{names}: {first} to {last}"


def split_eras(
    eras: list[list[str]],
    era_cuts: list[tuple[int, int]],
    spans: dict[str, tuple[int, int, int]],
    *,
    by_interval: bool,
) -> list[dict[str, Any]]:
    """data_info.json's split_eras: each era's symbols and cut dates (and, for eras that do not
    overlap in time, their first and last candle, with a note on stderr)."""
    if by_interval:
        return [
            {"symbols": era, "val_start": iso_ns(c1), "test_start": iso_ns(c2)} for era, (c1, c2) in zip(eras, era_cuts)
        ]
    print(
        f"note: the assets fall into {len(eras)} eras that do not overlap in time "
        f"({'; '.join(era_text(e, spans) for e in eras)}); each era is split on its own dates "
        "(split_eras in data_info.json)",
        file=sys.stderr,
    )
    return [
        {
            "symbols": era,
            "first": iso_ns(min(spans[s][0] for s in era)),
            "last": iso_ns(max(spans[s][1] for s in era)),
            "val_start": iso_ns(c1),
            "test_start": iso_ns(c2),
        }
        for era, (c1, c2) in zip(eras, era_cuts)
    ]


def split_cuts(
    d: DataConfig, spans: dict[str, tuple[int, int, int]], real_ts: Mapping[str, np.ndarray], per_interval: bool
) -> tuple[list[list[str]], list[tuple[int, int]]]:
    """The eras and each era's (val start, test start) cuts; per_interval: each interval's series
    are grouped into eras of their own, as in a one-interval run."""
    if per_interval:
        groups: dict[str, dict] = {}
        for s, span in spans.items():
            groups.setdefault(split_series(s)[1], {})[s] = span
        eras = [era for iv in d.intervals if iv in groups for era in eras_of(groups[iv])]
    else:
        eras = eras_of(spans)

    def era_stamps(era: list[str]) -> Callable[[], Iterable[np.ndarray]]:
        return lambda: (real_ts[s] for s in era)

    era_cuts = [global_cuts(era_stamps(era), d.train_ratio, d.train_ratio + d.val_ratio) for era in eras]
    return eras, era_cuts
