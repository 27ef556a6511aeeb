"""Where a process sits in a job and how ranks talk: DDP, precision, the job store, the GPUs'
health; what a job reads of Slurm (scheduler.py: its environment, squeue, scontrol, sinfo; standard
library only, for the login-node commands) and the exit code that asks for a requeue (requeue.py)."""
