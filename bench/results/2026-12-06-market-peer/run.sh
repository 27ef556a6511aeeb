#!/bin/bash
# The commands behind this folder, from the repository root (2 vCPU, one torch thread per training).
# The market, budget and the runs it is compared with (rich1m_marketrope_s*, the case configs'
# recipe) are bench/results/2026-12-05-defaults' (its run.sh).
set -e
export OMP_NUM_THREADS=1
MARKET='data.synthetic={"assets": 8, "candles": 178000, "process": "rich", "categories": ["crypto"], "seed": 1, "daily_vol": 0.04}'
R=bench/results/2026-12-06-market-peer
S=case_c_crypto/sweeps
peer() {  # SEED: the cross-section and rotary positions with each asset's peer, at the recipe's rate
  marketgpt sweep --config case_c_crypto/configs/sweep_rich.json --set "$MARKET" \
    --set training.epochs=16 --set training.max_steps_per_epoch=250 --set training.warmup_steps=100 \
    --set training.eval_max_batches=null --set "training.seed=$1" \
    --set model.market_context=true --set 'model.positional="rope"' --set model.market_peer=true \
    --sizes 128x4 --fractions 1 --learning-rates 0.001 --name "rich1m_marketpeer_s$1" --local
}
if [ "${1:-}" = "train" ]; then peer "$2"; exit; fi  # bash run.sh train SEED: one seed (two side by side)
# validation: against the cross-section and rotary positions without the peer, paired by seed
python bench/results/2026-12-05-rich-1m/ablation.py $S 'rich1m_marketrope_s{seed}' 'market_peer:rich1m_marketpeer_s{seed}' > $R/ablation.txt
# test: the share of the gap to the observable oracle, the oracles' losses from the 10^6-token folder's floor
python bench/sweep_floor.py $S/rich1m_marketpeer_s0 $S/rich1m_marketpeer_s1 $S/rich1m_marketpeer_s2 \
  --oracles-from $S/rich1m_s0/floor.json > $R/floor.txt
cp $S/rich1m_marketpeer_s0/floor.json $R/floor.json
for s in 0 1 2; do cp $S/rich1m_marketpeer_s$s/points/d128l4_f100_lr0.001.json $R/points/rich1m_marketpeer_s${s}_d128l4_f100_lr0.001.json; done
# the cost of fitting the peers at case A's size
python bench/bench_market_context.py --series 600 --candles 184080 --peers --json $R/bench_market_context_peers.json \
  > $R/bench_market_context_peers.txt
# case A's job at full data size with the peer on (its config as it is), on the local 2-node cluster
tools/local_slurm/local_slurm.sh start --nodes 2
python bench/rehearsal --size full --json $R/rehearsal_full.json > $R/rehearsal_full.txt
# price space, the observable oracle as the ceiling: seed 0 (raw intervals, not calibrated), scored date by date
RUN=$(jq -r .run $S/rich1m_marketpeer_s0/points/d128l4_f100_lr0.001.json)
marketgpt scorecard "$RUN" --origins 1000 --samples 200 --horizons 1,5 > $R/scorecard_peer_s0.txt
jq '{run, interval, origins, samples, seed, baselines, headlines, ceiling_lines, horizons}' "$RUN/scorecard.json" > $R/scorecard_peer_s0.json
# the run without the peer on 500 of those dates, date by date (its calibration.json, from before, only adds coverage)
RUN=$(jq -r .run $S/rich1m_marketrope_s0/points/d128l4_f100_lr0.001.json)
marketgpt scorecard "$RUN" --origins 500 --samples 200 --horizons 1,5 > $R/scorecard_base_s0.txt
jq '{run, interval, origins, samples, seed, baselines, headlines, ceiling_lines, horizons}' "$RUN/scorecard.json" > $R/scorecard_base_s0.json
