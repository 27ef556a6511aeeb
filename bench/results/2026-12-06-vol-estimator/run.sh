#!/usr/bin/env bash
# What the tokenizer's volatility EWMA averages: each candle's Parkinson variance of its true range
# ("range") against its squared log-close move (the default "close"), the quickstart's three seeds,
# everything else as the quickstart. Scored by bench_spread on the validation split (the within-bin
# draws, as the default forecasts); the other side is the default runs' JSONs of
# ../2026-12-06-within-bin (same origins, same draws' seeds). One thread per process, two side by side.
set -euo pipefail
cd "$(dirname "$0")/../../.."
out=bench/results/2026-12-06-vol-estimator
train() {
  ./quickstart.sh --set "training.seed=$1" --set "experiment=\"range_seed$1\"" \
    --set 'tokenizer.vol_estimator="range"' >"$out/train_seed$1.txt"
}
score() {
  local dirs=(case_c_crypto/checkpoints/"range_seed$1"_*)
  OMP_NUM_THREADS=1 python bench/bench_spread.py "${dirs[-1]}" --json "$out/range_seed$1.json" >"$out/range_seed$1.txt"
}
train 42 & train 1; wait
train 2
score 42 & score 1; wait
score 2
base=bench/results/2026-12-06-within-bin
python bench/bench_spread.py --compare "$out/range_seed42.json,$out/range_seed1.json,$out/range_seed2.json" \
  "$base/within_seed42.json,$base/within_seed1.json,$base/within_seed2.json" --json "$out/compare.json" >"$out/compare.txt"
(cd bench/results/2026-12-06-vol-halflife && python coverage.py range "../2026-12-06-vol-estimator/range_seed{}.json") \
  >"$out/coverage.txt"
python bench/results/2026-12-06-vol-estimator/sigma_likelihood.py >"$out/sigma_likelihood.txt"
