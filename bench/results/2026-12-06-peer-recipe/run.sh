#!/bin/bash
# The commands behind this folder, from the repository root (2 vCPU, one torch thread per training).
# The market, budget and the runs compared with (rich1m_marketpeer_s*, the case configs' recipe:
# cross-section, peer, rotary positions) are bench/results/2026-12-06-market-peer's (its run.sh);
# each variant below changes one thing on top of it.
set -e
export OMP_NUM_THREADS=1
MARKET='data.synthetic={"assets": 8, "candles": 178000, "process": "rich", "categories": ["crypto"], "seed": 1, "daily_vol": 0.04}'
R=bench/results/2026-12-06-peer-recipe
S=case_c_crypto/sweeps
variant() {  # NAME SEED --set ...: the case configs' recipe at 10^6 training tokens and 4,000 steps, plus the sets
  local name=$1 seed=$2
  shift 2
  marketgpt sweep --config case_c_crypto/configs/sweep_rich.json --set "$MARKET" \
    --set training.epochs=16 --set training.max_steps_per_epoch=250 --set training.warmup_steps=100 \
    --set training.eval_max_batches=null --set "training.seed=$seed" \
    --set model.market_context=true --set 'model.positional="rope"' --set model.market_peer=true \
    "$@" --sizes 128x4 --fractions 1 --learning-rates 0.001 --name "rich1m_${name}_s$seed" --local
}
# bash run.sh train VARIANT SEED: one training (two side by side)
if [ "${1:-}" = "train" ]; then
  case $2 in
    # Muon for the blocks' matrices (training.muon_lr 0.02, as bench/results/2026-12-05-muon)
    muon) variant marketpeermuon "$3" --set 'training.optimizer="muon"' ;;
    # the case C configs' context, 128 candles, at the same tokens a step (batch 8)
    ctx128) variant marketpeerctx128 "$3" --set model.context_length=128 --set training.batch_size=8 ;;
  esac
  exit
fi
if [ "${1:-}" = "card" ]; then  # bash run.sh card SEED...: the context-128 runs' card on 500 test dates (one seed, or an ensemble)
  shift
  runs=()
  for s in "$@"; do runs+=("$(jq -r .run "$S/rich1m_marketpeerctx128_s$s/points/d128l4_f100_lr0.001.json")"); done
  name=$(IFS=; echo "ctx128_s$*")
  marketgpt scorecard ${runs[@]+"${runs[@]}"} --origins 500 --samples 200 --horizons 1,5 > "$R/scorecard_$name.txt"
  card=${runs[0]}/scorecard.json
  if [ $# -gt 1 ]; then card=${runs[0]}/ensemble_$#/scorecard.json; fi
  jq '{run, interval, origins, samples, seed, baselines, headlines, ceiling_lines, horizons}' "$card" > "$R/scorecard_$name.json"
  exit
fi
# validation: each variant against the recipe, paired by seed
python bench/results/2026-12-05-rich-1m/ablation.py $S 'rich1m_marketpeer_s{seed}' 'muon:rich1m_marketpeermuon_s{seed}' \
  'context 128:rich1m_marketpeerctx128_s{seed}' > $R/ablation.txt
# the same runs against today's recipe before the market (learned positions, context 64: 2026-12-05-rich-1m's)
python bench/results/2026-12-05-rich-1m/ablation.py $S 'rich1m_s{seed}' \
  'the case configs recipe at context 128:rich1m_marketpeerctx128_s{seed}' > $R/ablation_vs_today.txt
# test, read once after the choice: the share of the gap to the observable oracle at the case C context
python bench/sweep_floor.py $S/rich1m_marketpeerctx128_s0 $S/rich1m_marketpeerctx128_s1 $S/rich1m_marketpeerctx128_s2 \
  > $R/floor_ctx128.txt  # (its oracles scored again: a longer context scores test targets from a later first one)
for s in 0 1 2; do cp $S/rich1m_marketpeerctx128_s$s/points/d128l4_f100_lr0.001.json $R/points/rich1m_marketpeerctx128_s${s}.json; done
cp $S/rich1m_marketpeerctx128_s0/floor.json $R/floor_ctx128.json
# price space (raw intervals, date by date): seed 0 on 500 test dates (`bash run.sh card 0 1 2` scores the
# three seeds as one ensemble on the same dates: not run, about 2.5 hours on one core here)
bash $R/run.sh card 0
