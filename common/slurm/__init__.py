"""Everything Slurm, in one place.

- job.sh, cluster_env.sh: what an sbatch job does once started (sourced by each case's script):
  the plan, srun, the exit code that asks for a requeue.
- scheduler.py: the job's environment (SLURM_* variables) and the scheduler's commands
  (squeue, scontrol, sinfo) as the rest of the library reads them.
- requeue.py: the exit code that means "requeue me" and the requeue budget.
- submit.py: `marketgpt submit` (submitit; one job or an array), with its plan and checks.
- prepare_jobs.py: `marketgpt data prepare --array N`, a token shard as four dependent jobs.
- sweep_jobs.py: `marketgpt sweep`'s points as one job array.

scheduler.py and requeue.py use nothing but the standard library and stand on the ground floor,
so that training reads its job's environment from here; submit, prepare_jobs and sweep_jobs
stand on the cluster floor (they start commands). tests/test_layers.py holds both.
"""
