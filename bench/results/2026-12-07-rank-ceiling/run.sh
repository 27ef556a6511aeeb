#!/bin/bash
# The context-256 runs of bench/results/2026-12-07-rich-ctx256 (seeds 0 and 1) scored on 2,000 test
# dates, with the observable oracle judged across assets as the model is. From the repository root,
# one torch thread per process, the two seeds side by side:
#   bash run.sh train SEED   (the same command as ../2026-12-07-rich-ctx256/run.sh train SEED; the
#                             run's validation loss is checked against that folder's point)
#   bash run.sh card SEED    (2,000 dates, 200 samples, H = 1 and 5)
set -euo pipefail
export OMP_NUM_THREADS=1
MARKET='data.synthetic={"assets": 8, "candles": 178000, "process": "rich", "categories": ["crypto"], "seed": 1, "daily_vol": 0.04}'
R=bench/results/2026-12-07-rank-ceiling
S=case_c_crypto/sweeps
step=$1
seed=$2
point=$S/rich1m_ctx256_s$seed/points/d128l4_f100_lr0.001.json
if [ "$step" = train ]; then
  marketgpt sweep --config case_c_crypto/configs/sweep_rich.json --set "$MARKET" \
    --set training.epochs=16 --set training.max_steps_per_epoch=250 --set training.warmup_steps=100 \
    --set training.eval_max_batches=null --set "training.seed=$seed" \
    --set model.market_context=true --set 'model.positional="rope"' --set model.market_peer=true \
    --set model.context_length=256 --set training.batch_size=4 \
    --sizes 128x4 --fractions 1 --learning-rates 0.001 --name "rich1m_ctx256_s$seed" --local \
    > "$R/train_s$seed.txt" 2>&1
  jq -r '"best validation loss \(.best_val_loss)"' "$point" bench/results/2026-12-07-rich-ctx256/points/rich1m_ctx256_s"$seed".json \
    >> "$R/train_s$seed.txt"
elif [ "$step" = card ]; then
  run=$(jq -r .run "$point")
  marketgpt scorecard "$run" --origins 2000 --samples 200 --horizons 1,5 > "$R/scorecard_s${seed}_2000.txt"
  jq '{run, interval, origins, samples, seed, baselines, headlines, ceiling_lines, horizons}' "$run/scorecard.json" \
    > "$R/scorecard_s${seed}_2000.json"
else
  echo "usage: bash $R/run.sh train SEED | card SEED" >&2
  exit 2
fi
