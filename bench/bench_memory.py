"""Peak memory of the commands a login node or a small array task runs, against corpus size.

Writes own-files corpora (data.source = "files": one parquet file of hourly candles per asset)
of each size into a temp folder, then runs `marketgpt plan`, `marketgpt data check` and
`marketgpt data prepare` (in this process's machine, no Slurm) on each as a subprocess, and
reports each one's peak RSS (getrusage of that child alone) and wall time. The assets keep
their length and their number grows with the size, as a larger universe does: memory bounded by
design stays flat across the sizes.

    python3 bench/bench_memory.py                      # 1M and 10M candles
    python3 bench/bench_memory.py --sizes 1e7 1e8 --json out.json
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from _common import REPO, bench_args, finish, machine_info, row

COMMANDS = {  # name -> the marketgpt arguments after the config's case and config
    "plan": lambda case, config: ["plan", "--config", str(config)],
    "data check": lambda case, config: ["data", "check", "--case", str(case), "--config", str(config)],
    "data prepare": lambda case, config: ["data", "prepare", "--config", str(config)],
}
CONFIG = {
    "experiment": "memory",
    "model": {
        "vocab_size": 256,
        "context_length": 64,
        "d_model": 64,
        "num_layers": 2,
        "num_heads": 2,
        "d_ff": 128,
        "asset_embed_dim": 4,
        "category_embed_dim": 4,
    },
    "data": {
        "source": "files",
        "files_dir": "candles",
        "universe": "files",
        "default_category": "crypto",
        "interval": "1h",
    },
}


def write_corpus(case: Path, candles: int, per_asset: int, seed: int = 0) -> int:
    """A case folder with `candles` hourly candles in files of `per_asset` each; returns the assets."""
    import pandas as pd

    folder = case / "candles"
    folder.mkdir(parents=True)
    (case / "configs").mkdir()
    (case / "configs" / "memory.json").write_text(json.dumps(CONFIG))
    rng = np.random.default_rng(seed)
    assets = max(1, round(candles / per_asset))
    start = pd.Timestamp("2020-01-01", tz="UTC")
    for i in range(assets):
        n = candles // assets + (i < candles % assets)
        close = 100 * np.exp(np.cumsum(rng.normal(0, 0.01, n)))
        open_ = np.concatenate([[close[0]], close[:-1]])
        spread = np.abs(rng.normal(0, 0.003, n)) * close
        pd.DataFrame(
            {
                "timestamp": pd.date_range(start, periods=n, freq="h"),
                "open": open_,
                "high": np.maximum(open_, close) + spread,
                "low": np.minimum(open_, close) - spread,
                "close": close,
                "volume": rng.lognormal(10, 1, n),
            }
        ).to_parquet(folder / f"A{i:05d}.parquet")
    return assets


def run_command(args: list[str], case: Path) -> dict:
    """One marketgpt command as a child process: its peak RSS (MB), wall seconds and exit code."""
    env = dict(os.environ, PYTHONPATH=str(REPO))
    t0 = time.perf_counter()
    # os.wait4: this child's own rusage (RUSAGE_CHILDREN would be the max over every child so far)
    proc = subprocess.Popen(
        [sys.executable, "-m", "common.cli", *args],
        cwd=case,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    out = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    seconds = time.perf_counter() - t0
    return {
        "rss_mb": usage.ru_maxrss / 1024.0,
        "seconds": seconds,
        "rc": proc.returncode,
        "tail": out.strip().splitlines()[-3:],
    }


def main() -> int:
    ap = bench_args(__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=float, nargs="+", default=[1e6, 1e7], help="candles per corpus")
    ap.add_argument("--per-asset", type=int, default=20_000, help="candles per asset file (about 2.3 years)")
    ap.add_argument("--keep", type=Path, default=None, help="write the corpora here and keep them")
    args = ap.parse_args()
    rows, results = [], []
    root = args.keep or Path(tempfile.mkdtemp(prefix="bench_memory_"))
    try:
        for size in args.sizes:
            candles = int(size)
            case = root / f"case_{candles}"
            t0 = time.perf_counter()
            assets = write_corpus(case, candles, args.per_asset)
            print(f"{candles:,} candles in {assets} files written in {time.perf_counter() - t0:.0f} s", flush=True)
            config = case / "configs" / "memory.json"
            for name, command in COMMANDS.items():
                got = run_command(command(case, config), case)
                print(
                    f"  {name}: {got['rss_mb']:,.0f} MB peak RSS, {got['seconds']:.1f} s, exit {got['rc']}", flush=True
                )
                if got["rc"] not in (0, 1):  # data check exits 1 when some assets are not usable
                    print("\n".join(got["tail"]), flush=True)
                results.append({"command": name, "candles": candles, "assets": assets, **got})
                rows.append(
                    row(
                        "memory",
                        f"{name} at {candles:,.0f} candles",
                        got["rss_mb"],
                        "MB",
                        detail=f"{got['seconds']:.1f} s, exit {got['rc']}",
                    )
                )
            if args.keep is None:
                shutil.rmtree(case)
    finally:
        if args.keep is None:
            shutil.rmtree(root, ignore_errors=True)
    for name in COMMANDS:
        mine = [r for r in results if r["command"] == name]
        if len(mine) > 1 and mine[0]["rss_mb"]:
            growth = mine[-1]["rss_mb"] / mine[0]["rss_mb"]
            rows.append(
                row(
                    "memory",
                    f"{name}: RSS at {mine[-1]['candles']:,} / at {mine[0]['candles']:,}",
                    growth,
                    "x",
                    target="<= 1.2",
                )
            )
    return finish("memory", {"rows": rows, "results": results, "machine": machine_info()}, args.json)


if __name__ == "__main__":
    sys.exit(main())
