#!/bin/bash
# Before (20826f2, the run log's pass) and after (AFTER, as README.md says) on the same runs, from
# the repository root: the tiny one- and two-interval runs and the quickstart's run.
set -e
R=$PWD/bench/results/2026-12-06-house-close
OLD=$PWD/bench/results/2026-11-29-run-info
LOG=$PWD/bench/results/2026-12-05-run-log/compare_log.py
AFTER=${AFTER:-HEAD}
git worktree add --detach /tmp/hc_before 20826f2 && git worktree add --detach /tmp/hc_after "$AFTER"
# the quickstart's train command, as quickstart.sh gives it
quick=(-m common.cli train --config case_c_crypto/configs/crypto_prototype.json
  --set 'experiment="quickstart"'
  --set 'data.source="sample"' --set 'data.interval="1d"' --set 'data.universe_counts={}'
  --set model.d_model=128 --set model.num_layers=4 --set model.num_heads=4 --set model.d_ff=512
  --set model.context_length=64 --set 'model.head="flat"' --set data.epoch_stride=16 --set tokenizer.ret_bins=32
  --set model.dropout=0.2 --set model.market_context=false --set 'model.positional="learned"'
  --set training.weight_decay=0.1 --set training.learning_rate=1e-3
  --set training.warmup_steps=50 --set training.batch_size=32 --set training.epochs=12
  --set training.max_steps_per_epoch=40 --set training.early_stopping_patience=4
  --set training.log_every_steps=10)
for w in before after; do
  (cd "/tmp/hc_$w" && PYTHONPATH="/tmp/hc_$w" python "$OLD/train_both.py" "/tmp/hcr_$w" "/tmp/hc_$w/tests")
  (cd "/tmp/hc_$w" && PYTHONPATH="/tmp/hc_$w" python ${quick[@]+"${quick[@]}"})
done
python "$OLD/compare.py" /tmp/hcr_before /tmp/hcr_after > "$R/tiny.txt" || true
for n in one multi; do
  echo "$n   $(python "$LOG" /tmp/hcr_before/$n/checkpoints/* /tmp/hcr_after/$n/checkpoints/*)" >> "$R/tiny.txt"
done
A=$(ls -d /tmp/hc_before/case_c_crypto/checkpoints/quickstart_*)
B=$(ls -d /tmp/hc_after/case_c_crypto/checkpoints/quickstart_*)
{
  python "$OLD/compare.py" "$A" "$B" || true
  echo "run   $(python "$LOG" "$A" "$B")"
} > "$R/quickstart.txt"
