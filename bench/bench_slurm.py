"""How long the Slurm suite takes to get going, on the local cluster (tools/local_slurm):

- sbatch -> first training step: `sbatch case_c_crypto/slurm_scripts/train_crypto_a100.sh`
  (tiny model on the shipped sample, 2 tasks) until the log shows the first optimizer step,
  split into queue (sbatch -> RUNNING) and start-up (python, data, DDP, model);
- requeue -> resumed step: USR2 to the running job's batch shell (what #SBATCH
  --signal=B:USR2@600 sends before the time limit) until the requeued job logs its first step
  after the resume, split into signal -> checkpoint saved, -> requeued, -> running again (Slurm
  holds a requeued job for a while; AuthInfo=cred_expire=10 makes that ~20 s here) and start-up.

    python bench/bench_slurm.py [--rounds 2] [--keep] [--json PATH]

Runs in a throwaway copy of the repo; times are wall seconds, seen by polling the job's log
every 50 ms. Prints the figures (each round and the best); always exits 0 when the cluster
answers: it reports, it does not gate.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from common.distributed.scheduler import slurm_available, wait_for_jobs  # noqa: E402

sys.path.insert(0, str(REPO / "bench"))
from _common import bench_args, finish, row  # noqa: E402

TINY = [
    "data.source=sample",
    "data.interval=1d",
    "model.vocab_size=64",
    "model.context_length=16",
    "model.d_model=32",
    "model.num_layers=2",
    "model.num_heads=2",
    "model.d_ff=64",
    "model.asset_embed_dim=4",
    "model.category_embed_dim=4",
    "training.batch_size=16",
    "training.epochs=3",
    "training.eval_max_batches=4",
    "training.warmup_steps=2",
    "training.log_every_steps=1",
    "training.device=cpu",  # the local cluster's GPUs are files: the CPU on purpose
]
STEP = re.compile(r"^  epoch \d+/\d+ step \d+/\d+ ", re.M)
POLL_S = 0.05


def copy_repo(dst: Path) -> Path:
    code = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(REPO / "common", dst / "common", ignore=code)  # common/data included
    # the case without its runs, logs and candle cache
    shutil.copytree(
        REPO / "case_c_crypto",
        dst / "case_c_crypto",
        ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "checkpoints", "logs", "data"),
    )
    return dst


def wait_for(log: Path, pattern: re.Pattern, after: int = 0, timeout_s: float = 300.0) -> tuple[float, int]:
    """(time.monotonic() when `pattern` first shows in `log` past offset `after`, its offset)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        text = log.read_text() if log.exists() else ""
        m = pattern.search(text, after)
        if m:
            return time.monotonic(), m.start()
        time.sleep(POLL_S)
    raise TimeoutError(
        f"no {pattern.pattern!r} in {log} within {timeout_s:.0f} s:\n{log.read_text()[-2000:] if log.exists() else ''}"
    )


def job_state(job_id: str) -> str:
    out = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%T"], capture_output=True, text=True, timeout=30)
    return out.stdout.strip()


def one_round(repo: Path, experiment: str) -> dict[str, float]:
    env = dict(os.environ, MARKETGPT_PYTHON=sys.executable, OMP_NUM_THREADS="1")
    script = "case_c_crypto/slurm_scripts/train_crypto_a100.sh"
    args = [a for kv in [*TINY, f"experiment={experiment}"] for a in ("--set", kv)]
    t0 = time.monotonic()
    job = (
        subprocess.run(
            ["sbatch", "--parsable", script, *args],
            cwd=repo,
            env=env,
            capture_output=True,
            text=True,
            check=True,
            timeout=60,
        )
        .stdout.strip()
        .split(";")[0]
    )
    log = repo / "case_c_crypto" / "logs" / f"crypto_{job}.out"
    try:
        while job_state(job) in ("PENDING", "CONFIGURING", ""):
            time.sleep(POLL_S)
        t_running = time.monotonic()
        t_step, _ = wait_for(log, STEP)

        t_signal = time.monotonic()
        subprocess.run(["scancel", "--signal=USR2", "--batch", job], check=True, timeout=30)
        t_saved, _ = wait_for(log, re.compile(r"Received SIGUSR2: saved"))
        t_requeued, _ = wait_for(log, re.compile(r"requeueing job"))
        t_restart, at = wait_for(log, re.compile(r"restart 1 ====="))
        _, resumed_at = wait_for(log, re.compile(r"^Resuming at epoch", re.M), after=at)
        t_resumed, _ = wait_for(log, STEP, after=resumed_at)
    finally:
        subprocess.run(["scancel", job], timeout=30)
        wait_for_jobs([job], timeout_s=120)
    return {
        "sbatch_to_first_step": t_step - t0,
        "queue": t_running - t0,
        "startup": t_step - t_running,
        "requeue_to_resumed_step": t_resumed - t_signal,
        "signal_to_checkpoint": t_saved - t_signal,
        "checkpoint_to_requeued": t_requeued - t_saved,
        "requeued_to_running": t_restart - t_requeued,
        "resume_startup": t_resumed - t_restart,
    }


def main(argv: list[str] | None = None) -> int:
    ap = bench_args(__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--keep", action="store_true", help="keep the repo copy (logs, run folders)")
    args = ap.parse_args(argv)
    if not slurm_available():
        print("Slurm does not answer: start the local cluster first (sudo tools/local_slurm/local_slurm.sh start)")
        return 1
    tmp = Path(tempfile.mkdtemp(prefix="bench_slurm_"))
    repo = copy_repo(tmp / "repo")
    rounds = []
    for r in range(args.rounds):
        rounds.append(one_round(repo, f"bench{r}"))
        f = rounds[-1]
        print(
            f"round {r + 1}: sbatch -> first step {f['sbatch_to_first_step']:.1f} s | "
            f"requeue -> resumed step {f['requeue_to_resumed_step']:.1f} s",
            flush=True,
        )
    best = {k: min(r[k] for r in rounds) for k in rounds[0]}
    rows = [
        row(
            "Slurm, local cluster",
            "sbatch -> first training step",
            best["sbatch_to_first_step"],
            "s",
            None,
            f"queue {best['queue']:.1f} s, start-up {best['startup']:.1f} s; case C tiny model, 2 tasks, "
            f"best of {len(rounds)}",
        ),
        row(
            "Slurm, local cluster",
            "requeue (USR2) -> resumed step",
            best["requeue_to_resumed_step"],
            "s",
            None,
            f"USR2 -> checkpoint {best['signal_to_checkpoint']:.1f} s, -> requeued "
            f"{best['checkpoint_to_requeued']:.1f} s, -> running again {best['requeued_to_running']:.1f} s, "
            f"start-up {best['resume_startup']:.1f} s",
        ),
    ]
    if args.keep:
        print(f"logs and run folders: {repo}")
    else:
        shutil.rmtree(tmp, ignore_errors=True)
    return finish("slurm", {"rows": rows, "figures": {"best": best, "rounds": rounds}}, args.json)


if __name__ == "__main__":
    sys.exit(main())
