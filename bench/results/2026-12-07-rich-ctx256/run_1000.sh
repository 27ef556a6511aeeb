#!/bin/bash
# A context-256 run (trained by run.sh) on 1,000 test dates instead of 500, as
# bench/results/2026-12-06-rich-within-bin/run_1000.sh scored its context-128 run:
# bash run_1000.sh SEED (seed 0 first; 1 and 2 later, side by side), then
# bash run_1000.sh ensemble (the three seeds as one equal-weight ensemble, on the same origins).
# From the repository root, one torch thread.
set -euo pipefail
export OMP_NUM_THREADS=1
R=bench/results/2026-12-07-rich-ctx256
seed=${1:-0}
if [ "$seed" = ensemble ]; then
  runs=()
  for s in 0 1 2; do runs+=("$(jq -r .run "$R/points/rich1m_ctx256_s$s.json")"); done
  marketgpt scorecard ${runs[@]+"${runs[@]}"} --origins 1000 --samples 200 --horizons 1,5 > "$R/scorecard_ensemble_1000.txt"
  jq '{run, interval, origins, samples, seed, baselines, headlines, ceiling_lines, horizons}' \
    "${runs[0]}/ensemble_3/scorecard.json" > "$R/scorecard_ensemble_1000.json"
  exit 0
fi
run=$(jq -r .run "$R/points/rich1m_ctx256_s$seed.json")
marketgpt scorecard "$run" --origins 1000 --samples 200 --horizons 1,5 > "$R/scorecard_s${seed}_1000.txt"
jq '{run, interval, origins, samples, seed, baselines, headlines, ceiling_lines, horizons}' "$run/scorecard.json" \
  > "$R/scorecard_s${seed}_1000.json"
