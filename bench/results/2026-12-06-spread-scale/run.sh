#!/bin/bash
# The commands behind this folder, from the repository root (2 vCPU, one torch thread per process,
# two side by side). The runs are the quickstart's at seeds 42, 1 and 2, trained as
# bench/results/2026-12-06-sample-ensemble/run.sh trains them (`./quickstart.sh --set training.seed=S
# --set experiment="sample_seedS"`).
set -e
export OMP_NUM_THREADS=1
R=bench/results/2026-12-06-spread-scale
for seed in 42 1 2; do
  dirs=(case_c_crypto/checkpoints/"sample_seed${seed}"_*)
  python bench/bench_spread.py "${dirs[-1]}" --json "$R/sample_seed$seed.json" > "$R/sample_seed$seed.txt"
done
