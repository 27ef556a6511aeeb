"""The Trainer and what it keeps: batches, schedule, checkpoints, RNG, the log, run folders."""
