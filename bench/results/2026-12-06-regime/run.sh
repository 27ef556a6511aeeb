#!/usr/bin/env bash
# The quickstart's three seeds (the runs of bench/results/2026-12-06-spread-scale) split by the
# volatility regime at the origin and by year. One thread per run; about 8 min per run on AMD EPYC.
set -euo pipefail
cd "$(dirname "$0")/../../.."
out=bench/results/2026-12-06-regime
for s in 42 1 2; do
  run=$(ls -d case_c_crypto/checkpoints/sample_seed${s}_*)
  OMP_NUM_THREADS=1 python bench/bench_regime.py "$run" --json "$out/sample_seed$s.json" >"$out/sample_seed$s.txt"
done
# after the within-bin draws became the default: seed 42 trained again (bench/results/2026-12-06-within-bin/run.sh)
dirs=(case_c_crypto/checkpoints/wb_seed42_*)
run=${dirs[-1]}
OMP_NUM_THREADS=1 python bench/bench_regime.py "$run" --json "$out/within_seed42.json" >"$out/within_seed42.txt"
