"""The contract between the trainer and what restarts it (common/slurm/job.sh and `marketgpt
submit`): the exit code that means "saved a checkpoint, run me again", and how many times a job
may requeue itself. job.sh repeats both in shell; tests/test_slurm_scripts.py checks they agree.
"""

from __future__ import annotations

import os

EXIT_REQUEUE = 75  # EX_TEMPFAIL ("try again"): saved a checkpoint on SIGTERM/SIGUSR2 and stopped
# A job that requeues itself more often than this is stuck (a checkpoint that never makes
# progress); the sbatch scripts and `marketgpt submit` both stop there.
DEFAULT_MAX_REQUEUES = 20
MAX_REQUEUES = int(os.environ.get("MARKETGPT_MAX_REQUEUES", DEFAULT_MAX_REQUEUES))
