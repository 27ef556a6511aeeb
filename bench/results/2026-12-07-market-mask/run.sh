#!/bin/bash
# The commands behind this folder, from the repository root (2 vCPU, one torch thread per process,
# two side by side). bench/results/2026-12-07-rich-ctx256's runs (the case configs' recipe at
# context 256 on the 10^6-token rich market, 16 epochs of 250 steps) with one change:
# model.market_mask=0.5, forecast with market_future = "unknown"; chosen on validation against
# those runs (same seeds, data and budget) forecasting with today's analog market futures.
set -euo pipefail
export OMP_NUM_THREADS=1
MARKET='data.synthetic={"assets": 8, "candles": 178000, "process": "rich", "categories": ["crypto"], "seed": 1, "daily_vol": 0.04}'
R=bench/results/2026-12-07-market-mask
S=case_c_crypto/sweeps
step=${1:-}  # bash run.sh train SEED | val SEED | val_analogs SEED | loss (after the 3 trainings)
seed=${2:-}
if [ "$step" = train ]; then
  marketgpt sweep --config case_c_crypto/configs/sweep_rich.json --set "$MARKET" \
    --set training.epochs=16 --set training.max_steps_per_epoch=250 --set training.warmup_steps=100 \
    --set training.eval_max_batches=null --set "training.seed=$seed" \
    --set model.market_context=true --set 'model.positional="rope"' --set model.market_peer=true \
    --set model.context_length=256 --set training.batch_size=4 --set model.market_mask=0.5 \
    --sizes 128x4 --fractions 1 --learning-rates 0.001 --name "rich1m_mask_s$seed" --local \
    > "$R/train_s$seed.txt" 2>&1
  mkdir -p "$R/points"
  cp "$S/rich1m_mask_s$seed/points/d128l4_f100_lr0.001.json" "$R/points/rich1m_mask_s$seed.json"
elif [ "$step" = val ]; then
  mask=$(jq -r .run "$S/rich1m_mask_s$seed/points/d128l4_f100_lr0.001.json")
  base=$(jq -r .run "$S/rich1m_ctx256_s$seed/points/d128l4_f100_lr0.001.json")
  python "$R/val_scorecard.py" "$mask" "$base" --origins 300 --samples 200 --horizons 1,5 \
    --json "$R/val_s$seed.json" > "$R/val_s$seed.txt" 2>&1
elif [ "$step" = val_analogs ]; then
  # the masked run forecasting with the analog futures too: what the masked training alone does
  mask=$(jq -r .run "$S/rich1m_mask_s$seed/points/d128l4_f100_lr0.001.json")
  base=$(jq -r .run "$S/rich1m_ctx256_s$seed/points/d128l4_f100_lr0.001.json")
  python "$R/val_scorecard.py" "$mask" "$base" --origins 300 --samples 200 --horizons 1,5 --mask-future analogs \
    --json "$R/val_analogs_s$seed.json" > "$R/val_analogs_s$seed.txt" 2>&1
elif [ "$step" = loss ]; then
  python bench/results/2026-12-05-rich-1m/ablation.py $S 'rich1m_ctx256_s{seed}' 'market_mask 0.5:rich1m_mask_s{seed}' \
    > $R/ablation.txt
else
  echo "usage: bash $R/run.sh train SEED | val SEED | val_analogs SEED | loss" >&2
  exit 2
fi
