#!/bin/bash
# The commands behind this folder, from the repository root (2 vCPU, one torch thread per process,
# two side by side). bench/results/2026-12-07-rich-ctx256's runs trained again (training is
# deterministic: the same weights), which now end by fitting the volatility reversion on validation
# (reversion.json, copied here as reversion_s*.json by `card`). `card` would score them on that
# folder's 500 test dates; it was not run: the fits chose no pull worth scoring (README.md).
set -euo pipefail
export OMP_NUM_THREADS=1
MARKET='data.synthetic={"assets": 8, "candles": 178000, "process": "rich", "categories": ["crypto"], "seed": 1, "daily_vol": 0.04}'
R=bench/results/2026-12-07-rich-reversion
S=case_c_crypto/sweeps
step=$1  # bash run.sh train SEED | bash run.sh card SEED [fit-only]
seed=$2
if [ "$step" = train ]; then
  marketgpt sweep --config case_c_crypto/configs/sweep_rich.json --set "$MARKET" \
    --set training.epochs=16 --set training.max_steps_per_epoch=250 --set training.warmup_steps=100 \
    --set training.eval_max_batches=null --set "training.seed=$seed" \
    --set model.market_context=true --set 'model.positional="rope"' --set model.market_peer=true \
    --set model.context_length=256 --set training.batch_size=4 \
    --sizes 128x4 --fractions 1 --learning-rates 0.001 --name "rich1m_ctx256_s$seed" --local \
    > "$R/train_s$seed.txt" 2>&1
elif [ "$step" = card ]; then
  run=$(jq -r .run "$S/rich1m_ctx256_s$seed/points/d128l4_f100_lr0.001.json")
  cp "$run/reversion.json" "$R/reversion_s$seed.json"
  [ "${3:-}" = fit-only ] && exit 0
  marketgpt scorecard "$run" --origins 500 --samples 200 --horizons 1,5 > "$R/scorecard_s$seed.txt"
  jq '{run, interval, origins, samples, seed, baselines, headlines, ceiling_lines, horizons, reversion_tau}' \
    "$run/scorecard.json" > "$R/scorecard_s$seed.json"
else
  echo "usage: bash $R/run.sh train SEED | card SEED" >&2
  exit 2
fi
