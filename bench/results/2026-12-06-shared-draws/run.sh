#!/bin/bash
# The commands behind this folder, from the repository root (2 vCPU, one torch thread each, two at a time).
# The runs are bench/results/2026-12-05-defaults' (rope + market context, 3 seeds, the 10^6-token rich market).
set -e
export OMP_NUM_THREADS=1
R=bench/results/2026-12-06-shared-draws
for s in 0 1 2; do
  RUN=$(jq -r .run "case_c_crypto/sweeps/rich1m_marketrope_s$s/points/d128l4_f100_lr0.001.json")
  echo "python $R/val_scorecard.py $RUN --origins 500 --samples 200 --horizons 1,5 --json $R/val_s$s.json > $R/val_s$s.txt 2>&1"
done | xargs -P 2 -I{} bash -c {}
