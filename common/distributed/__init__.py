"""Where a process sits in a job and how ranks talk: DDP, precision, Slurm environment, requeue."""
