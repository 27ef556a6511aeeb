#!/usr/bin/env bash
# The tokenizer's volatility half-life: 60 candles against the default 20, the quickstart's three
# seeds, everything else as the quickstart. Scored by bench_spread on the validation split (the
# within-bin draws, as the default forecasts); the other side is the default runs' JSONs of
# ../2026-12-06-within-bin (same origins, same draws' seeds). One thread per process, two side by side.
set -euo pipefail
cd "$(dirname "$0")/../../.."
out=bench/results/2026-12-06-vol-halflife
train() {
  ./quickstart.sh --set "training.seed=$1" --set "experiment=\"hl60_seed$1\"" \
    --set "tokenizer.vol_halflife=60" >"$out/train_seed$1.txt"
}
score() {
  local dirs=(case_c_crypto/checkpoints/"hl60_seed$1"_*)
  OMP_NUM_THREADS=1 python bench/bench_spread.py "${dirs[-1]}" --json "$out/hl60_seed$1.json" >"$out/hl60_seed$1.txt"
}
train 42 & train 1; wait
train 2
score 42 & score 1; wait
score 2
base=bench/results/2026-12-06-within-bin
python bench/bench_spread.py --compare "$out/hl60_seed42.json,$out/hl60_seed1.json,$out/hl60_seed2.json" \
  "$base/within_seed42.json,$base/within_seed1.json,$base/within_seed2.json" --json "$out/compare.json" >"$out/compare.txt"
(cd "$out" && python coverage.py hl60 "hl60_seed{}.json" >coverage.txt)
