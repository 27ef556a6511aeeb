"""What a run knows of its universe: asset_info.json as a type.

A run's model embeds each asset, each category and (in a run of several intervals) each
interval by id. `RunInfo` holds those ids and the series a run's token set is made of; it is
written to the run folder as asset_info.json and read back by everything that opens a run
(training, resume, forecasting, evaluation, export, fine-tuning). The JSON is the one runs have
always written, key for key, so every run folder made before this type still opens:

    {"assets": [{"id", "symbol", "source", "category", "category_id", "name"}, ...],
     "symbols": {symbol: id}, "categories": {category: id}, "num_assets", "num_categories",
     "intervals": [...], "series": {"SYM@1h": {"symbol", "interval"}},   (these two: several intervals)
     "peers": {series: its peer series}}   (model.market_peer, common.tokens.market_context.fit_peers)

Asset ids follow the universe's order; category ids follow common.markets.CATEGORIES restricted
to the categories present, so the same universe always maps to the same ids. The interval a
forecast or an evaluation reads is resolved here (`RunInfo.interval`), for every caller.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

from common.atomic import read_json
from common.data.universe import Asset
from common.errors import UserError
from common.markets import CATEGORIES, series_name, split_series

__all__ = ["AssetRecord", "RunInfo"]


@dataclass(frozen=True)
class AssetRecord:
    """One asset of a run: its ids in the model's embeddings and where its candles come from."""

    id: int
    symbol: str
    source: str
    category: str
    category_id: int
    name: str


@dataclass(frozen=True)
class RunInfo:
    """asset_info.json: the assets (ids in order), the category ids and, for a run of several
    intervals, its intervals (id = position) and series (name -> (symbol, interval))."""

    assets: tuple[AssetRecord, ...]
    categories: dict[str, int]
    intervals: tuple[str, ...] = ()
    series: dict[str, tuple[str, str]] = field(default_factory=dict)
    peers: dict[str, str] = field(default_factory=dict)  # series -> its peer series (model.market_peer)

    @classmethod
    def of_assets(cls, assets: Sequence[Asset], intervals: Sequence[str] = ()) -> "RunInfo":
        """The ids of a run on `assets`; intervals: data.intervals of a run of several, whose
        `assets` are then its series (symbol@interval): one record (and one embedding) per asset
        for all its intervals, in order of first appearance."""
        series = {a.symbol: split_series(a.symbol) for a in assets} if intervals else {}
        if intervals:
            first: dict[str, Asset] = {}
            for a in assets:
                symbol = series[a.symbol][0]
                first.setdefault(symbol, Asset(symbol, a.source, a.category, a.name))
            assets = list(first.values())
        dupes = sorted(s for s, n in Counter(a.symbol for a in assets).items() if n > 1)
        if dupes:
            raise ValueError(f"duplicate symbols in the asset list: {', '.join(dupes)}")
        unknown = sorted({a.category for a in assets} - set(CATEGORIES))
        if unknown:
            raise ValueError(f"unknown categories in the asset list: {', '.join(unknown)}")
        present = {a.category for a in assets}
        categories = {c: i for i, c in enumerate(c for c in CATEGORIES if c in present)}
        records = tuple(
            AssetRecord(i, a.symbol, a.source, a.category, categories[a.category], a.name) for i, a in enumerate(assets)
        )
        return cls(records, categories, tuple(intervals), series)

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> "RunInfo":
        """From asset_info.json's content; a KeyError, TypeError or ValueError where it is not one."""
        records = tuple(
            AssetRecord(
                int(r["id"]),
                str(r["symbol"]),
                str(r["source"]),
                str(r["category"]),
                int(r["category_id"]),
                str(r["name"]),
            )
            for r in raw["assets"]
        )
        if [r.id for r in records] != list(range(len(records))) or dict(raw["symbols"]) != {
            r.symbol: r.id for r in records
        }:
            raise ValueError("its asset ids are not 0, 1, ... in the order of 'assets' and 'symbols'")
        series = {name: (str(v["symbol"]), str(v["interval"])) for name, v in raw.get("series", {}).items()}
        return cls(
            records,
            {str(c): int(i) for c, i in raw["categories"].items()},
            tuple(raw.get("intervals", ())),
            series,
            {str(k): str(v) for k, v in raw.get("peers", {}).items()},
        )

    @classmethod
    def read(cls, path: str | Path, fix: str = "the run folder is damaged") -> "RunInfo":
        """A run's (or an export's) asset_info.json; a UserError naming the file and `fix` when it
        is damaged."""
        try:
            return cls.from_json(read_json(path))
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            raise UserError(f"{path} is not a valid asset_info.json ({type(e).__name__}: {e}); {fix}") from None

    def to_json(self) -> dict[str, Any]:
        """asset_info.json's content, key for key as runs have always written it."""
        out: dict[str, Any] = {
            "assets": [vars(r).copy() for r in self.assets],
            "symbols": self.symbols,
            "categories": dict(self.categories),
            "num_assets": self.num_assets,
            "num_categories": self.num_categories,
        }
        if self.intervals:
            out["intervals"] = list(self.intervals)
            out["series"] = {name: {"symbol": s, "interval": iv} for name, (s, iv) in self.series.items()}
        if self.peers:
            out["peers"] = dict(self.peers)
        return out

    def peer_of(self, symbol: str, interval: str) -> Optional[str]:
        """The symbol whose last move `symbol`'s candles of `interval` read (model.market_peer), or None."""
        if not self.intervals:
            return self.peers.get(symbol)
        peer = self.peers.get(series_name(symbol, interval))
        return None if peer is None else split_series(peer)[0]

    @property
    def symbols(self) -> dict[str, int]:
        """asset symbol -> asset id."""
        return {r.symbol: r.id for r in self.assets}

    @property
    def num_assets(self) -> int:
        return len(self.assets)

    @property
    def num_categories(self) -> int:
        return len(self.categories)

    @property
    def num_intervals(self) -> int:
        """The interval embedding's size: 1 for a run of one interval."""
        return len(self.intervals) or 1

    def series_ids(self) -> tuple[dict[str, int], dict[str, int], dict[str, int]]:
        """(asset id, category id, interval id) of each series of the run's token set: a
        one-interval run's series are its assets, all at interval id 0."""
        category = {r.symbol: r.category_id for r in self.assets}
        if not self.intervals:
            return self.symbols, category, {r.symbol: 0 for r in self.assets}
        ids, interval_id = self.symbols, {iv: i for i, iv in enumerate(self.intervals)}
        return (
            {name: ids[s] for name, (s, _) in self.series.items()},
            {name: category[s] for name, (s, _) in self.series.items()},
            {name: interval_id[iv] for name, (_, iv) in self.series.items()},
        )

    def interval(self, trained: str, interval: Optional[str]) -> tuple[str, int]:
        """(interval, its id) of --interval for this run, whose data.interval is `trained`: None
        picks the run's first interval; one it did not train on is a UserError."""
        intervals = list(self.intervals) or [trained]
        if interval is None:
            return intervals[0], 0
        if interval not in intervals:
            raise UserError(
                f"--interval {interval}: the run was trained on {', '.join(intervals)} only; "
                f"pick one of them (a new interval needs a run that trains on it)"
            )
        return interval, intervals.index(interval)

    def interval_series(self, interval: str) -> dict[str, str]:
        """series name -> asset symbol of one interval's series (a run of several intervals)."""
        return {name: s for name, (s, iv) in self.series.items() if iv == interval}
