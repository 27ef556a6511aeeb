#!/bin/bash
# The commands behind this folder, from the repository root (2 vCPU, one torch thread per process).
# The quickstart at seeds 42, 1 and 2 (the same weights as bench/results/2026-12-07-reversion-shipped's
# runs, training being deterministic), then per run `bench_spread.py --long-run`: the reversion's
# taus with the long-run variance over the asset's last 125, 250, 500 (the library's) or 1,000
# returns, one pull for every horizon chosen on validation, scored on test against the best pull at
# 500 and the paths as sampled, on the same draws.
set -euo pipefail
export OMP_NUM_THREADS=1
R=bench/results/2026-12-07-long-run
step=${1:-all}  # bash run.sh train SEED | bench SEED | all
if [ "$step" = train ] || [ "$step" = all ]; then
  for s in ${2:-42 1 2}; do
    ./quickstart.sh --set "training.seed=$s" --set "experiment=\"lr_seed$s\"" > "$R/train_seed$s.txt"
  done
fi
if [ "$step" = bench ] || [ "$step" = all ]; then
  for s in ${2:-42 1 2}; do
    dirs=(case_c_crypto/checkpoints/"lr_seed${s}"_*)
    python bench/bench_spread.py "${dirs[-1]}" --long-run --json "$R/long_run_seed$s.json" > "$R/long_run_seed$s.txt"
    cp "${dirs[-1]}/reversion.json" "$R/reversion_seed$s.json"
  done
fi
