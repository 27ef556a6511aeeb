#!/bin/bash
# The commands behind this folder, from the repository root (2 vCPU, one torch thread per process,
# two side by side). The case configs' recipe at case C's context (128 candles) on the 10^6-token
# rich market, trained exactly as bench/results/2026-12-06-peer-recipe's context-128 runs (its
# run.sh, `train ctx128`), then scored in price space with today's decoding (each sampled token
# drawn within its bins, the default since those runs were scored by their bins' medians) on the
# same 500 test dates as that folder's seed-0 card.
set -euo pipefail
export OMP_NUM_THREADS=1
MARKET='data.synthetic={"assets": 8, "candles": 178000, "process": "rich", "categories": ["crypto"], "seed": 1, "daily_vol": 0.04}'
R=bench/results/2026-12-06-rich-within-bin
S=case_c_crypto/sweeps
seed=$1  # bash run.sh SEED: one seed's training and card (two seeds side by side)
marketgpt sweep --config case_c_crypto/configs/sweep_rich.json --set "$MARKET" \
  --set training.epochs=16 --set training.max_steps_per_epoch=250 --set training.warmup_steps=100 \
  --set training.eval_max_batches=null --set "training.seed=$seed" \
  --set model.market_context=true --set 'model.positional="rope"' --set model.market_peer=true \
  --set model.context_length=128 --set training.batch_size=8 \
  --sizes 128x4 --fractions 1 --learning-rates 0.001 --name "rich1m_wb_ctx128_s$seed" --local \
  > "$R/train_s$seed.txt" 2>&1
mkdir -p "$R/points"
cp "$S/rich1m_wb_ctx128_s$seed/points/d128l4_f100_lr0.001.json" "$R/points/rich1m_wb_ctx128_s$seed.json"
run=$(jq -r .run "$S/rich1m_wb_ctx128_s$seed/points/d128l4_f100_lr0.001.json")
marketgpt scorecard "$run" --origins 500 --samples 200 --horizons 1,5 > "$R/scorecard_s$seed.txt"
jq '{run, interval, origins, samples, seed, baselines, headlines, ceiling_lines, horizons}' "$run/scorecard.json" \
  > "$R/scorecard_s$seed.json"
