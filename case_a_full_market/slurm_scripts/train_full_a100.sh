#!/bin/bash
# Case A (600 assets, full market): train on one node with 2x A100, one task per GPU (DDP).
#
#   sbatch case_a_full_market/slurm_scripts/train_full_a100.sh         # from the repo root
#   cd case_a_full_market/slurm_scripts && sbatch train_full_a100.sh   # or from here
#   sbatch train_full_a100.sh --set training.epochs=5                  # arguments reach `marketgpt train`
#   tail -f case_a_full_market/logs/full_<JOBID>.out                   # (and .err), either way
#
# The resources below must match the "slurm" section of configs/full_market_config.json
# (tests/test_slurm_scripts.py checks it). Override them for one job on the command line,
# e.g. `sbatch --partition=medium --time=2-00:00:00 ...`: the job requeues itself before each
# time limit and resumes, so a 7-day run also fits a 2-day partition.
#
# sbatch runs a spooled copy of this file, so the last lines first find the repo: from the path
# sbatch was given (scontrol's Command=), else walking up from the directory sbatch was called in.
# common/slurm/job.sh, shared by the three cases, does the rest (logs, srun, requeue).
#SBATCH --job-name=full_market
#SBATCH --partition=long
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=2           # one task per GPU
#SBATCH --cpus-per-task=32            # 64 CPUs in all
#SBATCH --gres=gpu:a100:2
#SBATCH --mem=128G
#SBATCH --time=7-00:00:00
#SBATCH --signal=B:USR2@600           # slurm.signal_minutes_before_limit: checkpoint, then requeue
#SBATCH --requeue
#SBATCH --open-mode=append            # a requeued job appends to its logs
#SBATCH --output=slurm_%x_%j.out      # only Slurm's own messages; the job logs to ../logs (see job.sh)

CASE=case_a_full_market
CONFIG=configs/full_market_config.json
LOG_PREFIX=full
REPO=$(scontrol show job "${SLURM_JOB_ID:-none}" 2>/dev/null | sed -n "s|^ *Command=\(.*\)/$CASE/slurm_scripts/.*|\1|p")
[ -f "$REPO/common/slurm/job.sh" ] || REPO=$(cd "${SLURM_SUBMIT_DIR:-$(dirname "$(readlink -f "$0")")}" && until [ -f common/slurm/job.sh ] || [ "$PWD" = / ]; do cd ..; done && pwd)
# shellcheck source=common/slurm/job.sh
source "$REPO/common/slurm/job.sh" 2>/dev/null || { echo "cannot find the MarketGPT repo (common/slurm/job.sh)" >&2; exit 2; }
marketgpt_train "$@"
