#!/bin/bash
# The commands behind this folder, from the repository root (2 vCPU, one torch thread per training).
set -e
export OMP_NUM_THREADS=1
MARKET='data.synthetic={"assets": 8, "candles": 178000, "process": "rich", "categories": ["crypto"], "seed": 1, "daily_vol": 0.04}'
sweep() {  # NAME SEED LEARNING_RATES [--set KEY=VALUE ...]
  local name=$1 seed=$2 lrs=$3; shift 3
  marketgpt sweep --config case_c_crypto/configs/sweep_rich.json --set "$MARKET" \
    --set training.epochs=16 --set training.max_steps_per_epoch=250 --set training.warmup_steps=100 \
    --set training.eval_max_batches=null \
    --set "training.seed=$seed" "$@" --sizes 128x4 --fractions 1 --learning-rates "$lrs" --name "${name}_s$seed" --local
}
for s in 0 1 2; do sweep rich1m $s 0.001,0.0003; done                                   # today's recipe, two rates
for s in 0 1 2; do sweep rich1m_market $s 0.001 --set model.market_context=true; done    # the cross-section
for s in 0 1 2; do sweep rich1m_rope $s 0.001 --set 'model.positional="rope"'; done       # rotary positions
# three times the steps, one seed
marketgpt sweep --config case_c_crypto/configs/sweep_rich.json --set "$MARKET" --set training.epochs=48 \
  --set training.max_steps_per_epoch=250 --set training.warmup_steps=100 --set training.eval_max_batches=null \
  --set training.seed=0 --sizes 128x4 --fractions 1 --learning-rates 0.001 --name rich1m_long_s0 --local

S=case_c_crypto/sweeps
# validation: each variant against today's recipe at the same rate and seed
python bench/results/2026-12-05-rich-1m/ablation.py $S 'rich1m_s{seed}' 'market:rich1m_market_s{seed}' \
  'rope:rich1m_rope_s{seed}' > ablation.txt
# test: the share of the gap to each oracle (one oracle computation for every point of the market)
python bench/sweep_floor.py $S/rich1m_s0 $S/rich1m_s1 $S/rich1m_s2 $S/rich1m_market_s0 $S/rich1m_market_s1 \
  $S/rich1m_market_s2 $S/rich1m_rope_s0 $S/rich1m_rope_s1 $S/rich1m_rope_s2 > floor.txt
python bench/sweep_floor.py $S/rich1m_long_s0 --oracles-from $S/rich1m_s0/floor.json > floor_long.txt
# price space, with the observable oracle as the ceiling: seed 0 of today's recipe (its rate by validation) and of market context
marketgpt scorecard "$(jq -r .run $S/rich1m_s0/points/d128l4_f100_lr0.0003.json)" --origins 1000 --samples 200 --horizons 1,5
marketgpt scorecard "$(jq -r .run $S/rich1m_market_s0/points/d128l4_f100_lr0.001.json)" --origins 1000 --samples 200 --horizons 1,5
