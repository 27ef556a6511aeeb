"""A rehearsal of case A's real job at full data size, on the local Slurm cluster (tools/local_slurm),
driven as a user drives it, with faults injected on the way:

    python bench/rehearsal.py [--size reduced|full] [--json PATH] [--keep] [--root DIR]

1. corpus   case A's universe (600 assets: yfinance stocks and commodities, ccxt crypto pairs) as a
            synthetic market (common.data.synthetic), 1h candles and the 1d candles made from them,
            written by CandleCache into a throwaway repo copy's case_a_full_market/data: the layout
            `marketgpt data download` leaves. full: 115M candles; reduced: 1.26M.
2. plan     `marketgpt plan` and `marketgpt data check` of case A's config with data.intervals
            ["1d", "1h"] (per-interval splits) and a tiny model through --set, on all the data.
3. prepare  `marketgpt data prepare --array 8` on Slurm, submitted twice, one encode task
            SIGKILLed while it runs, a `marketgpt train` started meanwhile; then resubmitted until the
            shard is there, as a user would. A one-process `data prepare` of the same candles (hard
            links, another data.cache_dir) is the reference its files must equal.
4. train    case_a_full_market/slurm_scripts/train_full_a100.sh with --nodes=2 (2 ranks each, gloo
            on the CPU), forced to requeue twice (USR2 to the batch shell), against one uninterrupted
            process training the same global batch; the end-of-training scorecard included.
5. after    `marketgpt benchmark RUN` (refused where the fixed tasks precede the cut-off, else the
             tasks after it answered), then with
             `--after-cutoff`, and `marketgpt status`.

Every Python process of the rehearsal (Slurm array tasks and DDP ranks included) records its peak
RSS (getrusage), its peak private memory (RssAnon, sampled every 50 ms: RSS without the page
cache of memory-mapped files) and bytes read (/proc/self/io) when it exits, through a
sitecustomize.py on its PYTHONPATH; a process killed by a signal leaves no record. The JSON report holds the sizes, each
stage's time and processes, and the checks (each pass or fail with its numbers). Exits 0 whatever
the checks say: it reports, it does not gate (tests/test_rehearsal.py does).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

REPO = Path(__file__).resolve().parent.parent
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
WEIGHT_ATOL = 2e-5  # tests/ddp_helpers.assert_same_run's tolerance


@dataclass(frozen=True)
class Size:
    days: int  # the 1d candles per asset; the 1h ones are made first and the 1d from them
    hourly_gap: float  # the share of hours without a candle (a stock trades some 7 hours a day)
    start: str  # the first candle, and data.start_date
    eval_batches: Optional[int]  # the job's training.eval_max_batches (None: every val and test token)
    timeout_s: int  # the longest a stage may take


SIZES = {  # 600 x (1,800 + 300) = 1.26M candles; 600 x (16,800 + 700) = 10.5M; 600 x (184,080 + 7,670) = 115M
    "reduced": Size(days=300, hourly_gap=0.75, start="2023-01-01", eval_batches=None, timeout_s=1800),
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
SCORECARD = ["training.scorecard_origins=4", "training.scorecard_samples=20"]
NO_SCORECARD = ["training.scorecard_origins=0"]


def overrides(size: Size, *extra: str) -> list[str]:
    return [*DATA, f"data.start_date={size.start}", *MODEL, *TRAINING, *extra]


def sets(kvs: Sequence[str]) -> list[str]:
    return [arg for kv in kvs for arg in ("--set", kv)]


# --------------------------------------------------------------------------- process records

# Written into the rehearsal's PYTHONPATH: every Python process it starts, wherever Slurm runs it,
# leaves one JSON record when it exits (peak RSS from the kernel, bytes read, who it was).
SITECUSTOMIZE = '''"""Rehearsal: each process's peak RSS and bytes read, recorded at exit (bench/rehearsal.py)."""
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

    def check(self, name: str, ok: bool, detail: str, **numbers: Any) -> None:
        self.checks.append({"check": name, "ok": bool(ok), "detail": detail, **numbers})
        print(f"    [{'PASS' if ok else 'FAIL'}] {name}: {detail}", flush=True)

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


# --------------------------------------------------------------------------- 1. the corpus


def _write_assets(case: str, size: Size, indices: list[int], exchange: str) -> int:
    """Assets `indices` of the universe, 1h and 1d, into the case's candle cache; returns candles."""
    from common.data.cache import CandleCache
    from common.data.download import YAHOO_ORIGIN
    from common.data.synthetic import aggregate, generate_asset
    from common.data.universe import load_universe
    from common.synthetic_spec import SyntheticSpec

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


# --------------------------------------------------------------------------- 2. plan and check

_COUNT_ROW = re.compile(r"^\s{4}(\S+)\s+(\d[\d,]*) series\s+(\d[\d,]*) candles\s+(\d[\d,]*) train", re.M)


def plan_counts(text: str) -> dict[str, dict[str, dict[str, int]]]:
    """plan's 'per interval' and 'per category' tables: name -> series, candles (= tokens), train."""
    out: dict[str, dict[str, dict[str, int]]] = {}
    for block in ("per interval", "per category"):
        start = text.find(f"  {block}:")
        if start < 0:
            continue
        end = text.find("\n  per ", start + 1)
        rows = _COUNT_ROW.findall(text[start : end if end > 0 else None])
        out[block.split()[1]] = {
            name: {"series": _int(s), "candles": _int(c), "train": _int(t)} for name, s, c, t in rows
        }
    return out


def _int(text: str) -> int:
    return int(text.replace(",", ""))


def plan_and_check(r: Rehearsal) -> dict[str, Any]:
    plan = r.cli("plan", "plan", "--config", CONFIG, *sets(overrides(r.size)))
    check = r.cli("plan", "data", "check", "--case", CASE, "--config", CONFIG, *sets(overrides(r.size)))
    r.plan = plan_counts(plan.stdout)
    head = plan.stdout.splitlines()[0] if plan.stdout else ""
    r.check(
        "plan and data check run",
        plan.returncode == 0 and check.returncode == 0,
        f"plan exit {plan.returncode}, data check exit {check.returncode}; {head}",
    )
    return {
        "plan_exit": plan.returncode,
        "check_exit": check.returncode,
        "plan_first_line": head,
        "plan_counts": r.plan,
    }


# --------------------------------------------------------------------------- 3. the array preparation

_SUBMITTED = re.compile(r"^Submitted job (\d+)(?: \((\d+) tasks[^)]*\))?: (\w+)", re.M)


def shard_of(r: Rehearsal, *extra: str) -> Path:
    from common.config import load_config
    from common.tokens.shard_paths import shard_folder

    return shard_folder(load_config(r.repo / CONFIG, overrides(r.size, *extra)), r.case)[0]


def submit_array(r: Rehearsal, tag: str) -> dict[str, list[str]]:
    """`marketgpt data prepare --array 8`: stage -> its job ids (array tasks as ID_TASK); {} when
    nothing was submitted (the shard is there)."""
    proc = r.cli(tag, "data", "prepare", "--config", CONFIG, *sets(overrides(r.size)), "--array", str(ARRAY))
    if proc.returncode != 0:
        raise RuntimeError(f"data prepare --array exit {proc.returncode}: {proc.stderr[-2000:]}")
    jobs = {
        stage: [f"{job}_{i}" for i in range(int(tasks))] if tasks else [job]
        for job, tasks, stage in _SUBMITTED.findall(proc.stdout)
    }
    r.jobs.extend(job.split("_")[0] for ids in jobs.values() for job in ids[:1])
    return jobs


def squeue(job: str) -> dict[str, str]:
    """Job or array task id -> state, of what the queue still holds."""
    out = subprocess.run(
        ["squeue", "-h", "-r", "-j", job, "-o", "%i %T"], capture_output=True, text=True, timeout=60
    ).stdout
    return dict(line.split() for line in out.splitlines() if line.strip())


def task_pids(r: Rehearsal, array: str, task: str) -> list[int]:
    """The Python processes of one array task (this machine runs the local cluster's nodes)."""
    want = {f"SLURM_ARRAY_JOB_ID={array}", f"SLURM_ARRAY_TASK_ID={task}", f"MARKETGPT_REHEARSAL_RUSAGE={r.rusage}"}
    pids = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            env = set((proc / "environ").read_bytes().decode(errors="replace").split("\0"))
            argv0 = (proc / "cmdline").read_bytes().split(b"\0")[0].decode(errors="replace")
            if want <= env and Path(argv0).name.startswith("python"):  # not srun, not the batch shell
                pids.append(int(proc.name))
        except OSError:  # gone, or not ours
            continue
    return pids


def kill_one_encode_task(r: Rehearsal, encode: list[str], deadline: float) -> dict[str, Any]:
    """SIGKILL the Python process of one encode task a second after its log says it encodes: what
    a node failure or the OOM killer does mid-write (scancel would send SIGTERM first)."""
    logs = r.case / "logs" / f"prepare_{shard_of(r).name}"
    array = encode[0].split("_")[0] if encode else ""
    while array and time.monotonic() < deadline:
        states = squeue(array)
        if not states:
            return {"killed": None, "why": "the encode tasks had all left the queue before one could be killed"}
        for task, state in states.items():
            log = logs / f"{task}_0_log.out"
            if state == "RUNNING" and log.is_file() and "the encode stage" in log.read_text():
                time.sleep(1.0)
                pids = task_pids(r, array, task.split("_")[1])
                for pid in pids:
                    os.kill(pid, signal.SIGKILL)
                if pids:
                    return {"killed": task, "pids": pids, "log_when_killed": log.read_text()[-300:]}
        time.sleep(0.1)
    return {"killed": None, "why": "no encode task ran before the deadline"}


def wait_jobs(jobs: Sequence[str], timeout_s: float) -> dict[str, str]:
    from common.slurm.scheduler import wait_for_jobs

    return wait_for_jobs(list(jobs), timeout_s=timeout_s, poll_s=2.0) if jobs else {}


def prepare_on_slurm(r: Rehearsal) -> dict[str, Any]:
    deadline = time.monotonic() + r.size.timeout_s
    first = submit_array(r, "prepare")
    second = submit_array(r, "prepare")  # the same array again, by mistake or from a second shell
    # a training started before the shard is there (in this machine's process, not a job)
    train_cmd = [
        sys.executable,
        "-m",
        "common.cli",
        "train",
        "--config",
        CONFIG,
        *sets(
            overrides(
                r.size,
                "training.epochs=1",
                "training.max_steps_per_epoch=3",
                "experiment=during_prepare",
                *NO_SCORECARD,
            )
        ),
    ]
    train = subprocess.Popen(
        train_cmd, cwd=r.repo, env=r.env_for("prepare"), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    kill = kill_one_encode_task(r, first.get("encode", []), deadline) if first else {"killed": None}
    ids = [j for sub in (first, second) for jobs in sub.values() for j in jobs]
    states = wait_jobs(ids, max(1.0, deadline - time.monotonic()))
    train_out, _ = train.communicate(timeout=max(1.0, deadline - time.monotonic()))
    r.outputs["prepare: marketgpt train (started during the preparation)"] = train_out[-6000:]
    resubmits: list[dict[str, str]] = []
    shard = shard_of(r)
    while not (shard / "manifest.json").is_file() and len(resubmits) < 3:  # what a user does: submit again
        again = submit_array(r, "prepare")
        resubmits.append(wait_jobs([j for jobs in again.values() for j in jobs], max(1.0, deadline - time.monotonic())))
    r.check(
        "the array preparation ends with a shard",
        (shard / "manifest.json").is_file() and not (shard / "work").exists(),
        f"{shard.name}: manifest.json "
        f"{'there' if (shard / 'manifest.json').is_file() else 'missing'} after {len(resubmits)} resubmission(s)",
    )
    r.check(
        "a training started during the preparation finishes",
        train.returncode == 0,
        f"exit {train.returncode}: {train_out.strip().splitlines()[-1] if train_out.strip() else ''}",
    )
    return {
        "first_submission": first,
        "second_submission": second,
        "states": states,
        "kill": kill,
        "resubmissions": resubmits,
        "train_during_prepare_exit": train.returncode,
        "shard": shard.name,
    }


def link_tree(src: Path, dst: Path) -> None:
    """The candle files (not the shards) hard-linked under `dst`: the same bytes, no more disk."""
    shutil.copytree(src, dst, copy_function=os.link, ignore=shutil.ignore_patterns("shards", "*.lock"))


def file_hashes(folder: Path) -> dict[str, str]:
    out = {}
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        digest = hashlib.sha256()
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
        out[path.relative_to(folder).as_posix()] = digest.hexdigest()
    return out


def prepare_in_one_process(r: Rehearsal) -> dict[str, Any]:
    """The reference: `marketgpt data prepare` without --array, on the same candles in another
    data.cache_dir; the array's shard must hold the same files, byte for byte."""
    link_tree(r.case / "data", r.case / "data_single")
    proc = r.cli(
        "prepare_single", "data", "prepare", "--config", CONFIG, *sets(overrides(r.size, "data.cache_dir=data_single"))
    )
    array, single = shard_of(r), shard_of(r, "data.cache_dir=data_single")
    a = file_hashes(array) if array.is_dir() else {}
    b = file_hashes(single) if single.is_dir() else {}
    # manifest.json names its own folder and inputs (the cache_dir's paths): compared apart
    differ = sorted(k for k in set(a) | set(b) if k != "manifest.json" and a.get(k) != b.get(k))
    r.check(
        "the array's shard equals a one-process preparation",
        proc.returncode == 0 and bool(b) and not differ,
        f"{len(b)} files by sha256, {len(differ)} differ"
        + (
            f": {differ[:8]} (replaced by the one-process files, so the stages after test themselves)" if differ else ""
        ),
        files=len(b),
        differ=differ,
    )
    for name in differ if b else []:  # what a user does on a broken shard: prepare it again
        (array / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(single / name, array / f"{name}.repair")
        os.replace(array / f"{name}.repair", array / name)  # new files: a run's hard links keep the old
    return {
        "exit": proc.returncode,
        "files": len(b),
        "differ": differ,
        "repaired": bool(differ and b),
        "bytes": sum(p.stat().st_size for p in single.rglob("*") if p.is_file()) if single.is_dir() else 0,
    }


# --------------------------------------------------------------------------- 4. the case script under DDP


def job_log(r: Rehearsal, job: str, err: bool = False) -> str:
    """The job's .out log (offsets stay put as it grows), with the end of its .err after it if `err`."""
    path = r.case / "logs" / f"{LOG_PREFIX}_{job}.out"
    errors = path.with_suffix(".err")
    return (path.read_text() if path.exists() else "") + (errors.read_text()[-3000:] if err and errors.exists() else "")


def wait_log(r: Rehearsal, job: str, pattern: re.Pattern, after: int, deadline: float) -> int:
    """The offset of `pattern`'s first match past `after` in the job's log (polled)."""
    while time.monotonic() < deadline:
        m = pattern.search(job_log(r, job), after)
        if m:
            return m.end()
        if not squeue(job):
            raise RuntimeError(
                f"job {job} ended before its log showed {pattern.pattern!r}:\n{job_log(r, job, err=True)[-2000:]}"
            )
        time.sleep(0.1)
    raise TimeoutError(f"no {pattern.pattern!r} in job {job}'s log in time:\n{job_log(r, job, err=True)[-2000:]}")


def force_requeues(r: Rehearsal, job: str, times: int, deadline: float) -> list[str]:
    """USR2 to the batch shell (what --signal=B:USR2@600 sends before the time limit), `times`
    times: at step 3 of the first start, then at the first step each restart trains after its resume.
    Returns where each signal found the job (the last step its log showed)."""
    step = re.compile(r"epoch (\d+)/\d+ step (\d+)/\d+")
    sent, at = [], 0
    for n in range(times):
        if n:  # the restart's own steps, after its resume
            at = wait_log(r, job, re.compile(rf"restart {n} =====.*?Resuming at epoch", re.S), at, deadline)
        at = wait_log(r, job, step, at, deadline)
        if n == 0:  # a few steps in, so the first checkpoint is mid-epoch
            at = wait_log(r, job, re.compile(r"epoch 1/\d+ step [3-9]/\d+"), at, deadline)
        subprocess.run(["scancel", "--signal=USR2", "--batch", job], env=r.env, timeout=60, check=True)
        sent.append(step.findall(job_log(r, job)[:at])[-1:])
        at = wait_log(r, job, re.compile(r"requeueing job"), at, deadline)
    return [f"epoch {e} step {s}" for ((e, s),) in sent]


def run_dirs(r: Rehearsal, experiment: str) -> list[Path]:
    return sorted((r.case / "checkpoints").glob(f"{experiment}_*"))


def final_weights(run_dir: Path) -> dict:
    import torch

    return torch.load(run_dir / f"checkpoint_epoch_{EPOCHS}.pt", weights_only=True, map_location="cpu")["model"]


def train_under_slurm(r: Rehearsal) -> dict[str, Any]:
    from common.slurm.scheduler import job_info

    deadline = time.monotonic() + r.size.timeout_s
    ranks = NODES * TASKS_PER_NODE
    # the reduced size's job evaluates every val and test token, so each category has test tokens
    job_sets = overrides(
        r.size,
        f"training.batch_size={GLOBAL_BATCH // ranks}",
        "experiment=ddp",
        *SCORECARD,
        f"training.eval_max_batches={json.dumps(r.size.eval_batches)}",
    )
    proc = subprocess.run(
        ["sbatch", "--parsable", f"--nodes={NODES}", SCRIPT, *sets(job_sets)],
        cwd=r.repo,
        env=r.env_for("train_slurm"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"sbatch failed: {proc.stderr}")
    job = proc.stdout.strip().split(";")[0]
    r.jobs.append(job)
    signalled = force_requeues(r, job, 2, deadline)
    state = wait_jobs([job], max(1.0, deadline - time.monotonic()))[job]
    info = job_info(job) or {}
    log = job_log(r, job, err=True)
    r.outputs["train_slurm: job log"] = log[-8000:]
    restarts, exit_code = info.get("Restarts"), info.get("ExitCode")
    # what a user reads in the log: every start trains on all ranks, each requeue saves and
    # resumes, and rank 0 alone prints the epochs, once each
    lines = {
        "DDP starts": log.count(f"DDP: {ranks} processes (gloo)"),
        "batch lines": log.count(f"({GLOBAL_BATCH // ranks} per process x {ranks} processes x 2 accumulation)"),
        "requeues": log.count(f"requeueing job {job}"),
        "resumes": log.count("Resuming at epoch "),
        "last epoch lines": log.count(f"Epoch {EPOCHS}/{EPOCHS}"),
    }
    r.check(
        "the case script's job requeues twice, then finishes",
        (state, exit_code, restarts) == ("COMPLETED", "0:0", "2")
        and lines == {"DDP starts": 3, "batch lines": 3, "requeues": 2, "resumes": 2, "last epoch lines": 1},
        f"state {state}, exit {exit_code}, restarts {restarts}, signalled at {signalled}; the log's {lines}",
    )
    return {"job": job, "state": state, "exit_code": exit_code, "restarts": restarts, "signalled_at": signalled}


def reference_run(r: Rehearsal) -> dict[str, Any]:
    """One process, the global batch, the same steps, no interruption: what the job must equal."""
    # the job's evaluation settings, so its logged validation losses compare too
    proc = r.cli(
        "reference",
        "train",
        "--config",
        CONFIG,
        *sets(
            overrides(
                r.size,
                f"training.batch_size={GLOBAL_BATCH}",
                "experiment=reference",
                *NO_SCORECARD,
                f"training.eval_max_batches={json.dumps(r.size.eval_batches)}",
            )
        ),
    )
    ddp, ref = run_dirs(r, "ddp"), run_dirs(r, "reference")
    if proc.returncode != 0 or len(ddp) != 1 or len(ref) != 1:
        r.check(
            "the requeued weights equal an uninterrupted run",
            False,
            f"reference exit {proc.returncode}, run folders: ddp {len(ddp)}, reference {len(ref)}",
        )
        return {"exit": proc.returncode}
    a, b = final_weights(ddp[0]), final_weights(ref[0])
    diff = max(float((a[k].double() - b[k].double()).abs().max()) for k in a) if a.keys() == b.keys() else float("inf")
    r.check(
        "the requeued weights equal an uninterrupted run",
        diff < WEIGHT_ATOL,
        f"largest weight difference {diff:.3g} (tolerance {WEIGHT_ATOL})",
        max_weight_difference=diff,
    )
    mine, theirs = logged_epochs(ddp[0]), logged_epochs(ref[0])
    worst = _worst_log_difference(mine, theirs)
    r.check(
        "the requeued job logged the losses of an uninterrupted run",
        [e["epoch"] for e in mine] == [e["epoch"] for e in theirs] and worst <= 1.0,
        f"epochs {[e['epoch'] for e in mine]} vs {[e['epoch'] for e in theirs]}; largest difference "
        f"{worst:.3g} of its tolerance (losses 1e-5 relative, accuracies 1e-3)",
    )
    log = json.loads((ddp[0] / "training_log.json").read_text())
    kept = {k: log.get(k) for k in ("status", "world_size", "launcher", "slurm_job_id")}
    r.outputs["train_slurm: training_log"] = json.dumps({**kept, "resumes": len(log.get("resumes", []))})
    return {"exit": proc.returncode, "max_weight_difference": diff}


def logged_epochs(run_dir: Path) -> list[dict]:
    log = json.loads((run_dir / "training_log.json").read_text())
    return [{k: e[k] for k in ("epoch", "train_loss", "train_acc", "val_loss", "val_acc")} for e in log["epochs"]]


def _worst_log_difference(mine: list[dict], ref: list[dict]) -> float:
    """The largest difference of two runs' logged numbers, as a share of its tolerance: losses
    1e-5 relative, accuracies 1e-3 (exact counts, unless an argmax tie flips)."""
    worst = 0.0
    for a, b in zip(mine, ref):
        for key in ("train_loss", "val_loss"):
            worst = max(worst, abs(a[key] - b[key]) / (1e-5 * abs(b[key])))
        for key in ("train_acc", "val_acc"):
            worst = max(worst, abs(a[key] - b[key]) / 1e-3)
    return worst


# --------------------------------------------------------------------------- 5. the run's outputs


def _counts_by(data_info: dict, key: Callable[[str, dict], str]) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for name, a in data_info.get("assets", {}).items():
        c = out.setdefault(key(name, a), {"series": 0, "candles": 0, "train": 0, "test": 0, "test_series": 0})
        c["series"] += 1
        c["candles"] += a.get("train", 0) + a.get("val", 0) + a.get("test", 0)
        c["train"] += a.get("train", 0)
        c["test"] += a.get("test", 0)
        c["test_series"] += a.get("test", 0) > 0
    return out


_PLAN_KEYS = ("series", "candles", "train")


def check_outputs(r: Rehearsal) -> dict[str, Any]:
    """Every interval and category in data_info.json (with plan's counts) and in test_results.json
    (with test tokens); the scorecard training wrote; benchmark and status on the run."""
    (run_dir,) = run_dirs(r, "ddp")
    info = json.loads((run_dir / "data_info.json").read_text())
    results = json.loads((run_dir / "test_results.json").read_text())
    plan = r.plan
    seen = {
        "interval": _counts_by(info, lambda name, a: name.rpartition("@")[2]),
        "category": _counts_by(info, lambda name, a: a.get("category", "?")),
    }
    for what, table in (("interval", "per_interval"), ("category", "per_category")):
        want = plan.get(what, {})
        names = INTERVALS if what == "interval" else sorted(want) or r.stages["corpus"].get("categories", [])
        got = {n: {k: c[k] for k in _PLAN_KEYS} for n, c in seen[what].items()}
        wrong = {n: {"plan": want.get(n), "data_info": got.get(n)} for n in names if want.get(n) != got.get(n)}
        r.check(
            f"every {what} in data_info.json with plan's token counts",
            bool(want) and not wrong,
            f"{len(names) - len(wrong)} of {len(names)} match" + (f"; differ: {wrong}" if wrong else ""),
        )
        # every test token but each series' first is scored, when nothing caps the evaluation
        tested = {n: _tested(results, table, n) for n in names}
        expected = {
            n: seen[what].get(n, {}).get("test", 0) - seen[what].get(n, {}).get("test_series", 0) for n in names
        }
        capped = r.size.eval_batches is not None
        wrong = [n for n in names if not tested[n] or (not capped and tested[n] != expected[n])]
        r.check(
            f"every {what} in test_results.json",
            not wrong,
            f"test tokens {tested}"
            + (" (evaluation capped)" if capped else f", data_info's test candles less one a series {expected}")
            + (f"; wrong: {wrong}" if wrong else ""),
        )
    card = run_dir / "scorecard.json"
    origins = json.loads(card.read_text()).get("origins", {}) if card.is_file() else {}
    drawn = re.search(r"(\d+) drawn", origins.get("drawn", ""))
    forecasts = int(drawn.group(1)) if drawn else None
    r.check(
        "training wrote its scorecard, within its budget",
        card.is_file() and forecasts is not None and forecasts <= origins.get("budget", 0),
        f"{origins.get('drawn')} (budget {origins.get('budget')})"
        if card.is_file()
        else f"no scorecard.json: {results.get('scorecard_error', 'no error recorded')}",
    )
    # where the run's cut-off (its test start) is after every fixed task's start: one line and a
    # non-zero exit, then the way out it names, a task of the same scheme on the run's own candles
    # after the cut-off; where some task starts after it (the full size's data since 2005), those
    # are answered and the others left out as leaked
    fixed = r.cli("after", "benchmark", str(run_dir), "--samples", "20", "--no-leaderboard", "--json")
    said = fixed.stderr.strip()
    before, after = _fixed_tasks_around(run_dir)
    if not after:
        r.check(
            "marketgpt benchmark says the fixed tasks precede the cut-off",
            fixed.returncode == 2 and "\n" not in said and "--after-cutoff" in said,
            f"exit {fixed.returncode}: {said[:300]}",
        )
    else:
        aggregate, excluded = _benchmark_answer(fixed.stdout)
        r.check(
            "marketgpt benchmark answers the fixed tasks after the cut-off, leaves out those before",
            fixed.returncode == 0
            and aggregate is not None
            and set(before) <= set(excluded)
            and not set(after) & set(excluded),
            f"exit {fixed.returncode}, aggregate skill {aggregate}; after the cut-off {after}, before it "
            f"{before}; left out: {excluded}" + (f"; {said[-300:]}" if fixed.returncode else ""),
        )
    bench = r.cli("after", "benchmark", str(run_dir), "--after-cutoff", "--samples", "20", "--json")
    aggregate, excluded = _benchmark_answer(bench.stdout)
    r.check(
        "marketgpt benchmark --after-cutoff answers (not n/a)",
        bench.returncode == 0 and aggregate is not None,
        f"exit {bench.returncode}, aggregate skill {aggregate}; tasks left out: {excluded}"
        + (f"; {bench.stderr.strip()[-400:]}" if bench.returncode else ""),
    )
    status = r.cli("after", "status", "--case", CASE)
    r.check(
        "marketgpt status lists the run",
        status.returncode == 0 and run_dir.name in status.stdout,
        f"exit {status.returncode}",
    )
    return {"run": run_dir.name, "benchmark_exit": bench.returncode, "status_exit": status.returncode}


def _fixed_tasks_around(run_dir: Path) -> tuple[list[str], list[str]]:
    """The fixed benchmark tasks at the run's first interval that start before its data cut-off,
    and those that start at or after it."""
    import pandas as pd

    from common.evaluation.benchmark_tasks import choose_tasks, data_cutoff

    cutoff = data_cutoff(run_dir)
    tasks = [t for t in choose_tasks(None) if t.interval == INTERVALS[0]]
    start = lambda t: pd.Timestamp(t.start, tz="UTC")  # noqa: E731
    return (
        [t.name for t in tasks if cutoff is None or start(t) < cutoff],
        [t.name for t in tasks if cutoff is not None and start(t) >= cutoff],
    )


def _tested(results: dict, table: str, name: str) -> int:
    """Test tokens of one interval, or of one category over every interval, in test_results.json."""
    intervals = results.get("per_interval") or {}
    if table == "per_interval":
        return intervals.get(name, {}).get("num_tokens", 0)
    return sum(
        (r.get("per_category") or {}).get(name, {}).get("num_tokens", 0) for r in (intervals or {"": results}).values()
    )


def _benchmark_answer(text: str) -> tuple[Optional[float], dict[str, str]]:
    """The benchmark's aggregate skill (None: n/a) and the tasks it left out, with why."""
    try:
        aggregate = json.loads(text[text.index("{") :])["aggregate"]
    except (ValueError, KeyError):
        return None, {"*": "no JSON result"}
    return aggregate.get("value"), aggregate.get("excluded", {})


# --------------------------------------------------------------------------- the report


def summarize(processes: dict[str, list[dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    """Per stage: the processes, the largest peak RSS (and whose), the bytes read."""
    out = {}
    for stage, records in processes.items():
        top = max(records, key=lambda p: p["max_rss_mb"])
        anon = max(records, key=lambda p: p.get("max_anon_mb") or 0)
        out[stage] = {
            "processes": len(records),
            "max_rss_mb": top["max_rss_mb"],
            "max_rss_process": _who(top),
            "max_anon_mb": anon.get("max_anon_mb"),
            "max_anon_process": _who(anon),
            "read_bytes": sum(p["read_bytes"] or 0 for p in records),
            "rchar": sum(p["rchar"] or 0 for p in records),
        }
    return out


def _who(p: dict[str, Any]) -> str:
    """`cli train`, `submitit job 12_3`, `cli train job 48 rank 2`: which process a record is."""
    argv = p["argv"]
    what = (
        "submitit"
        if any("submitit" in a for a in argv)
        else "cli " + " ".join(a for a in argv[1:3] if not a.startswith("-"))
    )
    job = (f" job {p['job']}" + (f"_{p['task']}" if p["task"] else "")) if p["job"] else ""
    rank = f" rank {p['rank']}" if p["rank"] and "train" in argv else ""
    return f"{what}{job}{rank}"


def run(size: str, root: Path) -> dict[str, Any]:
    """Every stage in turn (a stage that breaks is reported and the next one still runs)."""
    r = Rehearsal(root, size)
    t0 = time.monotonic()
    r.stage("corpus", lambda: write_corpus(r))
    corpus = r.stages["corpus"]
    if "error" not in corpus:
        print(f"    {corpus['candles']:,} candles, {corpus['bytes_on_disk'] / 1e6:,.0f} MB on disk", flush=True)
    r.stage("plan", lambda: plan_and_check(r))
    r.stage("prepare", lambda: prepare_on_slurm(r))
    r.stage("prepare_single", lambda: prepare_in_one_process(r))
    r.stage("train_slurm", lambda: train_under_slurm(r))
    r.stage("reference", lambda: reference_run(r))
    r.stage("after", lambda: check_outputs(r))
    if r.jobs:  # a stage that broke may have left its jobs behind
        subprocess.run(["scancel", *r.jobs], env=r.env, timeout=60)
    for name, figures in r.stages.items():  # a stage that broke is a failed check too
        if "error" in figures:
            r.check(f"the {name} stage runs", False, figures["error"][:500])
    processes = r.processes()
    for name, summary in summarize(processes).items():
        r.stages.setdefault(name, {})["rusage"] = summary
    return {
        "name": "rehearsal",
        "size": size,
        "root": str(root),
        "seconds": round(time.monotonic() - t0, 1),
        "stages": r.stages,
        "commands": r.commands,
        "checks": r.checks,
        "passed": sum(c["ok"] for c in r.checks),
        "failed": [c["check"] for c in r.checks if not c["ok"]],
        "processes": processes,
        "outputs": r.outputs,
    }


def print_report(report: dict[str, Any]) -> None:
    print(f"\nRehearsal ({report['size']}): {report['seconds']} s")
    for name, s in report["stages"].items():
        u = s.get("rusage")
        rss = (
            (
                f"peak RSS {u['max_rss_mb']:,.0f} MB ({u['max_rss_process']}), "
                + (f"private {u['max_anon_mb']:,.0f} MB ({u['max_anon_process']}), " if u.get("max_anon_mb") else "")
                + f"{u['processes']} processes, "
                f"{u['read_bytes'] / 1e6:,.0f} MB read from disk"
                + (f", {u['rchar'] / 1e6:,.0f} MB read in all" if u["rchar"] is not None else "")
            )
            if u
            else ""
        )
        print(f"  {name:<15} {s.get('seconds', 0):>7.1f} s  {rss}")
    for c in report["commands"]:
        print(f"    {c['command']:<40} {c['seconds']:>7.1f} s  exit {c['exit']}")
    for c in report["checks"]:
        print(f"  [{'PASS' if c['ok'] else 'FAIL'}] {c['check']}: {c['detail'][:300]}")
    print(f"{report['passed']} of {len(report['checks'])} checks pass")


def main(argv: Optional[list[str]] = None) -> int:
    from common.slurm.scheduler import slurm_available

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", choices=list(SIZES), default="reduced")
    ap.add_argument(
        "--json",
        type=Path,
        default=None,
        help="write the report here (default: rehearsal_SIZE.json in the temp folder)",
    )
    ap.add_argument("--root", type=Path, default=None, help="the scratch folder (default: a new temp folder)")
    ap.add_argument("--keep", action="store_true", help="keep the scratch folder (corpus, shards, runs, logs)")
    args = ap.parse_args(argv)
    if not slurm_available():
        print("Slurm does not answer: start the local cluster first (tools/local_slurm/local_slurm.sh start --nodes 2)")
        return 1
    root = args.root or Path(tempfile.mkdtemp(prefix="rehearsal_"))
    try:
        report = run(args.size, root)
        print_report(report)
        path = args.json or Path(tempfile.gettempdir()) / f"rehearsal_{args.size}.json"
        path.write_text(json.dumps(report, indent=2, default=str) + "\n")
        print(f"report: {path}")
    finally:
        if args.keep:
            print(f"corpus, shards, runs and logs: {root}")
        else:  # the corpus is large: never left behind
            shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
