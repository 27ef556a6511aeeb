"""MarketData: the candles of a case's assets, as every data source hands them to training."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Iterator, Mapping

import pandas as pd

from common.data.universe import Asset

__all__ = ["LazyFrames", "MarketData"]


@dataclass
class MarketData:
    assets: list[Asset]  # universe order; asset ids follow it
    # symbol -> canonical candle frame, read-only: a dict, or LazyFrames that reads (or, for the
    # synthetic market, makes) each one when asked; loop over the assets rather than keep them all
    candles: Mapping[str, pd.DataFrame]
    interval: str
    # data.source = "files": rows the file reader dropped, per symbol (counted in data_info.json)
    # (a dict, or LazyFrames: known once that asset's candles are read) and the file each symbol came from
    fixes: Mapping[str, dict[str, int]] = field(default_factory=dict)
    files: Mapping[str, str] = field(default_factory=dict)
    # data.intervals: the assets are series (common.markets.series_name), each at its own interval
    series_intervals: dict[str, str] = field(default_factory=dict)

    def interval_of(self, symbol: str) -> str:
        """The interval of one asset's (or series') candles."""
        return self.series_intervals.get(symbol, self.interval)


class LazyFrames(Mapping[str, pd.DataFrame]):
    """symbol -> frame, read by `load(symbol)` on every access and never kept: a caller that
    walks the assets one at a time holds one asset's candles, whatever the universe's size.
    (Any per-asset value can be looked up this way: the files source's drop counts are.)"""

    def __init__(self, symbols: list[str], load: Callable[[str], pd.DataFrame]) -> None:
        self._symbols = list(symbols)
        self._known = set(self._symbols)
        self._load = load

    def __getitem__(self, symbol: str) -> pd.DataFrame:
        if symbol not in self._known:
            raise KeyError(symbol)
        return self._load(symbol)

    def __contains__(self, symbol: object) -> bool:  # Mapping's own would read the frame
        return symbol in self._known

    def __iter__(self) -> Iterator[str]:
        return iter(self._symbols)

    def __len__(self) -> int:
        return len(self._symbols)

    def only(self, symbols: set[str]) -> "LazyFrames":
        """The same reader over fewer symbols."""
        return LazyFrames([s for s in self._symbols if s in symbols], self._load)
