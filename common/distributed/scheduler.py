"""Asking Slurm about jobs and partitions, without sacct.

Clusters (and the local test cluster) may run without an accounting database, so `sacct`
can't be relied on. Everything here asks `squeue` (pending, running and, with `-t all`,
recently finished jobs) and `scontrol show job` (any job slurmctld still remembers, i.e. for
MinJobAge seconds after it ended). Every call has a timeout, and anything that waits on a
job gives up after its own timeout: a job killed outside Python can never hang a wait.

Inside a job, `job_metadata()` is what a run records in training_log.json, so `marketgpt
status` and a requeued job can find the run folder a job trains.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from typing import Iterable, Literal, Mapping, Optional, overload

from common.errors import UserError

__all__ = [
    "ACTIVE_STATES",
    "slurm_job_id",
    "job_info",
    "job_is_alive",
    "job_metadata",
    "job_commands",
    "job_states",
    "partitions",
    "check_partition",
    "parse_slurm_time",
    "slurm_available",
    "wait_for_jobs",
]

# States in which a job still holds (or will hold) its run folder.
ACTIVE_STATES = frozenset(
    {
        "PENDING",
        "RUNNING",
        "CONFIGURING",
        "COMPLETING",
        "REQUEUED",
        "REQUEUE_HOLD",
        "REQUEUE_FED",
        "RESIZING",
        "SUSPENDED",
        "STOPPED",
        "SIGNALING",
        "STAGE_OUT",
    }
)
_CALL_TIMEOUT_S = 30.0


def slurm_available() -> bool:
    """True when the Slurm client commands are here and slurmctld answers."""
    return shutil.which("squeue") is not None and _run(["sinfo", "-h", "-o", "%P"], check=False) is not None


@overload
def _run(cmd: list[str], check: Literal[True] = ...) -> str: ...
@overload
def _run(cmd: list[str], check: bool) -> Optional[str]: ...
def _run(cmd: list[str], check: bool = True) -> Optional[str]:
    """stdout of a Slurm command, or None when it fails or isn't installed (check=False)."""
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=_CALL_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as e:
        if check:
            raise UserError(f"`{' '.join(cmd)}` failed ({e}); is Slurm installed and slurmctld running?") from None
        return None
    if proc.returncode != 0:
        if check:
            raise UserError(f"`{' '.join(cmd)}` failed: {proc.stderr.strip() or proc.stdout.strip()}")
        return None
    return proc.stdout


def slurm_job_id(environ: Optional[Mapping[str, str]] = None) -> Optional[str]:
    """This process's Slurm job id (the per-task id in a job array), or None outside Slurm: the
    one reader of SLURM_JOB_ID."""
    return (os.environ if environ is None else environ).get("SLURM_JOB_ID") or None


def job_metadata() -> dict[str, str]:
    """What a run records about the job training it (empty outside Slurm)."""
    meta = {}
    job_id = slurm_job_id()
    if job_id:
        meta["slurm_job_id"] = job_id
    if os.environ.get("MARKETGPT_LOG_FILE"):  # set by the sbatch scripts and `marketgpt submit`
        meta["log_file"] = os.environ["MARKETGPT_LOG_FILE"]
    return meta


def job_info(job_id: str) -> Optional[dict[str, str]]:
    """`scontrol show job` fields (JobState, Restarts, ExitCode, StdOut, ...), or None when
    slurmctld no longer knows the job (or there is no Slurm)."""
    out = _run(["scontrol", "show", "job", "-o", str(job_id)], check=False)
    if not out or not out.strip():
        return None
    fields = {}
    # one line of Key=Value pairs; values (Command=, paths) may hold spaces, so split on the keys
    for token in out.strip().splitlines()[0].split(" "):
        key, sep, value = token.partition("=")
        if sep and key and key[0].isupper():
            fields[key] = value
            last = key
        elif fields:
            fields[last] += " " + token
    return fields


def job_states(job_ids: Optional[Iterable[str]] = None) -> dict[str, str]:
    """job id -> state for the jobs squeue lists (all of them when `job_ids` is None).

    An array task is listed under both of its ids: `123_4` (%i, as squeue shows it) and its
    own job id (%A, the `SLURM_JOB_ID` inside the task, which runs record)."""
    cmd = ["squeue", "-h", "-t", "all", "-o", "%i|%A|%T|%j"]
    ids = list(job_ids) if job_ids is not None else None
    if ids is not None:
        if not ids:
            return {}
        cmd += ["-j", ",".join(ids)]
    out = _run(cmd, check=False)
    if out is None and ids is not None:  # an id slurmctld forgot makes squeue -j fail: ask one by one
        return {i: info["JobState"] for i in ids if (info := job_info(i)) and "JobState" in info}
    states = {}
    for line in (out or "").splitlines():
        parts = line.split("|")
        if len(parts) >= 3:
            states[parts[0]] = parts[2]
            states.setdefault(parts[1], parts[2])
    return states


def job_commands() -> dict[str, str]:
    """job id (as squeue shows it, e.g. `123` or `123_4`) -> its command (the batch script
    and its arguments), for this user's queued and running jobs."""
    out = _run(["squeue", "--me", "-h", "-o", "%i|%o"], check=False) or ""
    return dict(line.split("|", 1) for line in out.splitlines() if "|" in line)


def job_is_alive(job_id: str, completing_wait_s: float = 120.0) -> bool:
    """True while the job is queued, running or requeued. A job that is still COMPLETING
    (its processes saving a checkpoint after scancel) is waited for, up to `completing_wait_s`."""
    deadline = time.monotonic() + completing_wait_s
    while True:
        info = job_info(job_id)
        state = info.get("JobState", "") if info else ""
        if state != "COMPLETING" or time.monotonic() > deadline:
            return state in ACTIVE_STATES
        time.sleep(2.0)


def partitions() -> list[str]:
    out = _run(["sinfo", "-h", "-o", "%R"])
    return sorted({p.strip() for p in out.split()})


def check_partition(name: str) -> None:
    """Raise UserError unless `name` is a partition of this cluster."""
    known = partitions()
    if name not in known:
        raise UserError(
            f"partition '{name}' does not exist on this cluster (partitions: {', '.join(known)}); "
            "set slurm.partition in the case config or with --set slurm.partition=NAME"
        )


def wait_for_jobs(
    job_ids: Iterable[str], timeout_s: float, poll_s: float = 3.0, done: frozenset[str] = frozenset()
) -> dict[str, str]:
    """Wait until every job has left the queue for good; returns id -> final state
    (COMPLETED, FAILED, CANCELLED, TIMEOUT, ... or GONE when slurmctld forgot it).

    A requeued job passes through PENDING again and is still waited for. Raises TimeoutError
    (naming the states seen) after `timeout_s`."""
    pending = [str(j) for j in job_ids]
    final: dict[str, str] = {}
    deadline = time.monotonic() + timeout_s
    while True:
        states = job_states(pending) if pending else {}
        for job in list(pending):
            state = states.get(job)
            if state is None:  # not listed: ask scontrol, which remembers it for MinJobAge
                info = job_info(job)
                state = info.get("JobState", "GONE") if info else "GONE"
            if state not in ACTIVE_STATES or state in done:
                final[job] = state
                pending.remove(job)
        if not pending:
            return final
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"jobs still active after {timeout_s:.0f} s: " + ", ".join(f"{j} {states.get(j, '?')}" for j in pending)
            )
        time.sleep(poll_s)


def parse_slurm_time(text: str) -> int:
    """Slurm's --time formats (M, M:S, H:M:S, D-H, D-H:M, D-H:M:S) -> minutes, rounded up."""
    m = re.fullmatch(r"(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?", text.strip())
    if not m:
        raise UserError(f"slurm.time = {text!r} is not a Slurm time like 7-00:00:00, 2:00:00 or 90")
    days, a, b, c = m.group(1), int(m.group(2)), m.group(3), m.group(4)
    if days is not None:  # D-H, D-H:M, D-H:M:S
        seconds = int(days) * 86400 + a * 3600 + int(b or 0) * 60 + int(c or 0)
    elif c is not None:  # H:M:S
        seconds = a * 3600 + int(b) * 60 + int(c)
    elif b is not None:  # M:S
        seconds = a * 60 + int(b)
    else:  # M
        seconds = a * 60
    if seconds <= 0:
        raise UserError(f"slurm.time = {text!r} must be positive")
    return -(-seconds // 60)
