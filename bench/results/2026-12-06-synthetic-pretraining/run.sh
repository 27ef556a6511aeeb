#!/bin/bash
# The commands behind this folder, from the repository root (2 vCPU, one torch thread per process).
# 1. The parent: the quickstart's shape and settings on the rich synthetic market at a daily
#    interval (48 assets of the sample's three categories, 8,000 days each), 16 epochs of 200
#    steps. The run here was stopped by hand during epoch 8; its best_model.pt is epoch 7's
#    (validation loss 4.900, 1,400 steps, 2.87M tokens seen, 594 s beside other work).
# 2. The quickstart fine-tuned from it at seeds 42, 1, 2 (its own budget, settings and learning
#    rate; the parent's tokenizer, as every fine-tuning run), then each scored in price space on
#    validation and test with bench/bench_spread.py, beside the same seeds trained from scratch
#    (bench/results/2026-12-06-spread-scale), and compared seed by seed.
set -e
export OMP_NUM_THREADS=1
R=bench/results/2026-12-06-synthetic-pretraining
if [ "${1:-}" = "parent" ]; then
  ./quickstart.sh --set 'experiment="pretrain_rich"' --set 'data.source="synthetic"' \
    --set 'data.start_date="1990-01-01"' \
    --set 'data.synthetic={"process":"rich","assets":48,"candles":8000,"categories":["us_stock","index","emerging"],"seed":7}' \
    --set training.epochs=16 --set training.max_steps_per_epoch=200 --set training.scorecard_origins=0 \
    --set training.early_stopping_patience=4 > "$R/parent.txt"
  exit
fi
parents=(case_c_crypto/checkpoints/pretrain_rich_*)
for seed in 42 1 2; do
  ./quickstart.sh --set "training.seed=$seed" --set "experiment=\"ft_seed$seed\"" \
    --set "training.init_from=\"${parents[-1]}\"" > "$R/train_ft_seed$seed.txt"
  dirs=(case_c_crypto/checkpoints/"ft_seed${seed}"_*)
  python bench/bench_spread.py "${dirs[-1]}" --json "$R/ft_seed$seed.json" > "$R/ft_seed$seed.txt"
done
S=bench/results/2026-12-06-spread-scale
python bench/bench_spread.py --compare "$R/ft_seed42.json,$R/ft_seed1.json,$R/ft_seed2.json" \
  "$S/sample_seed42.json,$S/sample_seed1.json,$S/sample_seed2.json" --json "$R/compare.json" > "$R/compare.txt"
