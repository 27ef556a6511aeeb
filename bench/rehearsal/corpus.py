"""Stage 1, the corpus: case A's universe (600 assets: yfinance stocks and commodities, ccxt crypto
pairs) as one synthetic market (common.data.synthetic), 1h candles and the 1d candles made from
them, written by CandleCache into the repo copy's case_a_full_market/data: the layout
`marketgpt data download` leaves."""

from __future__ import annotations

import os
import resource
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict
from pathlib import Path
from typing import Any

from rehearsal.base import CONFIG, INTERVALS, Rehearsal, Size


def _write_assets(case: str, size: Size, indices: list[int], exchange: str) -> int:
    """Assets `indices` of the universe, 1h and 1d, into the case's candle cache; returns candles."""
    from common.config.synthetic import SyntheticSpec
    from common.data.cache import CandleCache
    from common.data.download import YAHOO_ORIGIN
    from common.data.synthetic import aggregate, generate_asset
    from common.data.universe import load_universe

    universe = load_universe(Path(case) / "universe.csv", None)
    spec = SyntheticSpec(
        assets=len(universe),
        candles=24 * size.days,
        interval="1h",
        start=size.start,
        seed=7,
        gap_prob=size.hourly_gap,
        categories=tuple(sorted({a.category for a in universe})),
    )
    cache = CandleCache(Path(case) / "data")
    written = 0
    for i in indices:
        asset = universe[i]
        hourly = generate_asset(spec, i).candles  # one market: the assets co-move as in the real one
        origin = YAHOO_ORIGIN if asset.source == "yfinance" else exchange  # what download records
        for interval, frame in (("1h", hourly), ("1d", aggregate(hourly, "1d"))):
            cache.write(asset.source, interval, asset.symbol, frame, adjusted=asset.source == "yfinance", origin=origin)
            written += len(frame)
    return written


def write_corpus(r: Rehearsal) -> dict[str, Any]:
    """Case A's universe as synthetic candles in the download cache's layout, one worker per core."""
    from common.config import load_config
    from common.data.universe import load_universe

    cfg = load_config(r.repo / CONFIG)
    assets = load_universe(r.case / "universe.csv", None)
    workers = os.cpu_count() or 1
    with ProcessPoolExecutor(workers) as pool:
        candles = sum(
            pool.map(
                _write_assets,
                [str(r.case)] * workers,
                [r.size] * workers,
                [list(range(w, len(assets), workers)) for w in range(workers)],
                [cfg.data.exchange] * workers,
            )
        )
    children = resource.getrusage(resource.RUSAGE_CHILDREN)  # the workers, the first children reaped
    files = [p for p in (r.case / "data").rglob("*") if p.is_file()]
    sources = sorted({p.relative_to(r.case / "data").parts[0] for p in files if p.suffix == ".parquet"})
    return {
        "candles": candles,
        "bytes_on_disk": sum(p.stat().st_size for p in files),
        "parquet_files": sum(p.suffix == ".parquet" for p in files),
        "assets": len(assets),
        "categories": sorted({a.category for a in assets}),
        "sources": sources,
        "intervals": INTERVALS,
        "size": asdict(r.size),
        "workers": workers,
        "rusage": {
            "processes": workers,
            "max_rss_mb": round(children.ru_maxrss / 1024, 1),
            "max_rss_process": "corpus worker",
            "read_bytes": children.ru_inblock * 512,
            "rchar": None,
        },
    }
