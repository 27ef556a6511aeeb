"""The real OHLCV sample shipped inside the package: training data that needs no network.

One zstd parquet file, common/data/sample/candles.parquet, holds daily and hourly candles of
about 20 real assets in long form (symbol, interval, timestamp, open, high, low, close, volume);
its schema metadata lists each asset's category, name and source. tools/make_sample.py builds
it from permissively licensed PyPI packages; NOTICE beside it names every source and licence.

    from common.data.sample import load_sample, sample_assets
    assets = sample_assets("1d")      # list[Asset], source "sample"
    candles = load_sample("1d")       # {symbol: canonical candle frame}
"""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq

from common.data.universe import Asset
from common.errors import UserError

__all__ = [
    "SAMPLE_INTERVALS",
    "SAMPLE_FILE",
    "NOTICE_FILE",
    "sample_assets",
    "load_sample",
    "sample_file",
    "sample_metadata",
]

SAMPLE_INTERVALS: tuple[str, ...] = ("1d", "1h")
SAMPLE_FILE = "candles.parquet"
NOTICE_FILE = "NOTICE"
_METADATA_KEY = b"marketgpt.sample"  # written by tools/make_sample.py
_COLUMNS = ["open", "high", "low", "close", "volume"]


def _resource(name: str) -> resources.abc.Traversable:
    # importlib.resources finds the file in a source tree, an installed package or a zip alike.
    return resources.files("common.data").joinpath("sample", name)


def sample_file() -> Path:
    """The sample's parquet file on disk (for fingerprints of what a run was prepared from)."""
    return Path(str(_resource(SAMPLE_FILE)))


def _check_interval(interval: str) -> None:
    if interval not in SAMPLE_INTERVALS:
        raise UserError(
            f"the shipped sample has no interval {interval!r}; it has "
            f"{', '.join(SAMPLE_INTERVALS)}. Set data.interval to one of them, or use "
            'data.source = "download" for other intervals'
        )


def sample_metadata() -> dict:
    """The sample's metadata: per-asset category, name, source package, licence, rows, fixes."""
    resource = _resource(SAMPLE_FILE)
    try:
        with resource.open("rb") as f:
            schema = pq.read_schema(f)
    except FileNotFoundError:
        raise UserError(
            f"the shipped sample {resource} is missing; reinstall the package, or rebuild "
            "it with `python tools/make_sample.py`"
        ) from None
    return json.loads(schema.metadata[_METADATA_KEY])


def sample_assets(interval: str = "1d") -> list[Asset]:
    """The sample's assets at `interval`, in file order."""
    _check_interval(interval)
    return [
        Asset(symbol=a["symbol"], source="sample", category=a["category"], name=a["name"])
        for a in sample_metadata()["assets"]
        if a["interval"] == interval
    ]


def load_sample(interval: str = "1d") -> dict[str, pd.DataFrame]:
    """Canonical candle frames keyed by symbol: UTC index "timestamp", float64 OHLCV columns."""
    _check_interval(interval)
    with _resource(SAMPLE_FILE).open("rb") as f:
        table = pq.read_table(f, filters=[("interval", "==", interval)], columns=["symbol", "timestamp", *_COLUMNS])
    long = table.to_pandas()
    frames: dict[str, pd.DataFrame] = {}
    for asset in sample_assets(interval):
        rows = long[long["symbol"] == asset.symbol]
        index = pd.DatetimeIndex(rows["timestamp"], name="timestamp")
        frames[asset.symbol] = pd.DataFrame(rows[_COLUMNS].to_numpy("float64"), index=index, columns=_COLUMNS)
    return frames
