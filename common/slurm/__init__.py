"""Slurm jobs: what a job script does and how jobs are submitted.

- job.sh, cluster_env.sh: what an sbatch job does once started (sourced by each case's script):
  the plan, srun, the exit code that asks for a requeue.
- submit.py: `marketgpt submit` (submitit; one job or an array), with its plan and checks.
- prepare_jobs.py: `marketgpt data prepare --array N`, a token shard as four dependent jobs.
- sweep_jobs.py: `marketgpt sweep`'s points as one job array.

They stand on the cluster floor (they start commands). What a running job reads of Slurm (its
environment, squeue and scontrol) and the exit code that asks for a requeue stand lower, where
training reads them: common/distributed/scheduler.py and requeue.py.
"""
