#!/bin/bash
# The commands behind this folder, from the repository root (2 vCPU, one torch thread per process).
# The quickstart at seeds 42, 1 and 2, which now fits its volatility reversion on validation at the
# end of training (reversion.json; the same weights as bench/results/2026-12-07-vol-reversion's runs,
# training being deterministic); then per run, on the same draws, the fitted pull against the paths
# as sampled on test (`bench_spread.py --fitted`), and the default scorecard of the run as shipped.
set -euo pipefail
export OMP_NUM_THREADS=1
R=bench/results/2026-12-07-reversion-shipped
step=${1:-all}  # bash run.sh train | bench SEED | card SEED | ensemble | all
if [ "$step" = train ] || [ "$step" = all ]; then
  for s in 42 1 2; do
    ./quickstart.sh --set "training.seed=$s" --set "experiment=\"rs_seed$s\"" > "$R/train_seed$s.txt"
  done
fi
if [ "$step" = bench ] || [ "$step" = all ]; then
  for s in ${2:-42 1 2}; do
    dirs=(case_c_crypto/checkpoints/"rs_seed${s}"_*)
    python bench/bench_spread.py "${dirs[-1]}" --fitted --json "$R/fitted_seed$s.json" > "$R/fitted_seed$s.txt"
  done
fi
if [ "$step" = card ] || [ "$step" = all ]; then
  for s in ${2:-42 1 2}; do
    dirs=(case_c_crypto/checkpoints/"rs_seed${s}"_*)
    python -m common.cli scorecard "${dirs[-1]}" > "$R/scorecard_seed$s.txt"
    cp "${dirs[-1]}/scorecard.json" "$R/scorecard_seed$s.json"
    cp "${dirs[-1]}/reversion.json" "$R/reversion_seed$s.json"
  done
fi
if [ "$step" = ensemble ] || [ "$step" = all ]; then
  # the three seeds' equal-weight ensemble, each run reverting its own share of the paths
  runs=()
  for s in 42 1 2; do
    dirs=(case_c_crypto/checkpoints/"rs_seed${s}"_*)
    runs+=("${dirs[-1]}")
  done
  python -m common.cli scorecard ${runs[@]+"${runs[@]}"} > "$R/scorecard_ensemble.txt"
  cp "${runs[0]}/ensemble_3/scorecard.json" "$R/scorecard_ensemble.json"
fi
