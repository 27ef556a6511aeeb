#!/bin/bash
# DDP test job for tests/test_slurm_ddp.py: the case scripts' launch line (one srun task per
# GPU, --kill-on-bad-exit so one failed rank ends the step) on the shipped sample with a tiny
# model. The test passes --nodes, --ntasks-per-node and --output to sbatch, and PYTHON, REPO
# and CONFIG in the environment; extra arguments go to `marketgpt train`.
#SBATCH --job-name=marketgpt-ddp-test
#SBATCH --gres=gpu:a100:2
#SBATCH --cpus-per-task=1
#SBATCH --mem=2G
#SBATCH --time=00:15:00
set -euo pipefail
cd "$REPO"
export OMP_NUM_THREADS=1 PYTHONUNBUFFERED=1
echo "job $SLURM_JOB_ID: $SLURM_JOB_NUM_NODES node(s) $SLURM_JOB_NODELIST x $SLURM_NTASKS_PER_NODE task(s)"
srun --kill-on-bad-exit=1 "$PYTHON" -m common.cli train --config "$CONFIG" --num-gpus "$SLURM_GPUS_ON_NODE" "$@"
