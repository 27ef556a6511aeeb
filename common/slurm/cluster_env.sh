# shellcheck shell=bash
# ============================================================================================
# CLUSTER ENVIRONMENT: the one place to adapt to your cluster. Sourced (never run) before
# anything starts python: by every case_*/slurm_scripts/train_*_a100.sh job (through
# common/slurm/job.sh), by launch_parallel_training.sh and the monitor_training.sh it writes,
# and by every `marketgpt submit` job (the submitit executor's `setup` lines). Add what your
# cluster needs below, e.g.:
#
#   module load python/3.11 cuda/12.1
#   source "$HOME/miniconda3/etc/profile.d/conda.sh" && conda activate llm-training
#   source "$HOME/venvs/marketgpt/bin/activate"
#   export NCCL_SOCKET_IFNAME=ib0
#   module load gcc        # training.compile (on in the case configs) needs a C compiler on the
#                          # node; without one the job trains eagerly and says so in its log
#   export TORCHINDUCTOR_CACHE_DIR=$HOME/.cache/torchinductor   # a requeued job reuses the compiled kernels
#
# sbatch passes the submitting shell's environment on to the job, so an environment active
# when you submit is active in the job too; lines here also hold where it is not.
# ============================================================================================

# (your cluster's lines here)

# ============================================================================================
# The python the sbatch scripts and the launcher run: $MARKETGPT_PYTHON if set, else the
# repo's .venv, else python3 on PATH. (A `marketgpt submit` job runs the interpreter that
# submitted it, with the environment set up above.)
_marketgpt_repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
if [ -n "${MARKETGPT_PYTHON:-}" ]; then
    PYTHON=$MARKETGPT_PYTHON
elif [ -x "$_marketgpt_repo/.venv/bin/python" ]; then
    PYTHON=$_marketgpt_repo/.venv/bin/python
elif ! PYTHON=$(command -v python3 || command -v python); then
    echo "marketgpt: no python3 on PATH; add what makes it available to $_marketgpt_repo/common/slurm/cluster_env.sh" >&2
    return 1
fi
export PYTHON
