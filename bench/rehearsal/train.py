"""Stage 4: case_a_full_market/slurm_scripts/train_full_a100.sh with --nodes=2 (2 ranks each, gloo
on the CPU), forced to requeue twice (USR2 to the batch shell), against one uninterrupted process
training the same global batch; the end-of-training scorecard included."""

from __future__ import annotations

import json
import re
import subprocess
import time
from pathlib import Path
from typing import Any

from rehearsal import checks
from rehearsal.base import (
    CONFIG,
    EPOCHS,
    GLOBAL_BATCH,
    LOG_PREFIX,
    NO_SCORECARD,
    NODES,
    SCORECARD,
    TASKS_PER_NODE,
    Rehearsal,
    overrides,
    run_dirs,
    sets,
    squeue,
    submit_job,
    wait_jobs,
)


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


def final_weights(run_dir: Path, epochs: int = EPOCHS) -> dict:
    import torch

    return torch.load(run_dir / f"checkpoint_epoch_{epochs}.pt", weights_only=True, map_location="cpu")["model"]


def train_under_slurm(r: Rehearsal) -> dict[str, Any]:
    from common.distributed.scheduler import job_info

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
    job = submit_job(r, "train_slurm", job_sets)
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
    r.check(checks.requeued_twice(state, exit_code, restarts, lines, signalled))
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
            checks.result(
                "the requeued weights equal an uninterrupted run",
                False,
                f"reference exit {proc.returncode}, run folders: ddp {len(ddp)}, reference {len(ref)}",
            )
        )
        return {"exit": proc.returncode}
    weights = checks.weights_equal(final_weights(ddp[0]), final_weights(ref[0]))
    r.check(weights)
    r.check(checks.losses_equal(logged_epochs(ddp[0]), logged_epochs(ref[0])))
    log = json.loads((ddp[0] / "training_log.json").read_text())
    kept = {k: log.get(k) for k in ("status", "world_size", "launcher", "slurm_job_id")}
    r.outputs["train_slurm: training_log"] = json.dumps({**kept, "resumes": len(log.get("resumes", []))})
    return {"exit": proc.returncode, "max_weight_difference": weights["max_weight_difference"]}


def logged_epochs(run_dir: Path) -> list[dict]:
    log = json.loads((run_dir / "training_log.json").read_text())
    return [{k: e[k] for k in ("epoch", "train_loss", "train_acc", "val_loss", "val_acc")} for e in log["epochs"]]
