"""The Slurm suite on the real local cluster (tools/local_slurm: slurmctld + 2 slurmd with fake
2xA100 nodes). Required in CI: the slurm_cluster fixture fails, not skips, when CI=true.

Every job is submitted at the start (the `jobs` fixture), in a throwaway copy of the repo, so
the two nodes stay busy while the tests look at one job after another:
- each case script, unmodified but for --set overrides that make it tiny, from the repo root
  (case a by sbatch, b and c by launch_parallel_training.sh, which runs the same `sbatch
  <script> --set ...` from the root) and, for one case, from its slurm_scripts/ folder (the
  three scripts differ only in their case: test_slurm_scripts.py);
- a longer run three times: uninterrupted (the reference), with `sbatch --signal=B:USR2@10`,
  and through submitit with a 10-s warning; the last two get their time limit cut short once
  they train (_Holder), so they get Slurm's warning signal, checkpoint, requeue, resume and must
  end with the reference's exact weights;
- a run that is scancel'ed mid-epoch, then submitted again: it resumes;
- launch_parallel_training.sh -y --cases b,c, and the monitoring script it writes;
- bench/bench_slurm.py, one round (its own sbatch, USR2 and requeue), alongside the jobs above:
  its waits for the queue and for Slurm's requeue hold overlap theirs.
There is no sacct here: every wait asks squeue / scontrol show job, under a timeout.
"""

from __future__ import annotations

import io
import json
import math
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Callable, Iterator

import pytest

from common.distributed.scheduler import wait_for_jobs

from slurm_helpers import (
    CASES,
    REPO,
    TINY,
    assert_same_weights,
    copy_repo,
    job_env,
    run_dirs,
    scontrol_field,
    sets,
    training_log,
)

pytestmark = [
    pytest.mark.slurm,
    pytest.mark.slow,
    pytest.mark.filterwarnings("ignore:A test tried to use socket.socket"),
]

TIMEOUT_S = 900  # for the whole module's jobs; they normally finish within ~5 minutes
# The longer run: 2 x 400 steps. The signalled runs start with a 10-minute limit and are held
# stopped from their first step line (step 50) until the warning is pending (_Holder), so it
# finds them training on any machine, however many steps are left.
LONG = [*TINY, "training.epochs=2", "training.max_steps_per_epoch=400", "training.log_every_steps=50"]
LONG_EPOCHS = 2
# The scancel'ed run: 2 x 600 steps, cancelled after 100 of the first (500 steps to spare
# before the epoch ends: its SIGTERM checkpoint must be a step one of epoch 1).
MEDIUM = [*TINY, "training.max_steps_per_epoch=600", "training.log_every_steps=50"]
RUN_FILES = {
    "best_model.pt",
    "config.json",
    "tokenizer.json",
    "asset_info.json",
    "data_info.json",
    "training_log.json",
    "test_results.json",
    "tokens",
    "report.png",
    "tensorboard",
    "checkpoint_epoch_2.pt",
}


# The case-script jobs sbatch'ed here; b and c from the root are launch_parallel_training.sh's.
# Case a's script runs in tests/test_rehearsal.py (sbatch from the root, 2 nodes, requeued twice).
SUBMITTED_HERE = (("b", "slurm_scripts"),)


def _experiment(key: str, where: str) -> str:
    return "launched" if (key, where) in (("b", "root"), ("c", "root")) else f"tiny_{where}"


def _sbatch(
    repo: Path, case_key: str, overrides: list[str], *, cwd: Path | None = None, options: tuple[str, ...] = ()
) -> str:
    case, script, _ = CASES[case_key]
    path = repo / case / "slurm_scripts" / script
    where = cwd or repo
    proc = subprocess.run(
        ["sbatch", "--parsable", *options, os.path.relpath(path, where), *sets(overrides)],
        cwd=where,
        env=job_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, f"sbatch failed: {proc.stderr}"
    return proc.stdout.strip().split(";")[0]


def _wait(job_ids: list[str], deadline: float) -> dict[str, str]:
    return wait_for_jobs(job_ids, timeout_s=max(1.0, deadline - time.monotonic()), poll_s=2.0)


def _log(repo: Path, case_key: str, job_id: str, suffix: str = "out") -> str:
    case = CASES[case_key][0]
    prefix = {"a": "full", "b": "reduced", "c": "crypto"}[case_key]
    path = repo / case / "logs" / f"{prefix}_{job_id}.{suffix}"
    return path.read_text() if path.exists() else ""


class _Canceller(threading.Thread):
    """scancel a job once its log shows `pattern` (the job is training), as a user would."""

    def __init__(self, repo: Path, job_id: str, pattern: str, timeout_s: float) -> None:
        super().__init__(daemon=True)
        self.repo, self.job_id, self.pattern, self.timeout_s = repo, job_id, pattern, timeout_s
        self.cancelled = False

    def run(self) -> None:
        deadline = time.monotonic() + self.timeout_s
        while time.monotonic() < deadline:
            if re.search(self.pattern, _log(self.repo, "c", self.job_id)):
                subprocess.run(["scancel", self.job_id], timeout=60)
                self.cancelled = True
                return
            time.sleep(0.2)


class _Extender(threading.Thread):
    """Once a short-limit job has requeued itself, give it a long limit, so the resumed run
    finishes instead of being warned again (keeps the test to exactly one requeue)."""

    def __init__(self, job_id: str, timeout_s: float) -> None:
        super().__init__(daemon=True)
        self.job_id, self.timeout_s = job_id, timeout_s

    def run(self) -> None:
        deadline = time.monotonic() + self.timeout_s
        while time.monotonic() < deadline:
            if int(scontrol_field(self.job_id, "Restarts") or 0) >= 1:
                subprocess.run(["scontrol", "update", f"JobId={self.job_id}", "TimeLimit=20"], timeout=60)
                return
            time.sleep(1.0)


def _job_pythons(job_id: str) -> list[int]:
    """The job's Python processes on this machine (its ranks: the local cluster's nodes are here)."""
    python, pids = os.path.realpath(sys.executable), []
    for proc in Path("/proc").iterdir():
        try:
            if (
                proc.name.isdigit()
                and os.path.realpath(proc / "exe") == python
                and f"SLURM_JOB_ID={job_id}".encode() in (proc / "environ").read_bytes().split(b"\0")
            ):
                pids.append(int(proc.name))
        except OSError:  # gone, or not ours to read
            continue
    return pids


def _usr2_pending_or_gone(pid: int) -> bool:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return True
    masks = re.findall(r"^(?:SigPnd|ShdPnd):\s*([0-9a-f]+)$", status, flags=re.M)
    return any(int(mask, 16) >> (signal.SIGUSR2 - 1) & 1 for mask in masks)


def _send(pids: list[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


class _Holder(threading.Thread):
    """Bring Slurm's time-limit warning to a job mid-training, on a fast machine or a busy one: the
    job starts with a 10-minute limit (no warning while it starts up); once its log shows a training
    step, its ranks are stopped (SIGSTOP) and its limit cut to the next whole minute at least 20 s
    away (Slurm warns 10 s or up to a minute more before it); once USR2 is pending on a rank, they
    continue (SIGCONT) and checkpoint. Like the kill -9 test in test_resume.py, it waits for events
    of the run, not for a number of seconds."""

    def __init__(self, job_id: str, log: Callable[[], str], timeout_s: float) -> None:
        super().__init__(daemon=True)
        self.job_id, self.log, self.timeout_s = job_id, log, timeout_s
        self.held: list[int] = []
        self.cut: str | None = None

    def run(self) -> None:
        deadline = time.monotonic() + self.timeout_s
        while not re.search(r"epoch 1/\d+ step \d+/", self.log()):
            if time.monotonic() > deadline:
                return
            time.sleep(0.1)
        self.held = _job_pythons(self.job_id)
        _send(self.held, signal.SIGSTOP)
        try:
            minutes = math.ceil((_seconds(scontrol_field(self.job_id, "RunTime") or "0") + 20) / 60)
            proc = subprocess.run(
                ["scontrol", "update", f"JobId={self.job_id}", f"TimeLimit={minutes}"],
                capture_output=True,
                text=True,
                timeout=60,
            )
            self.cut = f"TimeLimit={minutes}: exit {proc.returncode} {proc.stderr.strip()}"
            until = time.monotonic() + 60 * minutes + 60
            # the ranks agree on a signal any of them got: one with USR2 pending is enough
            while not any(_usr2_pending_or_gone(pid) for pid in self.held) and time.monotonic() < until:
                time.sleep(0.2)
        finally:
            _send(self.held, signal.SIGCONT)

    def __str__(self) -> str:
        return f"held pids {self.held}, {self.cut}"


def _seconds(run_time: str) -> int:
    """scontrol's [D-]HH:MM:SS (or MM:SS) in seconds."""
    days, _, clock = run_time.rpartition("-")
    seconds = 0
    for part in clock.split(":"):
        seconds = 60 * seconds + int(part)
    return 86400 * int(days or 0) + seconds


def _read(path: Path) -> str:
    return path.read_text() if path.exists() else ""


@pytest.fixture(scope="module")
def jobs(slurm_cluster, tmp_path_factory) -> Iterator[dict]:
    repo = copy_repo(tmp_path_factory.mktemp("slurm_repo"))
    deadline = time.monotonic() + TIMEOUT_S
    submitted: dict = {"repo": repo, "deadline": deadline}
    bench_json = tmp_path_factory.mktemp("bench_slurm") / "slurm.json"
    bench = subprocess.Popen(
        [sys.executable, str(REPO / "bench" / "bench_slurm.py"), "--rounds", "1", "--json", str(bench_json)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    submitted["bench"] = (bench, bench_json)

    # the long-running ones first: Slurm starts jobs in submission order
    submitted["requeue"] = _sbatch(
        repo, "c", [*LONG, "experiment=rq_sbatch"], options=("--time=10", "--signal=B:USR2@10")
    )
    submitted["reference"] = _sbatch(repo, "c", [*LONG, "experiment=reference"])
    from common.slurm.submit import submit

    old = os.environ.get("OMP_NUM_THREADS")
    os.environ["OMP_NUM_THREADS"] = "1"  # the submitit job inherits this environment
    try:
        (job,) = submit(
            str(repo / "case_c_crypto"),
            None,
            [*LONG, "experiment=rq_submitit", "slurm.time=00:10:00"],
            out=io.StringIO(),
            signal_delay_s=10,
        )
    finally:
        os.environ.pop("OMP_NUM_THREADS") if old is None else os.environ.__setitem__("OMP_NUM_THREADS", old)
    submitted["submitit"] = job
    for job_id in (submitted["requeue"], job.job_id):
        _Extender(job_id, TIMEOUT_S).start()
    submitted["holders"] = {
        submitted["requeue"]: _Holder(submitted["requeue"], lambda: _log(repo, "c", submitted["requeue"]), TIMEOUT_S),
        job.job_id: _Holder(job.job_id, lambda: _read(Path(job.paths.stdout)), TIMEOUT_S),
    }
    for holder in submitted["holders"].values():
        holder.start()

    submitted["scancel"] = _sbatch(repo, "c", [*MEDIUM, "experiment=cancelled"])
    canceller = _Canceller(repo, submitted["scancel"], r"epoch 1/2 step 100/", TIMEOUT_S)
    canceller.start()
    submitted["canceller"] = canceller

    # the case scripts: b from its slurm_scripts/ folder, by sbatch here
    submitted["cases"] = {}
    for key, where in SUBMITTED_HERE:
        cwd = repo if where == "root" else repo / CASES[key][0] / "slurm_scripts"
        job_id = _sbatch(repo, key, [*TINY, f"experiment={_experiment(key, where)}"], cwd=cwd)
        submitted["cases"][(key, where)] = (job_id, cwd)
    # launch_parallel_training.sh -y --cases b,c: b and c from the repo root
    proc = subprocess.run(
        [
            "bash",
            str(repo / "launch_parallel_training.sh"),
            "-y",
            "--cases",
            "b,c",
            *sets([*TINY, "experiment=launched"]),
        ],
        cwd=repo,
        env=job_env(),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=300,
    )
    submitted["launch"] = proc
    launched = re.findall(r"Submitted case ([bc]): job (\d+)", proc.stdout)
    submitted["more"] = [job_id for _, job_id in launched]  # tests add theirs
    for key, job_id in launched:
        submitted["cases"][(key, "root")] = (job_id, repo)
    submitted["squeue"] = {
        job_id: subprocess.run(
            ["squeue", "-h", "-j", job_id, "-o", "%i %j %T"], capture_output=True, text=True, timeout=60
        ).stdout
        for job_id, _ in submitted["cases"].values()
    }
    yield submitted

    # whatever a failed test left behind in the queue
    mine = [
        submitted["requeue"],
        submitted["reference"],
        job.job_id,
        submitted["scancel"],
        *(j for j, _ in submitted["cases"].values()),
        *submitted["more"],
    ]
    subprocess.run(["scancel", *mine], capture_output=True, timeout=60)
    if bench.poll() is None:  # a failed test's leftover: its `finally` cancels its job
        bench.send_signal(signal.SIGINT)
        bench.communicate(timeout=150)


@pytest.mark.parametrize("key, where", [("b", "root"), ("c", "root"), ("b", "slurm_scripts")])
def test_each_case_script_runs_from_the_repo_root_and_from_slurm_scripts(jobs, key, where):
    repo = jobs["repo"]
    case, _, _ = CASES[key]
    assert (key, where) in jobs["cases"], jobs["launch"].stdout + jobs["launch"].stderr
    job_id, cwd = jobs["cases"][(key, where)]
    name = {"a": "full_market", "b": "reduced", "c": "crypto"}[key]
    # squeue showed the job, under the case's name
    assert re.match(rf"{job_id} {name} (PENDING|RUNNING|CONFIGURING|COMPLETING|COMPLETED)", jobs["squeue"][job_id]), (
        jobs["squeue"][job_id]
    )
    states = _wait([job_id], jobs["deadline"])
    out = _log(repo, key, job_id)
    assert (states[job_id], scontrol_field(job_id, "ExitCode")) == ("COMPLETED", "0:0"), (
        out[-3000:] + _log(repo, key, job_id, "err")[-3000:]
    )
    assert "Epoch 2/2" in out and "DDP: 2 processes (gloo)" in out and "Test (best model" in out
    assert not list(cwd.glob(f"slurm_*_{job_id}.out"))  # Slurm's own (empty) output file was cleaned up
    (run_dir,) = run_dirs(repo, case, _experiment(key, where))
    assert RUN_FILES <= {p.name for p in run_dir.iterdir()}
    log = training_log(run_dir)
    assert log["status"] == "finished" and log["world_size"] == 2 and log["slurm_job_id"] == job_id
    assert log["log_file"] == str(repo / case / "logs" / f"{Path(log['log_file']).name}")
    assert Path(log["log_file"]).name.endswith(f"_{job_id}.out")


def test_a_short_time_limit_signals_checkpoints_requeues_and_ends_like_an_uninterrupted_run(jobs):
    repo, job_id = jobs["repo"], jobs["requeue"]
    states = _wait([job_id, jobs["reference"]], jobs["deadline"])
    out = _log(repo, "c", job_id)
    held = str(jobs["holders"][job_id])
    assert states[job_id] == "COMPLETED" and states[jobs["reference"]] == "COMPLETED", out[-4000:] + held
    assert scontrol_field(job_id, "Restarts") == "1", out[-4000:] + held
    # one log, appended across the requeue
    assert "restart 0 =====" in out and "restart 1 =====" in out
    assert "USR2 (time limit near or preemption)" in out
    saved = re.search(r"Received SIGUSR2: saved (checkpoint_epoch_\d+(?:_step_\d+)?\.pt)", out)
    assert saved and f"requeueing job {job_id}" in out
    (run_dir,) = run_dirs(repo, "case_c_crypto", "rq_sbatch")  # resumed into the same folder
    assert f"Resuming {run_dir} from {saved.group(1)}" in out
    log = training_log(run_dir)
    assert log["status"] == "finished" and len(log["resumes"]) == 1 and len(log["epochs"]) == LONG_EPOCHS
    (reference,) = run_dirs(repo, "case_c_crypto", "reference")
    for name in ("best_model.pt", f"checkpoint_epoch_{LONG_EPOCHS}.pt"):
        assert_same_weights(run_dir / name, reference / name)


def test_the_same_through_submitit(jobs):
    repo, job = jobs["repo"], jobs["submitit"]
    states = _wait([job.job_id, jobs["reference"]], jobs["deadline"])
    out = Path(job.paths.stdout).read_text()
    held = str(jobs["holders"][job.job_id])
    assert states[job.job_id] == "COMPLETED", out[-4000:] + Path(job.paths.stderr).read_text()[-3000:] + held
    assert int(scontrol_field(job.job_id, "Restarts")) >= 1, out[-4000:] + held
    # submitit's timeout path: checkpoint, then `scontrol requeue` (whose SIGTERM to the job can come
    # before submitit logs "Requeued job"; Restarts and the resume below show the requeue)
    assert "Received SIGUSR2: saved checkpoint_epoch_" in out and "Calling checkpoint method" in out
    (run_dir,) = run_dirs(repo, "case_c_crypto", "rq_submitit")
    assert f"Resuming {run_dir} from checkpoint_epoch_" in out
    log = training_log(run_dir)
    assert log["status"] == "finished" and log["launcher"] == "submitit" and log["slurm_job_id"] == job.job_id
    (reference,) = run_dirs(repo, "case_c_crypto", "reference")
    for name in ("best_model.pt", f"checkpoint_epoch_{LONG_EPOCHS}.pt"):
        assert_same_weights(run_dir / name, reference / name)


def test_scancel_leaves_a_checkpoint_and_a_resubmitted_job_resumes(jobs):
    repo, job_id, canceller = jobs["repo"], jobs["scancel"], jobs["canceller"]
    states = _wait([job_id], jobs["deadline"])
    out = _log(repo, "c", job_id)
    assert canceller.cancelled and states[job_id] == "CANCELLED", out[-3000:]
    assert "SIGTERM (scancel or time limit)" in out and "submit the same script again to resume" in out
    assert "requeueing" not in out
    (run_dir,) = run_dirs(repo, "case_c_crypto", "cancelled")
    saved = re.search(r"Received SIGTERM: saved (checkpoint_epoch_1_step_\d+\.pt)", out)
    assert saved and (run_dir / saved.group(1)).is_file()
    assert "interrupted" in training_log(run_dir) and training_log(run_dir)["status"] == "running"

    again = _sbatch(repo, "c", [*MEDIUM, "experiment=cancelled"], cwd=repo / "case_c_crypto" / "slurm_scripts")
    jobs["more"].append(again)
    states = _wait([again], jobs["deadline"])
    resumed = _log(repo, "c", again)
    assert states[again] == "COMPLETED", resumed[-3000:]
    assert f"Resuming {run_dir} from {saved.group(1)}" in resumed
    assert run_dirs(repo, "case_c_crypto", "cancelled") == [run_dir]
    log = training_log(run_dir)
    assert log["status"] == "finished" and [e["epoch"] for e in log["epochs"]] == [1, 2]
    assert log["slurm_job_id"] == again and len(log["resumes"]) == 1


def test_launch_parallel_training_submits_both_cases_and_its_monitor_runs(jobs):
    repo, proc = jobs["repo"], jobs["launch"]
    assert proc.returncode == 0, proc.stdout + proc.stderr
    ids = re.findall(r"Submitted case ([bc]): job (\d+)", proc.stdout)
    assert [case for case, _ in ids] == ["b", "c"]
    job_ids = [job_id for _, job_id in ids]
    assert f"Jobs: {','.join(job_ids)}" in proc.stdout and f"scancel {' '.join(job_ids)}" in proc.stdout
    states = _wait(job_ids, jobs["deadline"])
    assert all(states[j] == "COMPLETED" for j in job_ids), states
    monitor = subprocess.run(
        [str(repo / "monitor_training.sh")], cwd="/", env=job_env(), capture_output=True, text=True, timeout=120
    )
    assert monitor.returncode == 0, monitor.stderr
    for key, job_id in zip("bc", job_ids):
        case = CASES[key][0]
        (run_dir,) = run_dirs(repo, case, "launched")
        assert training_log(run_dir)["status"] == "finished"
        # Both jobs can start in the same second, so the run name alone may match the other case's row.
        row = next(line for line in monitor.stdout.splitlines() if line.startswith(case) and run_dir.name in line)
        assert job_id in row and "finished" in row and "2/2" in row
        assert f"-- {case}/logs/" in monitor.stdout
    assert re.search(rf"^{job_ids[0]} long reduced root (COMPLETED|COMPLETING) ", monitor.stdout, flags=re.M)


def test_bench_slurm_reports_start_and_requeue_latency_as_json(jobs):
    bench, out = jobs["bench"]
    stdout, stderr = bench.communicate(timeout=max(1.0, jobs["deadline"] - time.monotonic()))
    assert bench.returncode == 0, stdout[-3000:] + stderr[-3000:]
    result = json.loads(out.read_text())
    rows = {r["figure"]: r for r in result["rows"]}
    best = result["figures"]["best"]
    assert rows["sbatch -> first training step"]["value"] == best["sbatch_to_first_step"] > 0
    assert rows["requeue (USR2) -> resumed step"]["value"] == best["requeue_to_resumed_step"] > 0
    parts = ("signal_to_checkpoint", "checkpoint_to_requeued", "requeued_to_running", "resume_startup")
    assert sum(best[p] for p in parts) == pytest.approx(best["requeue_to_resumed_step"])
    assert "sbatch -> first training step" in stdout
