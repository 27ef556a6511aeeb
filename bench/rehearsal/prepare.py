"""Stage 3, the faulted array preparation: `marketgpt data prepare --array 8` on Slurm, submitted
twice, one encode task's process SIGKILLed while it encodes, a `marketgpt train` started meanwhile;
then resubmitted until the shard is there, as a user would. The manifest's prepared_by says who
published it; where the training won the race, the same faulted array runs again alone on the same
candles (hard links, another data.cache_dir), so the array's path publishes a shard at least once."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Optional

from rehearsal import checks
from rehearsal.base import ARRAY, CONFIG, NO_SCORECARD, Rehearsal, overrides, sets, shard_of, squeue, wait_jobs

_SUBMITTED = re.compile(r"^Submitted job (\d+)(?: \((\d+) tasks[^)]*\))?: (\w+)", re.M)
ALONE = "data.cache_dir=data_array"  # the second round's candles: hard links of the first's


def submit_array(r: Rehearsal, tag: str, *extra: str) -> dict[str, list[str]]:
    """`marketgpt data prepare --array 8`: stage -> its job ids (array tasks as ID_TASK); {} when
    nothing was submitted (the shard is there)."""
    proc = r.cli(tag, "data", "prepare", "--config", CONFIG, *sets(overrides(r.size, *extra)), "--array", str(ARRAY))
    if proc.returncode != 0:
        raise RuntimeError(f"data prepare --array exit {proc.returncode}: {proc.stderr[-2000:]}")
    jobs = {
        stage: [f"{job}_{i}" for i in range(int(tasks))] if tasks else [job]
        for job, tasks, stage in _SUBMITTED.findall(proc.stdout)
    }
    r.jobs.extend(job.split("_")[0] for ids in jobs.values() for job in ids[:1])
    return jobs


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


def gone(pids: list[int], timeout_s: float = 10.0) -> bool:
    """Whether every process has ended (a zombie awaiting its parent counts as ended)."""
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        alive = []
        for pid in pids:
            try:
                state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
            except (OSError, IndexError):
                continue
            if state not in ("Z", "X"):
                alive.append(pid)
        if not alive:
            return True
        time.sleep(0.1)
    return False


def kill_one_encode_task(r: Rehearsal, shard: Path, encode: list[str], deadline: float) -> dict[str, Any]:
    """SIGKILL the Python process of one encode task as soon as its log says it encodes: what a
    node failure or the OOM killer does mid-stage (scancel would send SIGTERM first). At once, not
    after a pause: at the reduced size a task encodes its assets in about a second, and a pause let
    every task finish before one could be killed."""
    logs = r.case / "logs" / f"prepare_{shard.name}"
    array = encode[0].split("_")[0] if encode else ""
    while array and time.monotonic() < deadline:
        states = squeue(array)
        if not states:
            return {"killed": None, "why": "the encode tasks had all left the queue before one could be killed"}
        for task, state in states.items():
            log = logs / f"{task}_0_log.out"
            if state == "RUNNING" and log.is_file() and "the encode stage" in log.read_text():
                pids = task_pids(r, array, task.split("_")[1])
                for pid in pids:
                    os.kill(pid, signal.SIGKILL)
                if pids:
                    said = log.read_text()
                    encoded = re.findall(r"encoded \d+/\d+ assets", said)
                    return {
                        "killed": task,
                        "pids": pids,
                        "gone": gone(pids),
                        "encoded": encoded[-1] if encoded else "the encode stage began",
                        "log_when_killed": said[-300:],
                    }
        time.sleep(0.1)
    return {"killed": None, "why": "no encode task ran before the deadline"}


def leftovers(shard: Path) -> list[str]:
    """What a preparation left beside the published shard: its work folder, a private publish folder."""
    from common.tokens.shard_paths import work_folder

    found = [work_folder(shard)] if work_folder(shard).exists() else []
    found += shard.parent.glob(f".{shard.name}.*.publish")
    return sorted(p.name for p in found)


def faulted_array(r: Rehearsal, label: str, extra: tuple[str, ...], deadline: float, race: bool) -> dict[str, Any]:
    """One round: two submissions, one encode task killed, a training meanwhile where `race`, then
    resubmissions until the shard is there; checked, and who published it."""
    shard = shard_of(r, *extra)
    first = submit_array(r, "prepare", *extra)
    second = submit_array(r, "prepare", *extra)  # the same array again, by mistake or from a second shell
    train: Optional[subprocess.Popen] = None
    if race:  # a training started before the shard is there (in this machine's process, not a job)
        during = overrides(
            r.size, *extra, "training.epochs=1", "training.max_steps_per_epoch=3", "experiment=during_prepare"
        )
        train = subprocess.Popen(
            [sys.executable, "-m", "common.cli", "train", "--config", CONFIG, *sets([*during, *NO_SCORECARD])],
            cwd=r.repo,
            env=r.env_for("prepare"),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
    kill = kill_one_encode_task(r, shard, first.get("encode", []), deadline) if first else {"killed": None}
    ids = [j for sub in (first, second) for jobs in sub.values() for j in jobs]
    states = wait_jobs(ids, max(1.0, deadline - time.monotonic()))
    train_out = train.communicate(timeout=max(1.0, deadline - time.monotonic()))[0] if train else ""
    resubmitted: list[str] = []
    while not (shard / "manifest.json").is_file() and len(resubmitted) < 3:  # what a user does: submit again
        again = submit_array(r, "prepare", *extra)
        resubmitted += again.get("finish", [])
        states.update(wait_jobs([j for jobs in again.values() for j in jobs], max(1.0, deadline - time.monotonic())))
    manifest = shard / "manifest.json"
    prepared_by = json.loads(manifest.read_text()).get("prepared_by") if manifest.is_file() else None
    finishers = {"first": first.get("finish", []), "second": second.get("finish", []), "resubmission": resubmitted}
    publisher = checks.publisher_of(prepared_by, finishers, train.pid if train else -1)
    named = lambda c: dict(c, check=f"{c['check']} ({label} round)")  # noqa: E731
    r.check(named(checks.encode_task_killed(kill, states)))
    r.check(named(checks.shard_published(shard.name, manifest.is_file(), leftovers(shard), len(resubmitted))))
    if train:
        r.outputs["prepare: marketgpt train (started during the preparation)"] = train_out[-6000:]
        r.check(checks.train_during_prepare(train.returncode, train_out))
    return {
        "shard": shard.name,
        "cache_dir": next((e.split("=", 1)[1] for e in extra if e.startswith("data.cache_dir=")), "data"),
        "publisher": publisher,
        "prepared_by": prepared_by,
        "first_submission": first,
        "second_submission": second,
        "resubmitted_finish_jobs": resubmitted,
        "states": states,
        "kill": kill,
        "train_during_prepare_exit": train.returncode if train else None,
    }


def prepare_on_slurm(r: Rehearsal) -> dict[str, Any]:
    from rehearsal.prepare_single import link_tree

    deadline = time.monotonic() + r.size.timeout_s
    rounds = r.rounds  # filled round by round: prepare_single compares what there is
    rounds["raced"] = faulted_array(r, "raced", (), deadline, race=True)
    if rounds["raced"]["publisher"] not in checks.ARRAY_PUBLISHERS:  # the training won: the array alone
        link_tree(r.case / "data", r.case / ALONE.split("=")[1])
        rounds["alone"] = faulted_array(r, "alone", (ALONE,), deadline, race=False)
    r.check(checks.array_published({name: x["publisher"] for name, x in rounds.items()}))
    return {"rounds": rounds, "shard": rounds["raced"]["shard"]}
