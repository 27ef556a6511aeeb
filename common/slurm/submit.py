"""`marketgpt submit`: a case's training as a Slurm job (or job array) through submitit.

    marketgpt submit --case case_c_crypto [--config FILE] [--set k=v ...] [--array seeds=1,2,3]
                     [--local] [--dry-run]

The job asks for what the case's sbatch script asks for, taken from the config's `slurm`
section (tests/test_slurm_scripts.py keeps the two equal): `nodes`, one task per GPU
(`tasks_per_node` = `gpus_per_node`), `cpus_per_task`, `--gres=gpu:<type>:<n>`, `mem_gb`,
`time`, `partition`, and USR2 `signal_minutes_before_limit` before the time limit. Each task
runs `marketgpt train --config ... --num-gpus N --resume auto` (DDP over the tasks).

Requeue: `TrainJob` is a submitit Checkpointable. On USR2 the trainer saves a checkpoint and
returns 75; the job then hands the signal to submitit, which calls `checkpoint()` (the same
training, pinned to this job's run folder) and requeues it. submitit counts every signal
that comes after min(0.8 x limit, limit - 10 min) as a time-out, and allows only
`max_num_timeout` of those (3 by default): short jobs always look timed out, and a 7-day run
on a 2-day partition needs 4, so the cap is raised to common.distributed.requeue.MAX_REQUEUES.

Nothing is queued before the case, the config with its overrides, every array value and the
partition have been checked. There is no `sacct` on some clusters (submitit then reports the
state as UNKNOWN and `job.result()` can wait forever on a job killed outside Python), so
waiting goes through common.distributed.scheduler.wait_for_jobs (squeue / scontrol, with a timeout).
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import signal
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Optional, Sequence, TextIO

import submitit

from common.config import Config, SlurmConfig, load_config
from common.distributed.requeue import EXIT_REQUEUE, MAX_REQUEUES
from common.distributed.scheduler import check_partition, job_info, parse_slurm_time, slurm_available, slurm_job_id
from common.errors import UserError
from common.paths import REPO_ROOT, case_config, case_dir, case_dir_of_config

__all__ = [
    "Submission",
    "TrainJob",
    "local_gpus",
    "parse_array",
    "plan_submission",
    "submit",
    "executor_parameters",
    "job_environment",
    "rel_path",
]

CLUSTER_ENV = REPO_ROOT / "common" / "slurm" / "cluster_env.sh"  # the one place to adapt to a cluster
ARRAY_ALIASES = {"seeds": "training.seed", "seed": "training.seed"}


@dataclass
class Submission:
    """One job of a submission: its config file, overrides and resolved config."""

    case: Path
    config: Path
    overrides: list[str]
    cfg: Config
    label: str  # "" for a single job, e.g. "seed=2" for an array element


# --------------------------------------------------------------------------- the job


class TrainJob(submitit.helpers.Checkpointable):
    """What each task of the job runs: `marketgpt train` for one case config (picklable:
    only paths and strings)."""

    def __init__(self, config: str, overrides: Sequence[str], num_gpus: int, resume: str = "auto") -> None:
        self.config, self.overrides, self.num_gpus, self.resume = config, list(overrides), num_gpus, resume

    def argv(self) -> list[str]:
        sets = [a for kv in self.overrides for a in ("--set", kv)]
        return ["train", "--config", self.config, "--num-gpus", str(self.num_gpus), "--resume", self.resume, *sets]

    def __call__(self) -> int:
        from common.commands.train import run_training  # lazy: torch, in the job only

        env = submitit.JobEnvironment()
        os.environ["MARKETGPT_LOG_FILE"] = str(env.paths.stdout)  # recorded in training_log.json
        try:
            code = run_training(Path(self.config), self.overrides, self.resume, num_gpus=self.num_gpus)
        except UserError as e:  # as `marketgpt train` reports it: one line, exit 2
            print(f"marketgpt train: error: {e}", file=sys.stderr, flush=True)
            code = 2
        if code == EXIT_REQUEUE and still_running(env.cluster, slurm_job_id()):
            # The trainer caught USR2 (its handler stood in for submitit's while it trained),
            # saved and stopped. Hand the signal to submitit now: on rank 0 it calls
            # checkpoint() and requeues the job; on the other ranks it does nothing.
            signal.raise_signal(env._usr_sig())
        if code == EXIT_REQUEUE:
            return code  # after scancel (SIGTERM) the checkpoint stays: submit again to resume
        if code != 0:
            raise RuntimeError(f"marketgpt {' '.join(self.argv())} exited with {code}; see {env.paths.stderr}")
        return code

    def checkpoint(self, *args: Any, **kwargs: Any) -> submitit.helpers.DelayedSubmission:
        """The same training, resuming this job's own run (--resume auto while it has no
        checkpoint yet); submitit requeues it."""
        from common.run.resume import resumable_run  # lazy: torch, in the job only

        cfg = load_config(self.config, self.overrides)
        # inside the job, the run this job trains; "auto" while it has no checkpoint yet
        run = resumable_run(case_dir_of_config(self.config) / "checkpoints", cfg.experiment)
        resume = str(run) if run is not None else "auto"
        return submitit.helpers.DelayedSubmission(TrainJob(self.config, self.overrides, self.num_gpus, resume))


def still_running(cluster: str, job_id: Optional[str]) -> bool:
    """Whether a job whose trainer stopped with a checkpoint should requeue: yes after USR2
    (the job is still RUNNING), no after scancel (Slurm already marks it COMPLETING)."""
    if cluster != "slurm" or not job_id:
        return True  # the local executor restarts its tasks itself
    info = job_info(job_id)
    return info is None or info.get("JobState") == "RUNNING"


# --------------------------------------------------------------------------- planning


def parse_array(spec: str) -> tuple[str, list[str]]:
    """`seeds=1,2,3` or `section.key=v1,v2` -> (config key, values)."""
    key, sep, values = spec.partition("=")
    key = ARRAY_ALIASES.get(key.strip(), key.strip())
    items = [v.strip() for v in values.split(",") if v.strip()]
    if not sep or "." not in key or not items:
        raise UserError(
            f"--array {spec!r}: expected seeds=1,2,3 or section.key=v1,v2 (e.g. training.learning_rate=1e-4,3e-4)"
        )
    if len(set(items)) != len(items):
        raise UserError(f"--array {spec!r}: a value is repeated")
    return key, items


def _label(key: str, value: str) -> str:
    leaf = "seed" if key == "training.seed" else key.split(".")[-1]
    return re.sub(r"[^A-Za-z0-9._-]", "_", f"{leaf}{value}")


def plan_submission(
    case: str, config: Optional[Path] = None, overrides: Sequence[str] = (), array: Optional[str] = None
) -> list[Submission]:
    """Check everything that can be checked without Slurm; one Submission per job.

    Each array element trains its own experiment (`<experiment>_<key><value>`, e.g.
    crypto_prototype_seed2), so `--resume auto` keeps their run folders apart."""
    folder = case_dir(case)  # a typo gets "did you mean"
    config = Path(config) if config is not None else case_config(folder)
    cfg = load_config(config, overrides)  # missing file, unknown key, bad value: ConfigError
    parse_slurm_time(cfg.slurm.time)
    if array is None:
        return [Submission(folder, config.resolve(), list(overrides), cfg, "")]
    key, values = parse_array(array)
    jobs = []
    for value in values:
        extra = [f"{key}={value}", f"experiment={cfg.experiment}_{_label(key, value)}"]
        try:
            job_cfg = load_config(config, [*overrides, *extra])
        except UserError as e:
            raise UserError(f"--array {key}={value}: {str(e).split(': ', 1)[-1]}") from None
        jobs.append(Submission(folder, config.resolve(), [*overrides, *extra], job_cfg, f"{key}={value}"))
    return jobs


def executor_parameters(s: SlurmConfig, signal_delay_s: Optional[int] = None) -> dict:
    """submitit SlurmExecutor parameters for a config's `slurm` section."""
    return {
        "job_name": s.job_name,
        "partition": s.partition,
        "nodes": s.nodes,
        "ntasks_per_node": s.gpus_per_node,  # one task (DDP rank) per GPU
        "cpus_per_task": s.cpus_per_task,
        "gres": f"gpu:{s.gpu_type}:{s.gpus_per_node}",
        "mem": f"{s.mem_gb}GB",
        "time": parse_slurm_time(s.time),
        "signal_delay_s": 60 * s.signal_minutes_before_limit if signal_delay_s is None else signal_delay_s,
        # srun 22.05+ doesn't inherit --cpus-per-task from the allocation
        "srun_args": [f"--cpus-per-task={s.cpus_per_task}"],
        # the cluster environment (module load, conda activate), as every sbatch script sources it
        "setup": [
            f"source {shlex.quote(str(CLUSTER_ENV))} || exit 1",
            "export PYTORCH_CUDA_ALLOC_CONF=${PYTORCH_CUDA_ALLOC_CONF:-max_split_size_mb:512}",
            f"export OMP_NUM_THREADS=${{OMP_NUM_THREADS:-{s.cpus_per_task}}}",
        ],
        "additional_parameters": {"requeue": True},
    }


# --------------------------------------------------------------------------- submitting


@contextlib.contextmanager
def job_environment() -> Iterator[None]:
    """The job (sbatch exports the submitting environment; the local executor copies it)
    imports `common` from this repo even where the package isn't installed."""
    old = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT)] + ([old] if old else []))
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = old


def rel_path(path: Path) -> str:
    """`path` relative to the current directory when it lies below it, else absolute."""
    path = Path(path).absolute()
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def submit(
    case: str,
    config: Optional[Path] = None,
    overrides: Sequence[str] = (),
    *,
    array: Optional[str] = None,
    local: bool = False,
    dry_run: bool = False,
    out: Optional[TextIO] = None,
    signal_delay_s: Optional[int] = None,
) -> list:
    """Submit the case's training; returns the submitit jobs (none for a dry run).

    `signal_delay_s` overrides slurm.signal_minutes_before_limit in seconds (tests, benchmarks)."""
    out = out or sys.stdout
    plan = plan_submission(case, config, overrides, array)
    s = plan[0].cfg.slurm
    params = executor_parameters(s, signal_delay_s)
    if not local:
        _check_slurm(plan)
    _print_plan(plan, params, local, out)
    if dry_run:
        print("Dry run: nothing submitted.", file=out)
        return []

    executor = _make_executor(plan, params, local)
    fns = [TrainJob(str(job.config), job.overrides, s.gpus_per_node) for job in plan]
    with job_environment():
        jobs = executor.submit_array(fns) if len(fns) > 1 else [executor.submit(fns[0])]
    _print_submitted(jobs, plan, local, out)
    out.flush()
    return jobs


def _check_slurm(plan: list[Submission]) -> None:
    """Fail before submitting when Slurm does not answer or a job's partition does not exist."""
    if not slurm_available():
        raise UserError(
            "Slurm does not answer here (no squeue/sinfo, or slurmctld is down); run it on the "
            "cluster's login node, or try it on this machine with --local"
        )
    for job in plan:
        check_partition(job.cfg.slurm.partition)


def _print_plan(plan: list[Submission], params: dict, local: bool, out: TextIO) -> None:
    """What is about to be submitted: the resources, then each job's `marketgpt` command line."""
    s = plan[0].cfg.slurm
    where = "locally (submitit LocalExecutor)" if local else f"to partition {s.partition}"
    print(
        f"{plan[0].case.name}: {len(plan)} job(s) {where}: {s.nodes} node(s) x {s.gpus_per_node} task(s) "
        f"({params['gres']}), {s.cpus_per_task} CPUs/task, {s.mem_gb}G, time {s.time}, USR2 "
        f"{params['signal_delay_s']} s before the limit",
        file=out,
    )
    for job in plan:
        print(
            f"  marketgpt {' '.join(TrainJob(rel_path(job.config), job.overrides, s.gpus_per_node).argv())}"
            + (f"   [{job.label}]" if job.label else ""),
            file=out,
        )


def _make_executor(plan: list[Submission], params: dict, local: bool) -> submitit.Executor:
    """The submitit executor for the plan: Slurm's, or the LocalExecutor with one GPU per task."""
    s = plan[0].cfg.slurm
    folder = plan[0].case / "logs" / "submitit"
    executor: submitit.Executor
    if local:
        executor = submitit.LocalExecutor(folder=folder, max_num_timeout=MAX_REQUEUES)
        executor.update_parameters(
            timeout_min=params["time"],
            tasks_per_node=s.gpus_per_node * s.nodes,
            signal_delay_s=params["signal_delay_s"],
            gpus_per_node=local_gpus(s.gpus_per_node * s.nodes, plan[0].cfg.training.device),
        )
    else:
        executor = submitit.SlurmExecutor(folder=folder, max_num_timeout=MAX_REQUEUES)
        executor.update_parameters(**params)
    return executor


def _print_submitted(jobs: list, plan: list[Submission], local: bool, out: TextIO) -> None:
    """Each submitted job's id with the commands to follow its logs (and, on Slurm, its state)."""
    for submitted, sub in zip(jobs, plan):
        label = f" [{sub.label}]" if sub.label else ""
        print(
            f"Submitted {'local ' if local else ''}job {submitted.job_id}{label}: experiment {sub.cfg.experiment}\n"
            f"  follow:  tail -f {rel_path(submitted.paths.stdout)}\n"
            f"  errors:  tail -f {rel_path(submitted.paths.stderr)}",
            file=out,
        )
        if not local:
            print(
                f"  state:   squeue -j {submitted.job_id}    (all runs: marketgpt status)\n"
                f"  cancel:  scancel {submitted.job_id}",
                file=out,
            )


def local_gpus(tasks: int, device: str = "auto") -> int:
    """GPUs for a --local job of `tasks` processes, one each (none with training.device=cpu).
    Without gpus_per_node submitit's LocalExecutor sets CUDA_VISIBLE_DEVICES="" and a GPU
    workstation would train on the CPU; on a machine without a usable GPU the job (which
    passes --num-gpus) would stop, so this says so before submitting."""
    from common.distributed.env import cuda_unusable_reason, visible_gpus  # lazy: torch; Slurm needs none

    if device == "cpu":
        return 0
    reason = cuda_unusable_reason()
    if reason:
        raise UserError(
            f"--local runs one process per GPU but {reason}; --set training.device=cpu trains on this machine's CPU"
        )
    have = visible_gpus()
    if have < tasks:
        raise UserError(
            f"--local runs {tasks} process(es), one per GPU, but this machine has {have} GPU(s): "
            f"--set slurm.gpus_per_node={have} (and slurm.nodes=1)"
        )
    return tasks


def wait_local(jobs: list, out: Optional[TextIO] = None) -> int:
    """Wait for local jobs (their processes are children of this one: no hang possible)."""
    out = out or sys.stdout
    code = 0
    for job in jobs:
        try:
            job.results()  # one result per task; raises the job's error
            print(f"Local job {job.job_id} finished", file=out)
        except Exception as e:  # the job's own error, also in its log
            print(
                f"Local job {job.job_id} failed: {str(e).strip().splitlines()[-1] if str(e).strip() else e}", file=out
            )
            code = 1
    return code
