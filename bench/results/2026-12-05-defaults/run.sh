#!/bin/bash
# The commands behind this folder, from the repository root (2 vCPU, one torch thread per training).
# The 10^6-token market and today's, market-context and rotary runs are bench/results/2026-12-05-rich-1m's (its run.sh).
set -e
export OMP_NUM_THREADS=1
MARKET='data.synthetic={"assets": 8, "candles": 178000, "process": "rich", "categories": ["crypto"], "seed": 1, "daily_vol": 0.04}'
for s in 0 1 2; do  # the cross-section and rotary positions together, at today's rate
  marketgpt sweep --config case_c_crypto/configs/sweep_rich.json --set "$MARKET" \
    --set training.epochs=16 --set training.max_steps_per_epoch=250 --set training.warmup_steps=100 \
    --set training.eval_max_batches=null --set "training.seed=$s" \
    --set model.market_context=true --set 'model.positional="rope"' \
    --sizes 128x4 --fractions 1 --learning-rates 0.001 --name "rich1m_marketrope_s$s" --local
done
for s in 0 1 2; do  # then the volatility level on top of both
  marketgpt sweep --config case_c_crypto/configs/sweep_rich.json --set "$MARKET" \
    --set training.epochs=16 --set training.max_steps_per_epoch=250 --set training.warmup_steps=100 \
    --set training.eval_max_batches=null --set "training.seed=$s" \
    --set model.market_context=true --set 'model.positional="rope"' --set model.vol_level_input=true \
    --sizes 128x4 --fractions 1 --learning-rates 0.001 --name "rich1m_marketropevol_s$s" --local
done
S=case_c_crypto/sweeps
R=bench/results/2026-12-05-defaults
# validation: against today's recipe, and against the cross-section alone, paired by seed
python bench/results/2026-12-05-rich-1m/ablation.py $S 'rich1m_s{seed}' 'market_rope:rich1m_marketrope_s{seed}' > $R/ablation_vs_today.txt
python bench/results/2026-12-05-rich-1m/ablation.py $S 'rich1m_market_s{seed}' 'market_rope:rich1m_marketrope_s{seed}' > $R/ablation_vs_market.txt
python bench/results/2026-12-05-rich-1m/ablation.py $S 'rich1m_marketrope_s{seed}' 'vol_level:rich1m_marketropevol_s{seed}' > $R/ablation_vol_level.txt
# test: the share of the gap to the observable oracle, the oracles' losses from the 10^6-token folder's floor
python bench/sweep_floor.py $S/rich1m_marketrope_s0 $S/rich1m_marketrope_s1 $S/rich1m_marketrope_s2 \
  --oracles-from $S/rich1m_s0/floor.json > $R/floor.txt
# the shipped sample at the quickstart's budget: both on together, against both off
python bench/bench_generalization.py --ablate model.market_context=true --ablate 'model.positional="rope"' \
  --seeds 0,1,2 --json $R/sample_market_rope.json > $R/sample_market_rope.txt
# price space, the observable oracle as the ceiling: seed 0 of both on, calibrated on validation first
RUN=$(jq -r .run $S/rich1m_marketrope_s0/points/d128l4_f100_lr0.001.json)
marketgpt calibrate "$RUN" --horizon 5 --origins 500 --samples 200 > $R/calibrate_marketrope_s0.txt
marketgpt scorecard "$RUN" --origins 1000 --samples 200 --horizons 1,5 > $R/scorecard_marketrope_s0.txt
