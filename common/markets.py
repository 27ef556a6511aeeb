"""The market vocabulary every floor shares: asset categories and candle intervals.

A leaf (no imports from the package), so the config, the data layer and the forecasters can
all name a category or turn an interval into a bar length without importing each other.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from common.errors import UserError

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["CATEGORIES", "INTERVAL_SECONDS", "SERIES_SEP", "interval_step", "series_name", "split_series"]

# The order is part of the contract: category ids in asset_info.json follow it.
CATEGORIES: tuple[str, ...] = ("us_stock", "eu_stock", "emerging", "commodity", "crypto", "index", "fx")
INTERVAL_SECONDS: dict[str, int] = {"1m": 60, "5m": 300, "15m": 900, "30m": 1800, "1h": 3600, "4h": 14400, "1d": 86400}
# A run of several intervals (data.intervals) trains on series, one per asset and interval, named
# "<symbol>@<interval>" in its token set; a one-interval run's series are its assets' symbols.
SERIES_SEP = "@"


def interval_step(interval: str) -> pd.Timedelta:
    """The bar length of a config interval ("1h" -> 1 hour)."""
    import pandas as pd  # here, not above: the config imports this leaf and loads without pandas

    try:
        return pd.Timedelta(seconds=INTERVAL_SECONDS[interval])
    except KeyError:
        raise UserError(f"interval {interval!r} is not one of {', '.join(INTERVAL_SECONDS)}") from None


def series_name(symbol: str, interval: str) -> str:
    """The token set's name of one asset's series at one interval ("BTC-USD", "1h" -> "BTC-USD@1h")."""
    return f"{symbol}{SERIES_SEP}{interval}"


def split_series(name: str) -> tuple[str, str]:
    """(symbol, interval) of a series_name; a ValueError for a name that is not one."""
    symbol, sep, interval = name.rpartition(SERIES_SEP)
    if not sep or not symbol or interval not in INTERVAL_SECONDS:
        raise ValueError(f"{name!r} is not a series name '<symbol>{SERIES_SEP}<interval>'")
    return symbol, interval
