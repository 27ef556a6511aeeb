"""MarketData: the candles of a case's assets, as every data source hands them to training."""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import pandas as pd

from common.data.universe import Asset

__all__ = ["MarketData"]


@dataclass
class MarketData:
    assets: list[Asset]  # universe order; asset ids follow it
    # symbol -> canonical candle frame; read-only (data.source = "synthetic" makes each frame as it
    # is looked up: loop over the assets rather than keeping every frame)
    candles: Mapping[str, pd.DataFrame]
    interval: str
    # data.source = "files": rows the file reader dropped, per symbol (counted in data_info.json)
    # and the file each symbol came from
    fixes: dict[str, dict[str, int]] = field(default_factory=dict)
    files: dict[str, str] = field(default_factory=dict)
