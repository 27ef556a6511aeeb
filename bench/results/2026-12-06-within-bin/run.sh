#!/usr/bin/env bash
# Sampled tokens decoded by draws within their bins against the bins' medians, on the quickstart's
# three seeds (the runs of bench/results/2026-12-06-spread-scale, whose JSONs are the medians' side:
# the same token paths, the same origins). One thread per run; about 11 min per run on AMD EPYC.
set -euo pipefail
cd "$(dirname "$0")/../../.."
out=bench/results/2026-12-06-within-bin
for s in 42 1 2; do
  run=$(ls -d case_c_crypto/checkpoints/sample_seed${s}_*)
  OMP_NUM_THREADS=1 python bench/bench_spread.py "$run" --within-bin --json "$out/within_seed$s.json" >"$out/within_seed$s.txt"
done
base=bench/results/2026-12-06-spread-scale
python bench/bench_spread.py --compare "$out/within_seed42.json,$out/within_seed1.json,$out/within_seed2.json" \
  "$base/sample_seed42.json,$base/sample_seed1.json,$base/sample_seed2.json" --json "$out/compare.json" >"$out/compare.txt"
# The default scorecard with the draws: the quickstart trained again (its shard and tokenizer now
# carry the within-bin quantiles; the same tokens and weights as before, training being
# deterministic), each seed scored alone, then the three as one ensemble.
runs=()
for s in 42 1 2; do
  ./quickstart.sh --set "training.seed=$s" --set "experiment=\"wb_seed$s\"" >"$out/train_seed$s.txt"
  dirs=(case_c_crypto/checkpoints/"wb_seed${s}"_*)
  run=${dirs[-1]}
  runs+=("$run")
  marketgpt scorecard "$run" >"$out/scorecard_seed$s.txt"
  jq '{run, origins, samples, baselines, headlines, horizons}' "$run/scorecard.json" >"$out/scorecard_seed$s.json"
done
marketgpt scorecard ${runs[@]+"${runs[@]}"} >"$out/scorecard_ensemble.txt"
jq '{run, origins, samples, baselines, headlines, horizons}' "${runs[0]}/ensemble_3/scorecard.json" >"$out/scorecard_ensemble.json"
# the ensemble's rank IC against its members' on half the card's dates
python bench/results/2026-12-06-within-bin/ensemble_ic.py >"$out/ensemble_ic.txt"
