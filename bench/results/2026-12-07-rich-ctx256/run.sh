#!/bin/bash
# The commands behind this folder, from the repository root (2 vCPU, one torch thread per process,
# two side by side). bench/results/2026-12-06-rich-within-bin's recipe (the case configs' recipe on
# the 10^6-token rich market, 16 epochs of 250 steps) at context 256 with batch 4, so a step reads
# the same 1,024 tokens and the budget is the same; chosen on validation loss against that folder's
# context-128 runs, then scored on 500 dates of each run's own test split (it starts 128 candles
# later than at context 128, so the dates are not quite that folder's).
set -euo pipefail
export OMP_NUM_THREADS=1
MARKET='data.synthetic={"assets": 8, "candles": 178000, "process": "rich", "categories": ["crypto"], "seed": 1, "daily_vol": 0.04}'
R=bench/results/2026-12-07-rich-ctx256
S=case_c_crypto/sweeps
step=$1  # bash run.sh train SEED | bash run.sh card SEED | bash run.sh test (after the 3 trainings)
seed=${2:-}
if [ "$step" = test ]; then
  # validation, paired by seed with the context-128 runs (bench/results/2026-12-06-rich-within-bin)
  python bench/results/2026-12-05-rich-1m/ablation.py $S 'rich1m_wb_ctx128_s{seed}' 'context 256:rich1m_ctx256_s{seed}' \
    > $R/ablation.txt
  # the test split, read once after the choice: the share of the gap to the observable oracle
  python bench/sweep_floor.py $S/rich1m_ctx256_s0 $S/rich1m_ctx256_s1 $S/rich1m_ctx256_s2 > $R/floor_ctx256.txt
  cp $S/rich1m_ctx256_s0/floor.json $R/floor_ctx256.json
elif [ "$step" = train ]; then
  marketgpt sweep --config case_c_crypto/configs/sweep_rich.json --set "$MARKET" \
    --set training.epochs=16 --set training.max_steps_per_epoch=250 --set training.warmup_steps=100 \
    --set training.eval_max_batches=null --set "training.seed=$seed" \
    --set model.market_context=true --set 'model.positional="rope"' --set model.market_peer=true \
    --set model.context_length=256 --set training.batch_size=4 \
    --sizes 128x4 --fractions 1 --learning-rates 0.001 --name "rich1m_ctx256_s$seed" --local \
    > "$R/train_s$seed.txt" 2>&1
  mkdir -p "$R/points"
  cp "$S/rich1m_ctx256_s$seed/points/d128l4_f100_lr0.001.json" "$R/points/rich1m_ctx256_s$seed.json"
elif [ "$step" = card ]; then
  run=$(jq -r .run "$S/rich1m_ctx256_s$seed/points/d128l4_f100_lr0.001.json")
  marketgpt scorecard "$run" --origins 500 --samples 200 --horizons 1,5 > "$R/scorecard_s$seed.txt"
  jq '{run, interval, origins, samples, seed, baselines, headlines, ceiling_lines, horizons}' "$run/scorecard.json" \
    > "$R/scorecard_s$seed.json"
else
  echo "usage: bash $R/run.sh train SEED | card SEED | test" >&2
  exit 2
fi
