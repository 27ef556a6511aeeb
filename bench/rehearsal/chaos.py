"""The chaos run: case A's script (case_a_full_market/slurm_scripts/train_full_a100.sh) on the local
2-node Slurm (2 ranks a node, gloo on the CPU), a small model on the rehearsal's corpus, and
`faults` faults at random steps, each kind as often (common/slurm/job.sh's requeue, docs/slurm.md):

    rank_kill         SIGKILL of one rank (drawn): the others stop, srun exits 137, the job
                      requeues itself and resumes from the last checkpoint (steps since are redone)
    usr2              `scancel --signal=USR2 --batch`: the trainer saves, exits 75, the job requeues
    scontrol_requeue  `scontrol requeue`: SIGTERM, the trainer saves, Slurm queues the job again
    node_loss         node2's slurmd SIGKILLed: after SlurmdTimeout (30 s on the local cluster) the
                      node is down, Slurm ends the job's steps and requeues it; slurmd is started
                      again (the job waits for its 2 nodes)
    time_limit        the job's time limit moved to 5 minutes after its start: Slurm sends the
                      script's --signal=B:USR2@600, the job saves and requeues (the limit is set
                      back while it is pending, as a new start's would be)

Each fault's overhead is the time from the fault to the first training step of the next start.
At the end, the job's final weights and logged epochs are compared with one uninterrupted process
training the same global batch for the same steps. The job runs with MARKETGPT_MAX_REQUEUES=40:
20 faults are 20 restarts, the default cap's limit.
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

from rehearsal import checks
from rehearsal.base import (
    CONFIG,
    GLOBAL_BATCH,
    NO_SCORECARD,
    NODES,
    SCRIPT,
    TASKS_PER_NODE,
    Rehearsal,
    overrides,
    run_dirs,
    sets,
    squeue,
    wait_jobs,
)
from rehearsal.train import job_log, logged_epochs

KINDS = ("rank_kill", "usr2", "scontrol_requeue", "node_loss", "time_limit")
EPOCHS, STEPS = 300, 40  # 12,000 optimizer steps: about 5 minutes of training on 2 cores, 4 ranks
SLURM_STATE = Path(os.environ.get("LOCAL_SLURM_DIR", "/tmp/marketgpt-slurm"))
_STEP = re.compile(r"epoch (\d+)/\d+ step (\d+)/\d+")
_FIRST_STEP = re.compile(r"Resuming at epoch.*?\n.*?epoch \d+/\d+ step \d+/\d+", re.S)


def chaos_sets(r: Rehearsal, experiment: str, batch: int) -> list[str]:
    """The job's (and the reference's) --set arguments: the rehearsal's settings, EPOCHS x STEPS."""
    return sets(
        overrides(
            r.size,
            f"training.batch_size={batch}",
            f"experiment={experiment}",
            *NO_SCORECARD,
            f"training.epochs={EPOCHS}",
            f"training.max_steps_per_epoch={STEPS}",
        )
    )


def run_chaos(r: Rehearsal, faults: int, seed: int) -> dict[str, Any]:
    env = {**r.env_for("chaos"), "MARKETGPT_MAX_REQUEUES": "40"}
    proc = subprocess.run(
        [
            "sbatch",
            "--parsable",
            f"--nodes={NODES}",
            SCRIPT,
            *chaos_sets(r, "chaos", GLOBAL_BATCH // (NODES * TASKS_PER_NODE)),
        ],
        cwd=r.repo,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"sbatch failed: {proc.stderr}")
    job = proc.stdout.strip().split(";")[0]
    r.jobs.append(job)
    rng = random.Random(seed)
    kinds, targets = fault_plan(faults, rng)
    deadline = time.monotonic() + 3600
    done = []
    for n, (kind, target) in enumerate(zip(kinds, targets)):
        at = _wait_step(r, job, target, deadline)
        since, sent = len(job_log(r, job)), time.monotonic()
        detail = FAULTS[kind](r, job, rng)
        resumed = _wait_restart(r, job, n + 1, since, deadline, kind)
        done.append(
            {
                "n": n + 1,
                "kind": kind,
                "target_step": target,
                "at_step": at,
                "detail": detail,
                "overhead_s": round(resumed["first_step_at"] - sent, 1),
                "resumed_at": resumed["resumed_at"],
            }
        )
        print(
            f"    fault {n + 1:2d} {kind:16s} at step {at:5d}: back in {done[-1]['overhead_s']:5.1f} s "
            f"({resumed['resumed_at']})",
            flush=True,
        )
    state = wait_jobs([job], max(1.0, deadline - time.monotonic()))[job]
    from common.slurm.scheduler import job_info

    info = job_info(job) or {}
    r.outputs["chaos: job log"] = job_log(r, job, err=True)[-8000:]
    return {
        "job": job,
        "state": state,
        "exit_code": info.get("ExitCode"),
        "restarts": info.get("Restarts"),
        "faults": done,
        "overheads_s": [f["overhead_s"] for f in done],
    }


def fault_plan(faults: int, rng: random.Random) -> tuple[list[str], list[int]]:
    """(kinds, target steps): each kind as often (in a random order), at random steps spread over
    the run, increasing, each well after the one before (a resume redoes up to an epoch)."""
    kinds = [KINDS[i % len(KINDS)] for i in range(faults)]
    rng.shuffle(kinds)
    targets = sorted(rng.sample(range(20, EPOCHS * STEPS - 3 * STEPS, 3 * STEPS // 2), faults))
    return kinds, targets


def global_steps(log: str) -> list[int]:
    """The global step of every step line of a job log ("epoch 3/300 step 5/40" is 85)."""
    return [(int(e) - 1) * STEPS + int(s) for e, s in _STEP.findall(log)]


def _wait_step(r: Rehearsal, job: str, target: int, deadline: float) -> int:
    """The global step the job's log shows once it reaches `target` (polled)."""
    while time.monotonic() < deadline:
        steps = global_steps(job_log(r, job))
        if steps and steps[-1] >= target:
            return steps[-1]
        if not squeue(job):
            raise RuntimeError(f"job {job} ended before step {target}:\n{job_log(r, job, err=True)[-2000:]}")
        time.sleep(0.05)
    raise TimeoutError(f"job {job} did not reach step {target} in time")


def _wait_restart(r: Rehearsal, job: str, restart: int, since: int, deadline: float, kind: str) -> dict[str, Any]:
    """Wait for start `restart` to train its first step (after its resume); when, and where from.
    since: the log's length when the fault was sent. Undoes what a fault changed once it took:
    the time limit (set back while the job is pending), node2's slurmd (started once it is down)."""
    header = re.compile(rf"job {job} \(\S+\) on \S+, restart {restart} =====")
    restored = False
    while time.monotonic() < deadline:
        log = job_log(r, job)
        m = header.search(log, since)
        if kind == "time_limit" and not restored and "requeueing job" in log[since:]:
            _scontrol("update", f"JobId={job}", "TimeLimit=7-00:00:00")  # back to the script's own
            restored = True
        if kind == "node_loss" and not restored and _node_state("node2").startswith("down"):
            subprocess.run(["slurmd", "-N", "node2"], env=r.env, timeout=60, check=True)
            restored = True
        if m:
            first = _FIRST_STEP.search(log, m.end())
            if first:
                resumed = re.search(r"Resuming at epoch (\d+), step (\d+)", log[m.end() :])
                return {
                    "first_step_at": time.monotonic(),
                    "resumed_at": f"epoch {resumed.group(1)} step {resumed.group(2)}" if resumed else "?",
                }
        if not squeue(job):
            raise RuntimeError(f"job {job} ended instead of restart {restart}:\n{job_log(r, job, err=True)[-2000:]}")
        time.sleep(0.05)
    raise TimeoutError(f"job {job} did not come back from its {kind} fault in time")


def _scontrol(*args: str) -> None:
    subprocess.run(["scontrol", *args], timeout=60, check=True, capture_output=True)


def _node_state(node: str) -> str:
    out = subprocess.run(["sinfo", "-h", "-n", node, "-o", "%T"], capture_output=True, text=True, timeout=60)
    return (out.stdout.splitlines() or [""])[0].strip("*")


def _rank_pids(job: str) -> dict[int, int]:
    """Rank -> pid of the job's training processes (this machine holds both local nodes)."""
    out = {}
    for pid in subprocess.run(
        ["pgrep", "-f", "python -m common.cli train"], capture_output=True, text=True
    ).stdout.split():
        try:
            env = dict(kv.split("=", 1) for kv in Path(f"/proc/{pid}/environ").read_text().split("\0") if "=" in kv)
        except OSError:
            continue
        if env.get("SLURM_JOB_ID") == job and "SLURM_PROCID" in env:
            out[int(env["SLURM_PROCID"])] = int(pid)
    return out


def _rank_kill(r: Rehearsal, job: str, rng: random.Random) -> str:
    pids = _rank_pids(job)
    rank = rng.choice(sorted(pids))
    os.kill(pids[rank], signal.SIGKILL)
    return f"SIGKILL to rank {rank} (pid {pids[rank]})"


def _usr2(r: Rehearsal, job: str, rng: random.Random) -> str:
    subprocess.run(["scancel", "--signal=USR2", "--batch", job], env=r.env, timeout=60, check=True)
    return "scancel --signal=USR2 --batch"


def _scontrol_requeue(r: Rehearsal, job: str, rng: random.Random) -> str:
    _scontrol("requeue", job)
    return "scontrol requeue"


def _node_loss(r: Rehearsal, job: str, rng: random.Random) -> str:
    pid = int((SLURM_STATE / "slurmd_node2.pid").read_text())
    os.kill(pid, signal.SIGKILL)
    return f"SIGKILL to node2's slurmd (pid {pid}); started again once the node is down"


def _time_limit(r: Rehearsal, job: str, rng: random.Random) -> str:
    _scontrol("update", f"JobId={job}", "TimeLimit=5")
    return "TimeLimit=5 minutes (the --signal=B:USR2@600 falls due)"


FAULTS = {
    "rank_kill": _rank_kill,
    "usr2": _usr2,
    "scontrol_requeue": _scontrol_requeue,
    "node_loss": _node_loss,
    "time_limit": _time_limit,
}


def reference(r: Rehearsal) -> dict[str, Any]:
    """One process, the global batch, the same steps, no fault; the job's weights and epochs against it."""
    import torch

    proc = r.cli("chaos_reference", "train", "--config", CONFIG, *chaos_sets(r, "reference", GLOBAL_BATCH))
    job_runs, ref_runs = run_dirs(r, "chaos"), run_dirs(r, "reference")
    if proc.returncode != 0 or len(job_runs) != 1 or len(ref_runs) != 1:
        r.check(
            checks.result(
                "20 faults: the weights equal an uninterrupted run",
                False,
                f"reference exit {proc.returncode}, runs {len(job_runs)} / {len(ref_runs)}",
            )
        )
        return {"exit": proc.returncode}

    def final(run: Path) -> dict:
        return torch.load(run / f"checkpoint_epoch_{EPOCHS}.pt", weights_only=True, map_location="cpu")["model"]

    weights = checks.weights_equal(final(job_runs[0]), final(ref_runs[0]))
    r.check(weights)
    r.check(checks.losses_equal(logged_epochs(job_runs[0]), logged_epochs(ref_runs[0])))
    log = json.loads((job_runs[0] / "training_log.json").read_text())
    return {
        "exit": proc.returncode,
        "max_weight_difference": weights["max_weight_difference"],
        "resumes_logged": len(log.get("resumes", [])),
        "status": log.get("status"),
    }
