"""Peak memory and time of one training epoch's batch order, the materialised way and the generated one.

A rank's training loop asks `TokenWindows.batch_indices` for the window ids of each chunk of its
batches. With the "randperm" order (every run before the generated one) that first builds a
permutation of every window, 4 bytes each; the "feistel" order computes only each chunk's
positions. Each way runs in a child process of its own, which walks one whole epoch's chunks
(rank 0 of 1, batch 64, context 256: the batches are not gathered) and reports its peak RSS
(getrusage of itself) before and after, so the difference is the order's own memory.

    python3 bench/bench_epoch_order.py                   # 10^8 windows in 600 assets
    python3 bench/bench_epoch_order.py --windows 1e6 --stride 3 --json out.json
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

from _common import bench_args, finish, machine_info, peak_rss_mb, row, set_threads

ASSETS = 600
BATCH, CONTEXT = 64, 256


def child(windows: int, stride: int, method: str) -> dict:
    """One epoch's order the `method` way, in this process: seconds and peak RSS (MB)."""
    import torch

    from common.training.batches import SplitWindows, TokenWindows

    counts = torch.full((ASSETS,), windows // ASSETS, dtype=torch.int64)
    counts[: windows % ASSETS] += 1
    ids = torch.zeros(ASSETS, dtype=torch.int64)
    split = SplitWindows(torch.cumsum(counts, 0) - counts, counts, 1, ids, ids)
    # no tokens: only the order is walked, nothing gathered
    w = TokenWindows(torch.zeros(1, dtype=torch.int16), {"train": split}, CONTEXT, epoch_stride=stride)
    before = peak_rss_mb()
    start = time.perf_counter()
    positions = 0
    for index, _ in w.batch_indices("train", BATCH, shuffle=True, seed=1, epoch=2, drop_last=True, order=method):
        positions += len(index)
    seconds = time.perf_counter() - start
    return {"seconds": seconds, "rss_before_mb": before, "rss_peak_mb": peak_rss_mb(), "positions": positions}


def main() -> int:
    ap = bench_args(__doc__.splitlines()[0])
    ap.add_argument("--windows", type=float, default=1e8, help="training windows (default 10^8)")
    ap.add_argument("--stride", type=int, default=1, help="data.epoch_stride k")
    ap.add_argument("--child", default=None, help="internal: run one way (randperm / feistel) in this process")
    args = ap.parse_args()
    windows = int(args.windows)
    if args.child:
        set_threads(args.threads)
        print(json.dumps(child(windows, args.stride, args.child)))
        return 0
    results = {}
    for method in ("randperm", "feistel"):
        cmd = [sys.executable, __file__, "--child", method, "--windows", str(windows), "--stride", str(args.stride)]
        if args.threads:
            cmd += ["--threads", str(args.threads)]
        out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
        results[method] = json.loads(out.splitlines()[-1])
    rows = []
    for method, r in results.items():
        detail = f"{windows:,} windows, k={args.stride}, {r['positions']:,} positions walked"
        rows.append(row(f"Epoch order, {method}", "seconds", r["seconds"], "s", detail=detail))
        rows.append(row(f"Epoch order, {method}", "peak RSS", r["rss_peak_mb"], "MB", detail=detail))
        rows.append(row(f"Epoch order, {method}", "peak RSS - before", r["rss_peak_mb"] - r["rss_before_mb"], "MB"))
    return finish("epoch_order", {"rows": rows, "results": results, "machine": machine_info()}, args.json)


if __name__ == "__main__":
    sys.exit(main())
