#!/bin/bash
# The commands behind this folder, from the repository root (2 vCPU, one torch thread per process).
# The quickstart's model at seeds 42, 1 and 2 (trained as bench/results/2026-12-06-within-bin's
# are: the same weights, training being deterministic), then each run's sampled paths with their
# variance pulled toward the asset's long-run level, the pull chosen per horizon on validation and
# scored on test (`python bench/bench_spread.py RUN --revert`).
set -euo pipefail
export OMP_NUM_THREADS=1
R=bench/results/2026-12-07-vol-reversion
step=${1:-all}  # bash run.sh train | bash run.sh bench SEED | bash run.sh all
if [ "$step" = train ] || [ "$step" = all ]; then
  for s in 42 1 2; do
    ./quickstart.sh --set "training.seed=$s" --set "experiment=\"rv_seed$s\"" > "$R/train_seed$s.txt"
  done
fi
if [ "$step" = bench ] || [ "$step" = all ]; then
  for s in ${2:-42 1 2}; do
    dirs=(case_c_crypto/checkpoints/"rv_seed${s}"_*)
    python bench/bench_spread.py "${dirs[-1]}" --revert --json "$R/revert_seed$s.json" > "$R/revert_seed$s.txt"
  done
fi
