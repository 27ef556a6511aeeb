"""Run every benchmark, print one table and write bench/results.json.

    python bench/run_all.py [--threads N] [--only train,checkpoint,...] [--out PATH] [--smoke]

Each benchmark runs in a process of its own (its peak RSS is its own, and one that crashes
doesn't stop the rest) and hands its figures back through `--json`; its own output streams
through as it runs. About 7.5 minutes on 2 idle cores, the Slurm benchmark included (2026-11-23).
The Slurm benchmark (bench_slurm.py) needs the local cluster (tools/local_slurm/local_slurm.sh start --nodes 2): when
`scontrol ping` doesn't answer, it is skipped with a note in the table and the JSON; so is the
GPU benchmark (bench_gpu.py) where torch sees no GPU.
--smoke runs every benchmark at toy sizes (seconds, not minutes): it checks the command works,
its figures mean nothing.

Each benchmark script takes `--json PATH` and writes {"rows": [...], "figures": {...}} there
(bench/_common.py: bench_args, row, finish).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Optional

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import format_table, machine_info, row, set_threads  # noqa: E402

BENCH = Path(__file__).resolve().parent
# name -> (script, its arguments for --smoke; at full size it runs with its defaults)
BENCHMARKS: dict[str, tuple[str, list[str]]] = {
    "train": ("bench_train.py", ["--rounds", "1", "--cases", "C"]),
    "checkpoint": ("bench_checkpoint.py", ["--rounds", "1", "--case", "c"]),
    "tokenizer": ("bench_tokenizer.py", ["--assets", "20", "--candles", "500"]),
    "data": ("bench_data.py", ["--assets", "20", "--candles", "2000"]),
    "corpus": ("bench_corpus.py", ["--candles", "80000", "--assets", "10"]),
    "verify": ("bench_verify.py", ["--candles", "1e5"]),
    "forecast": ("bench_forecast.py", ["--assets", "2", "--samples", "8", "--horizon", "8", "--ref-samples", "1"]),
    "export": ("bench_export.py", ["--assets", "2", "--samples", "4", "--horizon", "3", "--rounds", "1"]),
    "scorecard": ("bench_scorecard.py", ["--horizons", "1,5", "--samples", "20", "--stride", "20"]),
    "slurm": ("bench_slurm.py", []),  # not run by --smoke
    "gpu": ("bench_gpu.py", ["--smoke", "--no-max-batch"]),  # only where torch sees a GPU
    "gpu_trainer": ("bench_gpu_trainer.py", ["--smoke"]),  # likewise
}
TIMEOUT_S = 1800
# table name of a benchmark in a row run_all writes for it
TITLES = {"slurm": "Slurm, local cluster", "gpu": "GPU training", "gpu_trainer": "Trainer vs bench"}


def slurm_status() -> Optional[str]:
    """None when the Slurm controller answers, else why the Slurm benchmark is skipped."""
    if shutil.which("scontrol") is None:
        return "skipped: no Slurm client (scontrol) on this machine"
    try:
        ping = subprocess.run(["scontrol", "ping"], capture_output=True, text=True, timeout=20)
    except subprocess.TimeoutExpired:
        return "skipped: scontrol ping timed out"
    if ping.returncode != 0 or "UP" not in ping.stdout:
        return (
            "skipped: Slurm is not up (start it with tools/local_slurm/local_slurm.sh start --nodes 2): "
            + " ".join((ping.stdout + ping.stderr).split())[:120]
        )
    return None


def gpu_status() -> Optional[str]:
    """None when torch sees a CUDA GPU, else why the GPU benchmark is skipped."""
    import torch

    if torch.cuda.is_available():
        return None
    return (
        f"skipped: no GPU visible to torch {torch.__version__} (CUDA build: {torch.version.cuda or 'no'}); "
        "run bench/bench_gpu.py on a GPU node (marketgpt doctor says why there is none)"
    )


def _run_streaming(cmd: list[str]) -> tuple[Optional[int], str]:
    """Run `cmd`, echoing its stdout as it comes; (exit code or None on timeout, the stdout)."""
    lines: list[str] = []
    timed_out = threading.Event()
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True) as proc:

        def kill() -> None:
            timed_out.set()
            proc.kill()

        watchdog = threading.Timer(TIMEOUT_S, kill)
        watchdog.start()
        try:
            assert proc.stdout is not None
            for line in proc.stdout:
                print(line, end="", flush=True)
                lines.append(line)
            code = proc.wait()
        finally:
            watchdog.cancel()
    return (None if timed_out.is_set() else code), "".join(lines)


def run_one(name: str, script: Path, args: list[str]) -> dict[str, Any]:
    """Run one benchmark in its own process; its result, or a note saying why there is none."""
    with tempfile.TemporaryDirectory(prefix=f"bench_{name}_") as tmp:
        out = Path(tmp) / "result.json"
        cmd = [sys.executable, str(script), "--json", str(out), *args]
        print(f"\n=== {name}: {' '.join(cmd[1:2] + args)}", flush=True)
        t0 = time.perf_counter()
        code, _ = _run_streaming(cmd)
        seconds = time.perf_counter() - t0
        if code == 0 and out.is_file():
            result = json.loads(out.read_text())
            return {"status": "ok", "seconds": seconds, "rows": result["rows"], "figures": result["figures"]}
    why = f"timed out after {TIMEOUT_S} s" if code is None else f"exit {code}" if code else "no --json output"
    return {
        "status": "failed",
        "seconds": seconds,
        "note": f"failed ({why}); see its output above",
        "rows": [row(TITLES.get(name, name), "failed", None, detail=f"failed ({why})")],
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=BENCH / "results.json")
    ap.add_argument("--only", default=",".join(BENCHMARKS), help="comma-separated subset of " + ", ".join(BENCHMARKS))
    ap.add_argument("--threads", type=int, default=None, help="torch threads for every benchmark")
    ap.add_argument("--smoke", action="store_true", help="toy sizes: checks the command, not the speed")
    args = ap.parse_args(argv)
    chosen = [n.strip() for n in args.only.split(",") if n.strip()]
    unknown = [n for n in chosen if n not in BENCHMARKS]
    if unknown:
        ap.error(f"unknown benchmark(s) {', '.join(unknown)}; choose from {', '.join(BENCHMARKS)}")

    set_threads(args.threads)
    started, t0, load_before = time.strftime("%Y-%m-%dT%H:%M:%S%z"), time.perf_counter(), os.getloadavg()
    if load_before[0] > 0.5 * (os.cpu_count() or 1):
        print(
            f"warning: load average {load_before[0]:.1f} on {os.cpu_count()} CPUs before starting: other "
            "work is running, the figures will be noisy (each side's best round helps only so much)"
        )
    results: dict[str, Any] = {}
    for name in chosen:
        script, smoke = BENCHMARKS[name]
        skip = slurm_status() if name == "slurm" else gpu_status() if name.startswith("gpu") else None
        if name == "slurm" and args.smoke:
            skip = "skipped: --smoke"
        if skip is not None:
            results[name] = {
                "status": "skipped",
                "note": skip,
                "rows": [row(TITLES.get(name, name), "skipped", None, detail=skip)],
            }
            print(f"\n=== {name}: {skip}", flush=True)
            continue
        threads = ["--threads", str(args.threads)] if args.threads and name != "slurm" else []
        results[name] = run_one(name, BENCH / script, (smoke if args.smoke else []) + threads)

    rows = [r for res in results.values() for r in res["rows"]]
    report = {
        "command": " ".join(["python", "bench/run_all.py", *(argv if argv is not None else sys.argv[1:])]),
        "started_at": started,
        "seconds": time.perf_counter() - t0,
        "smoke": args.smoke,
        "machine": {**machine_info(), "load_average_before": load_before},
        "rows": rows,
        "benchmarks": results,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    m = report["machine"]
    print(
        f"\n{m['nproc']} CPUs ({m['cpu']}), torch {m['torch']} ({m['torch_threads']} threads, {m['blas']}); "
        f"{report['seconds'] / 60:.1f} min; load average {load_before[0]:.1f} before, "
        f"{m['load_average'][0]:.1f} after{'; SMOKE SIZES: the figures mean nothing' if args.smoke else ''}"
    )
    print(format_table(rows))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
