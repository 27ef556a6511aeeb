"""What every benchmark shares: alternating timing, result rows, the machine, JSON output.

Every figure is a ratio against a reference measured in the same process and the same run,
because these machines are shared and noisy: the subject and its reference run in alternating
rounds (A B, B A, A B, ...) on the same threads, and each side is represented by its fastest
round. A neighbour's work only ever slows a round down, in bursts, so the fastest of several
interleaved rounds is each side's least disturbed measurement (timeit's advice); every round's
time is kept in the JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import sys
import time
from pathlib import Path
from typing import Any, Callable, Optional

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))  # run from a checkout without install

__all__ = [
    "REPO",
    "alternate",
    "bench_args",
    "best_ratio",
    "blank_features",
    "finish",
    "format_table",
    "machine_info",
    "peak_rss_mb",
    "row",
    "set_threads",
    "timed",
]


def set_threads(threads: Optional[int]) -> int:
    """Pin torch's intra-op threads (default: one per core, torch's own default) and return it."""
    import torch

    if threads:
        torch.set_num_threads(threads)
    return torch.get_num_threads()


def blank_features(model_config: Any, *shape: int) -> Any:
    """Candle ids of `shape` + (columns,) for a model that reads them (common/tokens/features.py),
    all 0 (every calendar, volume, level and market id "unknown": a lookup costs the same whatever
    the id), for benchmarks on random tokens; None for a model that reads none."""
    import numpy as np

    from common.tokens.features import feature_columns

    m = model_config
    if not m.reads_features:
        return None
    return np.zeros((*shape, feature_columns(m.vol_level_input, m.market_context, m.reads_peer)), dtype=np.int64)


def bench_run(path: Path, cfg: Any, num_assets: int) -> Any:
    """The run a benchmark's Trainer writes into: the folder `path`, the config `cfg` and
    `num_assets` assets (no data: the benchmark feeds its own windows)."""
    from common.data.universe import Asset
    from common.run.folder import Run
    from common.tokens.ids import RunInfo
    from common.tokens.tokenizer import OHLCTokenizer

    assets = [Asset(f"S{i}", "sample", "crypto", f"S{i}") for i in range(num_assets)]
    return Run(Path(path), cfg, OHLCTokenizer(), RunInfo.of_assets(assets))


def timed(fn: Callable[[], Any]) -> float:
    """Wall seconds of one call."""
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def alternate(subjects: dict[str, Callable[[], float]], rounds: int) -> dict[str, list[float]]:
    """Run each subject once per round, in ABBA order; each returns its own measured seconds."""
    names = list(subjects)
    out: dict[str, list[float]] = {n: [] for n in names}
    for r in range(rounds):
        for n in names if r % 2 == 0 else reversed(names):
            out[n].append(subjects[n]())
    return out


def best_ratio(slow: list[float], fast: list[float]) -> float:
    """min(slow) / min(fast): how many times faster `fast`'s best round is than `slow`'s."""
    return min(slow) / min(fast)


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # Linux: kilobytes


def row(
    benchmark: str, figure: str, value: Optional[float], unit: str = "", target: Optional[str] = None, detail: str = ""
) -> dict[str, Any]:
    """One line of the results table. target is '>= 1.0', '< 3', ... or None (report only)."""
    ok = None
    if target is not None and value is not None:
        op, bound = target.split()
        ok = {
            ">=": value >= float(bound),
            "<=": value <= float(bound),
            "<": value < float(bound),
            ">": value > float(bound),
        }[op]
    return {
        "benchmark": benchmark,
        "figure": figure,
        "value": value,
        "unit": unit,
        "target": target,
        "ok": ok,
        "detail": detail,
    }


def format_value(r: dict[str, Any]) -> str:
    v = r["value"]
    if v is None:
        return "n/a"
    if abs(v) >= 1000:
        text = f"{v:,.0f}"
    elif abs(v) >= 100:
        text = f"{v:.0f}"
    elif abs(v) >= 10:
        text = f"{v:.1f}"
    else:
        text = f"{v:.3g}" if abs(v) < 0.1 else f"{v:.2f}"
    return f"{text} {r['unit']}".strip()


def format_table(rows: list[dict[str, Any]]) -> str:
    """A plain-text table: benchmark | figure | value | target | status | detail."""
    cells = [("benchmark", "figure", "value", "target", "status", "detail")]
    for r in rows:
        status = {True: "OK", False: "MISSED", None: "-"}[r["ok"]]
        cells.append((r["benchmark"], r["figure"], format_value(r), r["target"] or "report", status, r["detail"]))
    widths = [max(len(c[i]) for c in cells) for i in range(5)]
    lines = []
    for i, c in enumerate(cells):
        lines.append("  ".join(c[j].ljust(widths[j]) for j in range(5)) + ("  " + c[5] if c[5] else ""))
        if i == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def machine_info() -> dict[str, Any]:
    import torch

    cpu = "unknown"
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), cpu)
    except OSError:
        pass
    return {
        "nproc": os.cpu_count(),
        "cpu": cpu,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "torch_threads": torch.get_num_threads(),
        "blas": "MKL" if torch.backends.mkl.is_available() else "other",
        "openblas_env": {k: v for k, v in os.environ.items() if k.startswith("OPENBLAS_")},
        "load_average": os.getloadavg(),  # others' work on a shared machine: how noisy the figures are
    }


def bench_args(description: str) -> argparse.ArgumentParser:
    """The options every benchmark takes: --json PATH (what run_all reads) and --threads."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--json", type=Path, default=None, help="also write the figures to this JSON file")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's, one per core)")
    return ap


def finish(name: str, result: dict[str, Any], json_path: Optional[Path]) -> int:
    """Print the rows and write the JSON; benchmarks report, they never fail on a missed target."""
    print(format_table(result["rows"]))
    if json_path is not None:
        json_path.write_text(json.dumps({"name": name, **result}, indent=2) + "\n")
    return 0
