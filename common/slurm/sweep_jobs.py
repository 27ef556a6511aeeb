"""`marketgpt sweep` on Slurm: one job array through submitit, one task per missing point.

Each task trains its point on one GPU of the config's slurm section (common/commands/sweep.py's
run_point): a finished point is skipped, a requeued task resumes its point's run (--resume
auto), and every task rewrites sweep.json from the finished points when it ends (a summary that
may lag when tasks end together: its readers assemble the point files, common/commands/sweep.py).
Submitting the
same sweep again queues only the points that are missing. torch stays out of this module (it
is a login-node command): the task imports the training when it runs.
"""

from __future__ import annotations

import signal
import sys
from typing import Any, Optional, TextIO

import submitit

from common.distributed.requeue import EXIT_REQUEUE
from common.distributed.scheduler import check_partition, slurm_available, slurm_job_id
from common.errors import UserError
from common.slurm.submit import executor_parameters, job_environment, rel_path, still_running

__all__ = ["SweepTask", "submit_sweep"]


class SweepTask(submitit.helpers.Checkpointable):
    """One point of a sweep (picklable: the Sweep holds paths, strings and the parsed config)."""

    def __init__(self, sweep: Any, point: Any) -> None:
        self.sweep, self.point = sweep, point

    def __repr__(self) -> str:
        return f"SweepTask({self.sweep.name} {self.point.name})"

    def __call__(self) -> int:
        from common.commands.sweep import run_point, write_sweep  # lazy: torch, in the job only

        try:
            code = run_point(self.sweep, self.point)
        except UserError as e:  # as `marketgpt sweep` reports it
            print(f"marketgpt sweep: error: {e}", file=sys.stderr, flush=True)
            raise
        if code == EXIT_REQUEUE:
            env = submitit.JobEnvironment()
            if still_running(env.cluster, slurm_job_id()):  # the trainer caught USR2: submitit requeues
                signal.raise_signal(env._usr_sig())
            return code
        if code != 0:
            raise RuntimeError(f"sweep point {self.point.name} exited with {code}")
        write_sweep(self.sweep)
        return 0

    def checkpoint(self, *args: Any, **kwargs: Any) -> submitit.helpers.DelayedSubmission:
        """The same point again: run_point resumes its run or skips it once finished."""
        return submitit.helpers.DelayedSubmission(SweepTask(self.sweep, self.point))


def submit_sweep(sweep: Any, out: Optional[TextIO] = None) -> list:
    """Queue the sweep's missing points as one job array (one GPU a task); [] when none is missing."""
    out = out or sys.stdout
    missing = sweep.missing()
    if not missing:
        print(f"sweep {sweep.name}: every point is finished; nothing to submit", file=out)
        return []
    if not slurm_available():
        raise UserError("Slurm does not answer here (no squeue/sinfo, or slurmctld is down); run it with --local")
    s = sweep.cfg.slurm
    check_partition(s.partition)
    params = executor_parameters(s)
    params.update(
        nodes=1,
        ntasks_per_node=1,
        gres=f"gpu:{s.gpu_type}:1",
        job_name=f"{s.job_name}-sweep",
        array_parallelism=len(missing),
    )
    executor = submitit.SlurmExecutor(folder=sweep.folder / "logs")
    executor.update_parameters(**params)
    with job_environment():
        jobs = executor.submit_array([SweepTask(sweep, p) for p in missing])
    array = str(jobs[0].job_id).split("_")[0]
    print(
        f"sweep {sweep.name}: submitted job array {array} ({len(missing)} of {len(sweep.points)} points: "
        f"{', '.join(p.name for p in missing)})\n"
        f"  state:   squeue -j {array}; marketgpt status\n"
        f"  logs:    {rel_path(sweep.folder / 'logs')}/\n"
        f"  results: {rel_path(sweep.folder / 'sweep.json')} (submit again to queue what is missing)",
        file=out,
        flush=True,
    )
    return jobs
