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
At the end, the job's final weights and logged epochs are compared with the same job run again on
the same ranks without a fault. The job runs with MARKETGPT_MAX_REQUEUES=40 (20 faults are 20
restarts, the default cap's limit).
"""

from __future__ import annotations

import os
import random
import re
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

from common.run.log import RunLog

from rehearsal import checks
from rehearsal.base import (
    GLOBAL_BATCH,
    NO_SCORECARD,
    NODES,
    TASKS_PER_NODE,
    Rehearsal,
    overrides,
    run_dirs,
    squeue,
    submit_job,
    wait_jobs,
)
from rehearsal.train import final_weights, job_log, logged_epochs

KINDS = ("rank_kill", "usr2", "scontrol_requeue", "node_loss", "time_limit")
EPOCHS, STEPS = 300, 40  # 12,000 optimizer steps: about 5 minutes of training on 2 cores, 4 ranks
SLURM_STATE = Path(os.environ.get("LOCAL_SLURM_DIR", "/tmp/marketgpt-slurm"))
_STEP = re.compile(r"epoch (\d+)/\d+ step (\d+)/\d+")
_FIRST_STEP = re.compile(r"Resuming at epoch.*?\n.*?epoch \d+/\d+ step \d+/\d+", re.S)


def chaos_sets(r: Rehearsal, experiment: str) -> list[str]:
    """The job's (and the reference's) settings: the rehearsal's, EPOCHS x STEPS of the global batch."""
    return overrides(
        r.size,
        f"training.batch_size={GLOBAL_BATCH // (NODES * TASKS_PER_NODE)}",
        f"experiment={experiment}",
        *NO_SCORECARD,
        f"training.epochs={EPOCHS}",
        f"training.max_steps_per_epoch={STEPS}",
        "training.early_stopping_patience=0",  # the tiny model's best epoch comes early: train them all
    )


def run_chaos(r: Rehearsal, faults: int, seed: int) -> dict[str, Any]:
    job = submit_job(r, "chaos", chaos_sets(r, "chaos"), MARKETGPT_MAX_REQUEUES="40")
    rng = random.Random(seed)
    kinds, gaps = fault_plan(faults, rng)
    deadline = time.monotonic() + 3600
    done: list[dict[str, Any]] = []
    try:
        _faults(r, job, kinds, gaps, rng, deadline, done)
    finally:
        ensure_nodes(r)
    state = wait_jobs([job], max(1.0, deadline - time.monotonic()))[job]
    from common.distributed.scheduler import job_info

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


def _faults(
    r: Rehearsal, job: str, kinds: list[str], gaps: list[int], rng: random.Random, deadline: float, done: list
) -> None:
    """Send each fault its gap of steps after the job trains again (the first after its first
    step) and wait for the job to train again; `done` gets each one's record."""
    start = _wait_step(r, job, 1, deadline)
    for n, (kind, gap) in enumerate(zip(kinds, gaps)):
        target = start + gap
        at = _wait_step(r, job, target, deadline)
        since, sent, sent_wall = len(job_log(r, job)), time.monotonic(), time.time()
        detail = FAULTS[kind](r, job, rng)
        resumed = _wait_restart(r, job, n + 1, since, deadline, kind)
        start = resumed["step"]
        overhead = resumed["first_step_at"] - sent
        stopped = _stopped_at(job_log(r, job)[since:])
        # the job's own stop (its "training exited" line, to the second): a node loss takes Slurm's
        # SlurmdTimeout to be noticed, a time limit its signal's schedule; the rest is the requeue
        stop_s = None if stopped is None else max(0.0, min(overhead, stopped - sent_wall))
        done.append(
            {
                "n": n + 1,
                "kind": kind,
                "target_step": target,
                "at_step": at,
                "detail": detail,
                "overhead_s": round(overhead, 1),
                "until_stop_s": None if stop_s is None else round(stop_s, 1),
                "requeue_s": None if stop_s is None else round(overhead - stop_s, 1),
                "resumed_at": resumed["resumed_at"],
            }
        )
        print(
            f"    fault {n + 1:2d} {kind:16s} at step {at:5d}: back in {done[-1]['overhead_s']:5.1f} s "
            f"(stopped after {done[-1]['until_stop_s']} s, requeue {done[-1]['requeue_s']} s; {resumed['resumed_at']})",
            flush=True,
        )


def fault_plan(faults: int, rng: random.Random) -> tuple[list[str], list[int]]:
    """(kinds, gaps): each kind as often (in a random order), each fault a random number of steps
    (20 to 6 epochs) after the job trains again from the one before. Drawn as gaps, not as steps of
    the run: a node loss lets the job train on until Slurm notices (30 s here, ~1,500 steps), and
    the run must not end before the last fault."""
    kinds = [KINDS[i % len(KINDS)] for i in range(faults)]
    rng.shuffle(kinds)
    gaps = [rng.randrange(20, 6 * STEPS) for _ in range(faults)]
    return kinds, gaps


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
            ensure_nodes(r)
            restored = True
        if m:
            first = _FIRST_STEP.search(log, m.end())
            if first:
                resumed = re.search(r"Resuming at epoch (\d+), step (\d+)", log[m.end() :])
                return {
                    "first_step_at": time.monotonic(),
                    "step": global_steps(first.group(0))[-1],
                    "resumed_at": f"epoch {resumed.group(1)} step {resumed.group(2)}" if resumed else "?",
                }
        if not squeue(job):
            raise RuntimeError(f"job {job} ended instead of restart {restart}:\n{_what_happened(r, job, since)}")
        time.sleep(0.05)
    raise TimeoutError(f"job {job} did not come back from its {kind} fault in time")


def _stopped_at(log: str) -> float | None:
    """The epoch seconds of the first "training exited" line in `log` (job.sh prints local time)."""
    m = re.search(r"marketgpt: (\d{4}-\d\d-\d\d \d\d:\d\d:\d\d) training exited", log)
    return None if m is None else time.mktime(time.strptime(m.group(1), "%Y-%m-%d %H:%M:%S"))


def _what_happened(r: Rehearsal, job: str, since: int) -> str:
    """The job's own lines since the fault (its log and the end of its .err), and Slurm's word on it."""
    keep = re.compile(r"marketgpt:|=====|Resuming|Received|srun|slurmstepd|error", re.I)
    lines = [line for line in job_log(r, job, err=True)[since:].splitlines() if keep.search(line)]
    state = subprocess.run(["scontrol", "show", "job", job], capture_output=True, text=True, timeout=60).stdout
    fields = " ".join(w for w in state.split() if w.startswith(("JobState", "Restarts", "ExitCode", "Reason")))
    return "\n".join(lines[-40:]) + "\n" + fields


def ensure_nodes(r: Rehearsal) -> None:
    """node2's slurmd running again, whatever a fault left."""
    pid_file = SLURM_STATE / "slurmd_node2.pid"
    try:
        alive = Path(f"/proc/{int(pid_file.read_text())}/comm").read_text().strip() == "slurmd"
    except (OSError, ValueError):
        alive = False
    if not alive:
        subprocess.run(["slurmd", "-N", "node2"], env=r.env, timeout=60, check=False)


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
    """The same job on the same 2 x 2 ranks, never interrupted: the faulted job's final weights and
    logged epochs against it. (Not one process: over 12,000 steps the all-reduce's summation order
    alone moves the weights by about 1e-2 from a one-process run, as an uninterrupted job does too.)"""
    job = submit_job(r, "chaos_reference", chaos_sets(r, "uninterrupted"))
    state = wait_jobs([job], 3600)[job]
    job_runs, ref_runs = run_dirs(r, "chaos"), run_dirs(r, "uninterrupted")
    if state != "COMPLETED" or len(job_runs) != 1 or len(ref_runs) != 1:
        why = f"uninterrupted job {state}, runs {len(job_runs)} / {len(ref_runs)}"
        r.check(checks.result("the requeued weights equal an uninterrupted run", False, why))
        return {"state": state}

    weights = checks.weights_equal(final_weights(job_runs[0], EPOCHS), final_weights(ref_runs[0], EPOCHS))
    r.check(weights)
    r.check(checks.losses_equal(logged_epochs(job_runs[0]), logged_epochs(ref_runs[0])))
    log = RunLog.read(job_runs[0])
    return {
        "job": job,
        "state": state,
        "max_weight_difference": weights["max_weight_difference"],
        "resumes_logged": len(log.resumes),
        "status": log.status,
    }
