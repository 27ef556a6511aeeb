#!/bin/bash
# The commands behind this folder, from the repository root (2 vCPU).
# The quickstart's model on the shipped sample at three seeds (42, its default, then 1 and 2), each
# scored alone with the default scorecard, then the three as one equal-weight ensemble on the same
# origins (docs/forecasting.md, "Ensembles of seeds").
set -e
R=bench/results/2026-12-06-sample-ensemble
runs=()
for seed in 42 1 2; do
  ./quickstart.sh --set "training.seed=$seed" --set "experiment=\"sample_seed$seed\"" > "$R/train_seed$seed.txt"
  dirs=(case_c_crypto/checkpoints/"sample_seed${seed}"_*)
  run=${dirs[-1]}  # the newest: run folders end in their start time
  runs+=("$run")
  marketgpt scorecard "$run" > "$R/scorecard_seed$seed.txt"
  jq '{run, origins, samples, baselines, headlines, horizons}' "$run/scorecard.json" > "$R/scorecard_seed$seed.json"
done
marketgpt scorecard ${runs[@]+"${runs[@]}"} > "$R/scorecard_ensemble.txt"
jq '{run, origins, samples, baselines, headlines, horizons}' "${runs[0]}/ensemble_3/scorecard.json" > "$R/scorecard_ensemble.json"
