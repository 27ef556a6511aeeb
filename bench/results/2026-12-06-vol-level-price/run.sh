#!/bin/bash
# The commands behind this folder, from the repository root (2 vCPU, one torch thread per process,
# two side by side). The quickstart with model.vol_level_input=true at seeds 42, 1, 2, each scored
# in price space on validation and test with bench/bench_spread.py, then compared seed by seed with
# the same seeds trained without it (bench/results/2026-12-06-spread-scale).
set -e
export OMP_NUM_THREADS=1
R=bench/results/2026-12-06-vol-level-price
for seed in 42 1 2; do
  ./quickstart.sh --set "training.seed=$seed" --set "experiment=\"vollevel_seed$seed\"" \
    --set model.vol_level_input=true > "$R/train_seed$seed.txt"
  dirs=(case_c_crypto/checkpoints/"vollevel_seed${seed}"_*)
  python bench/bench_spread.py "${dirs[-1]}" --json "$R/vollevel_seed$seed.json" > "$R/vollevel_seed$seed.txt"
done
S=bench/results/2026-12-06-spread-scale
python bench/bench_spread.py --compare "$R/vollevel_seed42.json,$R/vollevel_seed1.json,$R/vollevel_seed2.json" \
  "$S/sample_seed42.json,$S/sample_seed1.json,$S/sample_seed2.json" --json "$R/compare.json" > "$R/compare.txt"
