"""What checking every byte costs a rank: a token folder of N candles (tokens.bin int16, moves.bin
float64 and, with --features, features.bin (N, 3) int16) written with its checksums, then opened by
one fresh process per "rank" as training opens it (TokenSet.load: sizes, then the sha256 of every
array file). Reports each open's seconds and the throughput; a second open in the same process
(a rank opening the shard, then its run's hard links) must cost nothing.

Target (docs/performance.md): at 10^8 candles <= 10 s per rank on 2 cores, <= 2% of a one-hour job.
The files are just written, so the page cache holds them: the figure is the hashing, not a cold
disk (a cold Lustre read adds the file system's own rate).

    python3 bench/bench_verify.py                        # 10^7 candles
    python3 bench/bench_verify.py --candles 1e8 --ranks 2 --json out.json
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from _common import REPO, bench_args, finish, machine_info, row

OPEN = """
import json, sys, time
from common.tokens.token_set import TokenSet
t = time.perf_counter(); TokenSet.load(sys.argv[1]); first = time.perf_counter() - t
t = time.perf_counter(); TokenSet.load(sys.argv[1]); again = time.perf_counter() - t
print(json.dumps({"first_s": first, "again_s": again}))
"""


def write_folder(folder: Path, candles: int, features: bool) -> int:
    """A token folder of `candles` candles in 100 assets, written in chunks; returns its bytes."""
    from common.tokens.shard_manifest import Hasher
    from common.tokens.token_set import write_index

    folder.mkdir(parents=True)
    assets = 100
    lengths = [candles // assets] * assets
    lengths[-1] += candles - sum(lengths)
    rng = np.random.default_rng(0)
    arrays = {"tokens.bin": np.int16, "moves.bin": np.float64, **({"features.bin": np.int16} if features else {})}
    sha256 = {}
    for name, dtype in arrays.items():
        hasher = Hasher()
        with open(folder / name, "wb") as f:
            for n in lengths:
                shape = (n, 3) if name == "features.bin" else (n,)
                hasher.write(f, rng.integers(0, 1000, size=shape).astype(dtype).tobytes())
        sha256[name] = hasher.entry()["sha256"]
    symbols = [f"A{i:03d}" for i in range(assets)]
    ranges = {s: {"train": (0, n * 7 // 10), "val": (n * 7 // 10, n * 85 // 100), "test": (n * 85 // 100, n)}
              for s, n in zip(symbols, lengths)}  # fmt: skip
    write_index(folder, symbols, lengths, ranges, features, sha256)
    return sum((folder / name).stat().st_size for name in arrays)


def main() -> int:
    ap = bench_args(__doc__.splitlines()[0])
    ap.add_argument("--candles", type=float, default=1e7)
    ap.add_argument("--ranks", type=int, default=2, help="processes opening the folder at once, as ranks do")
    ap.add_argument("--features", action="store_true", help="with features.bin (model.time_features/volume_input)")
    args = ap.parse_args()
    candles = int(args.candles)
    with tempfile.TemporaryDirectory(dir=REPO / "bench") as tmp:
        folder = Path(tmp) / "tokens"
        started = time.perf_counter()
        size = write_folder(folder, candles, args.features)
        written = time.perf_counter() - started
        procs = [
            subprocess.Popen([sys.executable, "-c", OPEN, str(folder)], cwd=REPO, stdout=subprocess.PIPE, text=True)
            for _ in range(args.ranks)
        ]
        opens = [json.loads(p.communicate()[0]) for p in procs]
    first = max(o["first_s"] for o in opens)
    rows = [
        row("verify", "bytes per rank", size / 1e6, "MB", detail=f"{candles:,} candles, written in {written:.1f} s"),
        row("verify", "first open, slowest rank", first, "s", "<= 10", f"{args.ranks} ranks at once"),
        row("verify", "hash rate per rank", size / first / 1e6, "MB/s"),
        row("verify", "second open in the process", max(o["again_s"] for o in opens), "s", "<= 0.5"),
        row("verify", "share of a one-hour job", 100 * first / 3600, "%", "<= 2"),
    ]
    figures = {"candles": candles, "bytes": size, "first_open_s": first, "hash_mb_s": size / first / 1e6}
    return finish("verify", {"rows": rows, "figures": figures, "opens": opens, "machine": machine_info()}, args.json)


if __name__ == "__main__":
    sys.exit(main())
