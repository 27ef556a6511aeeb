#!/usr/bin/env bash
# The model's size on the shipped sample, against the quickstart's 0.93M shape (d_model 128, 4
# layers, d_ff 512), everything else as the quickstart, seeds 42, 1, 2. The smaller one (64, 2
# layers, 256) scored by bench_spread on the validation split (within-bin draws) against the
# default runs' JSONs of ../2026-12-06-within-bin (same origins, same draws' seeds), one thread per
# scoring process; the larger one (192, 6 layers, 6 heads, 768) by its validation loss (the same
# tokens), beside the other two's (val_loss.txt), then in price space as the small one.
set -euo pipefail
cd "$(dirname "$0")/../../.."
out=bench/results/2026-12-06-sample-size
train() {
  ./quickstart.sh --set "training.seed=$1" --set "experiment=\"small_seed$1\"" \
    --set model.d_model=64 --set model.num_layers=2 --set model.d_ff=256 >"$out/train_seed$1.txt"
}
score() {
  local dirs=(case_c_crypto/checkpoints/"small_seed$1"_*)
  OMP_NUM_THREADS=1 python bench/bench_spread.py "${dirs[-1]}" --json "$out/small_seed$1.json" >"$out/small_seed$1.txt"
}
train 42 & train 1; wait
train 2
score 42 & score 1; wait
score 2
base=bench/results/2026-12-06-within-bin
python bench/bench_spread.py --compare "$out/small_seed42.json,$out/small_seed1.json,$out/small_seed2.json" \
  "$base/within_seed42.json,$base/within_seed1.json,$base/within_seed2.json" --json "$out/compare.json" >"$out/compare.txt"
(cd bench/results/2026-12-06-vol-halflife && python coverage.py small "../2026-12-06-sample-size/small_seed{}.json") \
  >"$out/coverage.txt"
train_large() {
  ./quickstart.sh --set "training.seed=$1" --set "experiment=\"large_seed$1\"" \
    --set model.d_model=192 --set model.num_layers=6 --set model.num_heads=6 --set model.d_ff=768 \
    >"$out/train_large_seed$1.txt"
}
train_large 42 & train_large 1; wait
train_large 2
for p in wb small large; do
  for s in 42 1 2; do
    dirs=(case_c_crypto/checkpoints/"${p}_seed$s"_*)
    printf '%s seed %s: best val_loss %s\n' "$p" "$s" "$(jq '[.epochs[].val_loss] | min' "${dirs[-1]}/training_log.json")"
  done
done >"$out/val_loss.txt"
# The larger one in price space, as the small one above.
score_large() {
  local dirs=(case_c_crypto/checkpoints/"large_seed$1"_*)
  OMP_NUM_THREADS=1 python bench/bench_spread.py "${dirs[-1]}" --json "$out/large_seed$1.json" >"$out/large_seed$1.txt"
}
score_large 42 & score_large 1; wait
score_large 2
python bench/bench_spread.py --compare "$out/large_seed42.json,$out/large_seed1.json,$out/large_seed2.json" \
  "$base/within_seed42.json,$base/within_seed1.json,$base/within_seed2.json" --json "$out/compare_large.json" \
  >"$out/compare_large.txt"
(cd bench/results/2026-12-06-vol-halflife && python coverage.py large "../2026-12-06-sample-size/large_seed{}.json") \
  >"$out/coverage_large.txt"
# The scorecard's time, the quickstart's model and the large one (scorecard_time.txt holds the last lines).
for p in wb large; do
  dirs=(case_c_crypto/checkpoints/"${p}_seed42"_*)
  python bench/bench_scorecard.py --run "${dirs[-1]}" --out "/tmp/sc_${p}_seed42"
done
