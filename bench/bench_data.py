"""Data-layer speed and memory at case A's size: load + clean + split of 600 assets x 5,000 candles.

Targets (issue 3): under 10 s and under 2 GB peak memory on 2 cores.

    python bench/bench_data.py [--assets 600] [--candles 5000] [--keep DIR] [--json PATH]

Builds a generated case A in a temp folder (universe.csv with case A's category mix, one zstd
parquet file per asset written through CandleCache, a few dirty rows and crypto holes so every
cleaning path runs), then times `load_market_data` (universe check + cache reads) and
`prepare_data` (clean, fill crypto gaps, global split) in a fresh child process, whose peak
resident set size (ru_maxrss) is therefore that of the measured work plus Python and its
libraries, not of the generation. Always exits 0: it reports, it does not gate.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Optional

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import REPO, bench_args, finish, row  # noqa: E402  (puts the repo on sys.path)

from common.config import load_config  # noqa: E402
from common.paths import case_config  # noqa: E402

__all__ = ["make_case", "measure", "run", "main"]

TARGET_SECONDS = 10.0
TARGET_MB = 2048.0
# Case A's mix, scaled to --assets: (category, source, share of the universe).
MIX = (
    ("us_stock", "yfinance", 300),
    ("eu_stock", "yfinance", 150),
    ("emerging", "yfinance", 50),
    ("commodity", "yfinance", 30),
    ("crypto", "ccxt", 70),
)


def _counts(n_assets: int) -> dict[str, int]:
    counts = {cat: n_assets * share // 600 for cat, _, share in MIX}
    counts["us_stock"] += n_assets - sum(counts.values())  # rounding remainder
    return {cat: n for cat, n in counts.items() if n > 0}


def _frame(rng: np.random.Generator, index: pd.DatetimeIndex) -> pd.DataFrame:
    n = len(index)
    ret = rng.normal(0, rng.uniform(0.005, 0.04), n)
    close = 100.0 * np.exp(np.cumsum(ret))
    open_ = np.concatenate([[100.0], close[:-1]])
    high = np.maximum(open_, close) * np.exp(np.abs(rng.normal(0, 0.005, n)))
    low = np.minimum(open_, close) * np.exp(-np.abs(rng.normal(0, 0.005, n)))
    frame = pd.DataFrame(
        {"open": open_, "high": high, "low": low, "close": close, "volume": rng.uniform(0, 1e6, n)}, index=index
    )
    bad = rng.choice(n, size=4, replace=False)  # the dirt real feeds have
    frame.iloc[bad[0], 3] = np.nan  # NaN close
    frame.iloc[bad[1], 1] = frame.iloc[bad[1], 3] * 0.9  # high below close
    frame.iloc[bad[2], 2] = frame.iloc[bad[2], 0] * 1.1  # low above open
    frame.iloc[bad[3], 4] = -1.0  # negative volume
    return frame


def make_case(folder: Path, n_assets: int, n_candles: int, seed: int = 0) -> dict[str, int]:
    """Write universe.csv and the parquet cache of a generated case into `folder`."""
    from common.data.cache import CandleCache

    rng = np.random.default_rng(seed)
    counts = _counts(n_assets)
    stock_days = pd.bdate_range("2005-01-03", periods=n_candles, tz="UTC", name="timestamp")
    crypto_days = pd.date_range("2011-01-01", periods=n_candles, freq="D", tz="UTC", name="timestamp")
    cache = CandleCache(folder / "data")
    lines = ["symbol,source,category,name"]
    for category, source, _ in MIX:
        for i in range(counts.get(category, 0)):
            symbol = f"{category[:3].upper()}{i:03d}" + ("/USDT" if source == "ccxt" else "")
            lines.append(f"{symbol},{source},{category},Generated {category} {i}")
            index = crypto_days if category == "crypto" else stock_days
            frame = _frame(rng, index)
            if category == "crypto":  # a few missing bars in a 24/7 market
                frame = frame.drop(index[rng.choice(n_candles, size=5, replace=False)])
            cache.write(source, "1d", symbol, frame, adjusted=source == "yfinance")
    (folder / "universe.csv").write_text("\n".join(lines) + "\n")
    return counts


def measure(folder: Path, counts: dict[str, int]) -> dict:
    """Load + clean + split the generated case, as training does; figures as a dict."""
    t0 = time.perf_counter()
    from common.data.loading import load_market_data
    from common.data.prepare import prepare_data

    t_import = time.perf_counter() - t0

    overrides = ['data.start_date="2000-01-01"', f"data.universe_counts={json.dumps(counts)}"]
    cfg = load_config(case_config(REPO / "case_a_full_market"), overrides)
    t0 = time.perf_counter()
    market = load_market_data(cfg.data, folder)
    t_load = time.perf_counter() - t0
    t0 = time.perf_counter()
    data = prepare_data(cfg.data, cfg.model.context_length, market)
    t_prepare = time.perf_counter() - t0
    return {
        "import_s": t_import,
        "load_s": t_load,
        "prepare_s": t_prepare,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0,  # Linux: KB
        "candles": data.info["totals"]["raw_rows"],
        "assets": len(data.assets),
        "dropped": len(data.dropped),
        "fixes": data.info["totals"]["fixes"],
        "gaps_filled": data.info["totals"]["gaps_filled"],
        "cuts": data.info["split_cuts"],
        "context_length": cfg.model.context_length,
    }


def run(assets: int = 600, candles: int = 5000, keep: Optional[Path] = None) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="bench_data_") as tmp:
        folder = keep or Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        t0 = time.perf_counter()
        make_case(folder, assets, candles)
        size_mb = sum(p.stat().st_size for p in (folder / "data").rglob("*.parquet")) / 2**20
        print(
            f"generated {assets} assets x {candles} daily candles = "
            f"{assets * candles:,} in {time.perf_counter() - t0:.1f} s; "
            f"parquet cache {size_mb:.0f} MB"
        )
        child = subprocess.run(
            [sys.executable, __file__, "--assets", str(assets), "--measure", str(folder)],
            capture_output=True,
            text=True,
        )
        if child.returncode != 0:
            print(child.stdout + child.stderr)
            raise RuntimeError(f"the measuring process failed (exit {child.returncode})")
        r = json.loads(child.stdout.strip().splitlines()[-1])

    elapsed = r["load_s"] + r["prepare_s"]
    print(f"load    {r['load_s']:6.2f} s   (universe check + {assets} parquet reads)")
    print(
        f"prepare {r['prepare_s']:6.2f} s   (clean, crypto gaps, global split; "
        f"{r['candles'] / max(r['prepare_s'], 1e-9) / 1e6:.1f} M candles/s)"
    )
    print(
        f"total   {elapsed:6.2f} s   target < {TARGET_SECONDS:.0f} s   "
        f"{'OK' if elapsed < TARGET_SECONDS else 'MISSED'}   (imports {r['import_s']:.2f} s more)"
    )
    print(
        f"peak RSS {r['peak_rss_mb']:5.0f} MB   target < {TARGET_MB:.0f} MB   "
        f"{'OK' if r['peak_rss_mb'] < TARGET_MB else 'MISSED'}  (ru_maxrss of the measuring process)"
    )
    print(
        f"kept {r['assets']} assets, dropped {r['dropped']}; {r['candles']:,} candles; "
        f"gaps filled {r['gaps_filled']}; fixes {r['fixes']}"
    )
    print(
        f"split cuts (context {r['context_length']}): val from {r['cuts']['val_start']}, "
        f"test from {r['cuts']['test_start']}"
    )
    scale = f"{assets} assets x {candles:,} candles"
    return {
        "rows": [
            row(
                "Load + clean + split",
                "seconds",
                elapsed,
                "s",
                f"< {TARGET_SECONDS:g}",
                f"{scale}; load {r['load_s']:.2f} s, prepare {r['prepare_s']:.2f} s",
            ),
            row(
                "Load + clean + split",
                "peak RSS",
                r["peak_rss_mb"],
                "MB",
                f"< {TARGET_MB:g}",
                "ru_maxrss of the measuring process",
            ),
        ],
        "figures": {"assets": assets, "candles": candles, "parquet_mb": size_mb, **r},
    }


def main(argv: list[str] | None = None) -> int:
    ap = bench_args(__doc__.splitlines()[0])
    ap.add_argument("--assets", type=int, default=600)
    ap.add_argument("--candles", type=int, default=5000)
    ap.add_argument("--keep", type=Path, default=None, help="build the case here and keep it")
    ap.add_argument("--measure", type=Path, default=None, help=argparse.SUPPRESS)  # the child's mode
    args = ap.parse_args(argv)
    if args.measure is not None:
        print(json.dumps(measure(args.measure, _counts(args.assets))))
        return 0
    return finish("data", run(args.assets, args.candles, args.keep), args.json)


if __name__ == "__main__":
    sys.exit(main())
