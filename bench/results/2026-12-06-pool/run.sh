#!/usr/bin/env bash
# The quickstart's three runs (seeds 42, 1, 2; ../2026-12-06-within-bin's wb_seed*) pooled with
# each price baseline, the weight chosen on validation, scored on test: bench/bench_pool.py.
# One thread per process, two side by side.
set -euo pipefail
cd "$(dirname "$0")/../../.."
out=bench/results/2026-12-06-pool
pool() {
  local dirs=(case_c_crypto/checkpoints/"wb_seed$1"_*)
  OMP_NUM_THREADS=1 python bench/bench_pool.py "${dirs[-1]}" --json "$out/pool_seed$1.json" >"$out/pool_seed$1.txt"
}
pool 42 & pool 1; wait
pool 2
python bench/bench_pool.py --summary "$out/pool_seed42.json,$out/pool_seed1.json,$out/pool_seed2.json" \
  --json "$out/summary.json" >"$out/summary.txt"
# The same for the 2.87M runs of ../2026-12-06-sample-size (large_seed*).
pool_large() {
  local dirs=(case_c_crypto/checkpoints/"large_seed$1"_*)
  OMP_NUM_THREADS=1 python bench/bench_pool.py "${dirs[-1]}" --json "$out/large_seed$1.json" >"$out/large_seed$1.txt"
}
pool_large 42 & pool_large 1; wait
pool_large 2
python bench/bench_pool.py --summary "$out/large_seed42.json,$out/large_seed1.json,$out/large_seed2.json" \
  --json "$out/summary_large.json" >"$out/summary_large.txt"
