"""What every stage shares: the sizes, case A's settings for a tiny model, the scratch repo copy and
the environment every command runs in (with the hook that records each process's memory and
reads), and the stages' records."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

CASE = "case_a_full_market"
CONFIG = f"{CASE}/configs/full_market_config.json"  # the one the case script trains
SCRIPT = f"{CASE}/slurm_scripts/train_full_a100.sh"
LOG_PREFIX = "full"
INTERVALS = ["1d", "1h"]
ARRAY = 8
NODES, TASKS_PER_NODE = 2, 2  # the case script's --ntasks-per-node
GLOBAL_BATCH = 16
EPOCHS, STEPS = 2, 40


@dataclass(frozen=True)
class Size:
    days: int  # the 1d candles per asset; the 1h ones are made first and the 1d from them
    hourly_gap: float  # the share of hours without a candle (a stock trades some 7 hours a day)
    start: str  # the first candle, and data.start_date
    eval_batches: Optional[int]  # the job's training.eval_max_batches (None: every val and test token)
    timeout_s: int  # the longest a stage may take
    benchmark_budget: int = 2000  # `benchmark --after-cutoff --budget` (the command's default): its forecasts


SIZES = {  # 600 x (1,800 + 300) = 1.26M candles; 600 x (16,800 + 700) = 10.5M; 600 x (184,080 + 7,670) = 115M
    "reduced": Size(
        days=300, hourly_gap=0.75, start="2023-01-01", eval_batches=None, timeout_s=1800, benchmark_budget=200
    ),
    "medium": Size(days=700, hourly_gap=0.0, start="2023-01-01", eval_batches=2000, timeout_s=3 * 3600),
    "full": Size(days=7_670, hourly_gap=0.0, start="2005-01-01", eval_batches=2000, timeout_s=6 * 3600),
}

# case A at two intervals as configs/full_market_multi_interval.json has them, on all the data;
# a tiny model without dropout (ranks then match one process), a few steps, the CPU on purpose
# (the local cluster's GPUs are files)
DATA = ['data.intervals=["1d","1h"]', "data.interval_split=per_interval"]
MODEL = [
    "model.vocab_size=64",
    "model.context_length=16",
    "model.d_model=32",
    "model.num_layers=2",
    "model.num_heads=2",
    "model.d_ff=64",
    "model.asset_embed_dim=4",
    "model.category_embed_dim=4",
    "model.dropout=0.0",
]
TRAINING = [
    "training.device=cpu",
    "training.compile=false",
    f"training.epochs={EPOCHS}",
    f"training.max_steps_per_epoch={STEPS}",
    "training.grad_accum_steps=2",
    "training.eval_max_batches=3",
    "training.warmup_steps=4",
    "training.learning_rate=1e-3",
    "training.log_every_steps=1",
    "training.early_stopping_patience=100",
]
# the reversion fit is a final output like the scorecard, not what the rehearsal tries: off in both
SCORECARD = ["training.scorecard_origins=4", "training.scorecard_samples=20", "training.vol_reversion=false"]
NO_SCORECARD = ["training.scorecard_origins=0", "training.vol_reversion=false"]


def overrides(size: Size, *extra: str) -> list[str]:
    return [*DATA, f"data.start_date={size.start}", *MODEL, *TRAINING, *extra]


def sets(kvs: Sequence[str]) -> list[str]:
    return [arg for kv in kvs for arg in ("--set", kv)]


# --------------------------------------------------------------------------- process records

# Written into the rehearsal's PYTHONPATH: every Python process it starts, wherever Slurm runs it,
# leaves one JSON record when it exits (peak RSS from the kernel, bytes read, who it was).
SITECUSTOMIZE = '''"""Rehearsal: each process's peak RSS and bytes read, recorded at exit (bench/rehearsal/base.py)."""
import atexit, json, os, resource, sys, threading, time

_DIR, _T0 = os.environ.get("MARKETGPT_REHEARSAL_RUSAGE"), time.time()
_ANON = [0]  # peak RssAnon in kB: the process's own memory, without the file pages of its memory maps


def _sample_anon():
    # peak RSS counts the page cache of memory-mapped token files, which the kernel reclaims at
    # will; RssAnon sampled every 50 ms is what the process itself holds
    while True:
        try:
            with open("/proc/self/status") as f:
                for line in f:
                    if line.startswith("RssAnon:"):
                        _ANON[0] = max(_ANON[0], int(line.split()[1]))
                        break
        except OSError:
            return
        time.sleep(0.05)


def _record():
    try:
        with open("/proc/self/io") as f:
            io = {k: int(v) for k, v in (line.split(": ") for line in f.read().splitlines())}
    except OSError:
        io = {}
    env = os.environ
    record = {"pid": os.getpid(), "argv": sys.argv, "stage": env.get("MARKETGPT_REHEARSAL_STAGE"),
              "job": env.get("SLURM_ARRAY_JOB_ID") or env.get("SLURM_JOB_ID"),
              "task": env.get("SLURM_ARRAY_TASK_ID"), "rank": env.get("SLURM_PROCID"),
              "restart": env.get("SLURM_RESTART_COUNT"), "wall_s": round(time.time() - _T0, 2),
              "max_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
              "max_anon_mb": round(_ANON[0] / 1024, 1) or None,
              "read_bytes": io.get("read_bytes"), "rchar": io.get("rchar")}
    with open(os.path.join(_DIR, "%d-%d.json" % (os.getpid(), time.time_ns())), "w") as f:
        json.dump(record, f)


if _DIR:
    threading.Thread(target=_sample_anon, daemon=True).start()
    atexit.register(_record)
    _os_exit = os._exit

    def _exit(code):  # a process that ran torch.distributed leaves this way (common/cli/), past atexit
        _record()
        _os_exit(code)

    os._exit = _exit
'''


class Rehearsal:
    """The scratch repo copy, the environment every command runs in, the stages' records."""

    def __init__(self, root: Path, size_name: str) -> None:
        self.root, self.size_name, self.size = root, size_name, SIZES[size_name]
        self.repo = copy_repo(root / "repo")
        self.case = self.repo / CASE
        self.rusage = root / "rusage"
        self.rusage.mkdir()
        hook = root / "hook"
        hook.mkdir()
        (hook / "sitecustomize.py").write_text(SITECUSTOMIZE)
        self.env = {
            k: v
            for k, v in os.environ.items()
            if k == "SLURM_CONF" or not k.startswith(("SLURM_", "SUBMITIT_", "MARKETGPT_"))
        }
        self.env.update(
            {
                "PYTHONPATH": f"{self.repo}{os.pathsep}{hook}",
                "MARKETGPT_PYTHON": sys.executable,
                "OMP_NUM_THREADS": "1",
                "PYTHONUNBUFFERED": "1",
                "MARKETGPT_DIST_TIMEOUT": "60",
                "MARKETGPT_REHEARSAL_RUSAGE": str(self.rusage),
            }
        )
        self.stages: dict[str, dict[str, Any]] = {}
        self.checks: list[dict[str, Any]] = []
        self.outputs: dict[str, str] = {}
        self.commands: list[dict[str, Any]] = []  # each `marketgpt` command run here: seconds, exit code
        self.jobs: list[str] = []  # every job submitted: cancelled at the end, whatever happened
        self.plan: dict[str, dict[str, dict[str, int]]] = {}  # plan's per-interval and per-category counts
        self.rounds: dict[str, dict[str, Any]] = {}  # the array preparation's rounds: shard, publisher

    def env_for(self, stage: str) -> dict[str, str]:
        return {**self.env, "MARKETGPT_REHEARSAL_STAGE": stage}

    def cli(self, stage: str, *args: str) -> subprocess.CompletedProcess:
        """`marketgpt ARGS` from the repo copy; its output kept under `stage` in the report."""
        t0 = time.monotonic()
        proc = subprocess.run(
            [sys.executable, "-m", "common.cli", *args],
            cwd=self.repo,
            env=self.env_for(stage),
            capture_output=True,
            text=True,
            timeout=self.size.timeout_s,
        )
        what = f"{stage}: marketgpt {' '.join(a for a in args[:2] if not a.startswith('-') and '/' not in a)}"
        self.commands.append({"command": what, "seconds": round(time.monotonic() - t0, 1), "exit": proc.returncode})
        self.outputs[what] = proc.stdout[-6000:] + proc.stderr[-3000:]
        return proc

    def stage(self, name: str, fn: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        """Run one stage, timed; its figures (and an error, if it raised) go into the report."""
        print(f"--- {name}", flush=True)
        t0 = time.monotonic()
        try:
            figures = fn() or {}
        except Exception as e:  # noqa: BLE001 (the report says what broke; later stages still run)
            figures = {"error": f"{type(e).__name__}: {e}"[:3000]}
        self.stages[name] = {"seconds": round(time.monotonic() - t0, 1), **figures}
        print(
            f"    {self.stages[name]['seconds']} s"
            + (f"  ERROR {figures['error'][:500]}" if "error" in figures else ""),
            flush=True,
        )
        return figures

    def check(self, result: dict[str, Any]) -> None:
        """Record one check's result (bench/rehearsal/checks.py)."""
        self.checks.append(result)
        print(f"    [{'PASS' if result['ok'] else 'FAIL'}] {result['check']}: {result['detail']}", flush=True)

    def processes(self) -> dict[str, list[dict[str, Any]]]:
        """The exit records, by stage."""
        out: dict[str, list[dict[str, Any]]] = {}
        for path in sorted(self.rusage.glob("*.json")):
            record = json.loads(path.read_text())
            out.setdefault(record["stage"] or "?", []).append(record)
        return out


def copy_repo(dst: Path) -> Path:
    """What the jobs need (common/, case A without its runs, logs and candles) under `dst`."""
    code = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(REPO / "common", dst / "common", ignore=code)
    shutil.copytree(
        REPO / CASE, dst / CASE, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "checkpoints", "logs", "data")
    )
    return dst


def shard_of(r: Rehearsal, *extra: str) -> Path:
    """The shard folder of the rehearsal's config (with `extra` settings)."""
    from common.config import load_config
    from common.tokens.shard_paths import shard_folder

    return shard_folder(load_config(r.repo / CONFIG, overrides(r.size, *extra)), r.case)[0]


def submit_job(r: Rehearsal, stage: str, job_sets: Sequence[str], **env: str) -> str:
    """sbatch the case script on NODES nodes with `job_sets` (from the repo copy, in `stage`'s
    environment plus `env`); its job id, recorded to be cancelled at the end."""
    proc = subprocess.run(
        ["sbatch", "--parsable", f"--nodes={NODES}", SCRIPT, *sets(job_sets)],
        cwd=r.repo,
        env={**r.env_for(stage), **env},
        capture_output=True,
        text=True,
        timeout=60,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"sbatch failed: {proc.stderr}")
    job = proc.stdout.strip().split(";")[0]
    r.jobs.append(job)
    return job


def squeue(job: str) -> dict[str, str]:
    """Job or array task id -> state, of what the queue still holds."""
    out = subprocess.run(
        ["squeue", "-h", "-r", "-j", job, "-o", "%i %T"], capture_output=True, text=True, timeout=60
    ).stdout
    return dict(line.split() for line in out.splitlines() if line.strip())


def wait_jobs(jobs: Sequence[str], timeout_s: float) -> dict[str, str]:
    """Each job's (or array task's) final state."""
    from common.distributed.scheduler import wait_for_jobs

    return wait_for_jobs(list(jobs), timeout_s=timeout_s, poll_s=2.0) if jobs else {}


def run_dirs(r: Rehearsal, experiment: str) -> list[Path]:
    return sorted((r.case / "checkpoints").glob(f"{experiment}_*"))
