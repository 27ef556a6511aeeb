"""The cost of model.market_context's ids at case A's size: S series of N hourly candles each (the
rehearsal's full corpus is 600 x 184,080 1h candles, and 600 x 7,670 1d), every candle's three ids
as a shard's finish stage computes them: the series read one at a time (a generator, as the
stage reads its encoded files), MarketContext.own_ids of every series kept as int16; with --peers
(model.market_peer) the peers fitted on each series' first 70% first, and their column.

    python bench/bench_market_context.py --series 600 --candles 184080 [--peers] --json out.json

Prints the wall time and the peak RSS; the moves are random (the cost does not depend on them),
one candle in ten missing.
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time
from pathlib import Path
from typing import Iterator, Optional

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import machine_info  # noqa: E402  (puts the repo on sys.path)

from common.tokens.market_context import MarketContext, SeriesMoves  # noqa: E402


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--series", type=int, default=600)
    ap.add_argument("--candles", type=int, default=184_080)
    ap.add_argument("--interval", default="1h")
    ap.add_argument("--peers", action="store_true", help="model.market_peer: fit the peers, add their column")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    rng = np.random.default_rng(0)
    step = 3600 * 10**9 if args.interval == "1h" else 86_400 * 10**9
    start = np.datetime64("2005-01-01", "ns").astype(np.int64)
    names = [f"S{i:04d}" for i in range(args.series)]

    def series() -> Iterator[tuple[str, SeriesMoves]]:
        for name in names:
            stamps = start + step * np.arange(args.candles, dtype=np.int64)
            move = rng.standard_normal(args.candles)
            move[rng.random(args.candles) < 0.1] = np.nan
            yield name, SeriesMoves(args.interval, stamps, move, rng.normal(0, 0.3, args.candles))

    t0 = time.perf_counter()
    context = MarketContext(series())
    built = time.perf_counter() - t0
    peers = context.fit_peers({name: int(args.candles * 0.7) for name in names}) if args.peers else None
    fitted = time.perf_counter() - t0 - built
    ids = [context.own_ids(name, peers).astype(np.int16) for name in names]
    seconds = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    known = float(np.mean([(x > 0).mean() for x in ids]))
    print(
        f"{args.series} series x {args.candles:,} {args.interval} candles = {args.series * args.candles:,}: "
        f"{seconds:.1f} s ({built:.1f} s to read{f', {fitted:.1f} s to fit the peers' if args.peers else ''}), "
        f"peak RSS {peak:,.0f} MB, {known:.1%} of ids known"
    )
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "series": args.series,
                    "candles": args.candles,
                    "interval": args.interval,
                    "peers": args.peers,
                    "seconds": round(seconds, 1),
                    "peak_rss_mb": round(peak),
                    "figures": {"seconds": round(seconds, 1), "peak RSS MB": round(peak)},
                    "machine": machine_info(),
                },
                indent=2,
            )
            + "\n"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
