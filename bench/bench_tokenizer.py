"""Tokenizer speed and memory at case A's size: fit + encode of 600 assets x 5,000 daily candles.

Targets (issue 2): under 3 s and under 1 GB peak memory on 2 cores.

    python bench/bench_tokenizer.py [--assets 600] [--candles 5000] [--json PATH]

Memory is the process's peak resident set size (resource.getrusage ru_maxrss), so it includes
Python, numpy, pandas and the 3M generated candles themselves: an upper bound on what the
tokenizer adds. The RSS right before fit is printed too, so the tokenizer's share is visible.
Always exits 0: it reports, it does not gate.
"""

from __future__ import annotations

import resource
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import bench_args, finish, row  # noqa: E402  (puts the repo on sys.path)

from common.tokens.tokenizer import OHLCTokenizer  # noqa: E402

__all__ = ["make_candles", "run", "main"]

TARGET_SECONDS = 3.0
TARGET_MB = 1024.0


def make_candles(n_assets: int, n_candles: int, seed: int = 0) -> dict[str, pd.DataFrame]:
    """Seeded random-walk daily candles, daily volatility from 0.2% to 5% across assets."""
    rng = np.random.default_rng(seed)
    vol = np.exp(rng.uniform(np.log(0.002), np.log(0.05), size=(n_assets, 1)))
    ret = vol * rng.standard_t(df=4, size=(n_assets, n_candles)) / np.sqrt(2.0)
    close = 100.0 * np.exp(np.cumsum(ret, axis=1))
    open_ = close * np.exp(-ret * rng.uniform(0.3, 1.0, size=ret.shape))  # part of the move is a gap
    wick = vol * np.abs(rng.standard_normal((2, n_assets, n_candles))) * 0.5
    high = np.maximum(open_, close) * np.exp(wick[0])
    low = np.minimum(open_, close) * np.exp(-wick[1])
    volume = rng.uniform(0.0, 1e6, size=ret.shape)
    index = pd.date_range("2005-01-03", periods=n_candles, freq="D", tz="UTC", name="timestamp")
    frames = {}
    for a in range(n_assets):
        frames[f"A{a:03d}"] = pd.DataFrame(
            {"open": open_[a], "high": high[a], "low": low[a], "close": close[a], "volume": volume[a]}, index=index
        )
    return frames


def _rss_mb_now() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / 2**20


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # Linux: kilobytes


def run(assets: int = 600, candles: int = 5000, vocab_size: int = 4096) -> dict[str, Any]:
    t0 = time.perf_counter()
    frames = make_candles(assets, candles)
    total = assets * candles
    print(f"generated {assets} assets x {candles} candles = {total:,} in {time.perf_counter() - t0:.2f} s")
    rss_before = _rss_mb_now()

    tok = OHLCTokenizer(vocab_size=vocab_size)
    t0 = time.perf_counter()
    tok.fit(frames)
    t_fit = time.perf_counter() - t0
    t0 = time.perf_counter()
    tokens = {sym: tok.encode(df, asset=sym) for sym, df in frames.items()}
    t_enc = time.perf_counter() - t0
    peak = _peak_rss_mb()

    usage = tok.usage(np.concatenate(list(tokens.values())))
    elapsed = t_fit + t_enc
    print(tok)
    print(f"fit    {t_fit:6.2f} s")
    print(f"encode {t_enc:6.2f} s   ({total / t_enc / 1e6:.1f} M candles/s)")
    print(
        f"total  {elapsed:6.2f} s   target < {TARGET_SECONDS:.0f} s   {'OK' if elapsed < TARGET_SECONDS else 'MISSED'}"
    )
    print(f"RSS before fit {rss_before:7.0f} MB (Python + libraries + generated candles)")
    print(
        f"peak RSS       {peak:7.0f} MB   target < {TARGET_MB:.0f} MB   "
        f"{'OK' if peak < TARGET_MB else 'MISSED'}  (ru_maxrss, whole process)"
    )
    print(
        f"token usage: {usage['bits']:.2f} bits of {usage['max_bits']:.2f} "
        f"({usage['fraction']:.1%}), {usage['distinct']} distinct ids; clipped: {tok.clip_counts}"
    )
    scale = f"{assets} assets x {candles:,} candles"
    return {
        "rows": [
            row(
                "Tokenizer fit + encode",
                "seconds",
                elapsed,
                "s",
                f"< {TARGET_SECONDS:g}",
                f"{scale}; fit {t_fit:.2f} s, encode {t_enc:.2f} s",
            ),
            row(
                "Tokenizer fit + encode",
                "peak RSS",
                peak,
                "MB",
                f"< {TARGET_MB:g}",
                f"whole process; {rss_before:.0f} MB before fit (Python, libraries, candles)",
            ),
        ],
        "figures": {
            "assets": assets,
            "candles": candles,
            "fit_s": t_fit,
            "encode_s": t_enc,
            "peak_rss_mb": peak,
            "rss_before_fit_mb": rss_before,
        },
    }


def main(argv: list[str] | None = None) -> int:
    ap = bench_args(__doc__.splitlines()[0])
    ap.add_argument("--assets", type=int, default=600)
    ap.add_argument("--candles", type=int, default=5000)
    ap.add_argument("--vocab-size", type=int, default=4096)
    args = ap.parse_args(argv)
    return finish("tokenizer", run(args.assets, args.candles, args.vocab_size), args.json)


if __name__ == "__main__":
    sys.exit(main())
