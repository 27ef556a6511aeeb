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
