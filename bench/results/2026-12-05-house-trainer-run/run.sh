#!/bin/bash
# Before (09a2bcd) and after (AFTER=e038060, as README.md says) on the same runs, from the repository root.
set -e
R=$PWD/bench/results/2026-12-05-house-trainer-run
OLD=$PWD/bench/results/2026-11-29-run-info
LOG=$PWD/bench/results/2026-12-05-run-log/compare_log.py
AFTER=${AFTER:-HEAD}
git worktree add --detach /tmp/hb_before 09a2bcd && git worktree add --detach /tmp/hb_after "$AFTER"
for w in before after; do
  (cd "/tmp/hb_$w" && PYTHONPATH="/tmp/hb_$w" python "$OLD/train_both.py" "/tmp/hbr_$w" "/tmp/hb_$w/tests")
  (cd "/tmp/hb_$w" && PYTHONPATH="/tmp/hb_$w" python "$R/train_market.py" "/tmp/hbr_$w" "/tmp/hb_$w/tests")
done
python "$OLD/compare.py" /tmp/hbr_before /tmp/hbr_after > "$R/tiny.txt" || true
for n in one multi; do
  echo "$n   $(python "$LOG" /tmp/hbr_before/$n/checkpoints/* /tmp/hbr_after/$n/checkpoints/*)" >> "$R/tiny.txt"
done
A=$(ls -d /tmp/hbr_before/market/checkpoints/*)
B=$(ls -d /tmp/hbr_after/market/checkpoints/*)
{
  python "$OLD/compare.py" "$A" "$B" || true
  if cmp -s "$A/tokens/features.bin" "$B/tokens/features.bin"; then
    echo "run   tokens/features.bin byte-identical: yes"
  else
    echo "run   tokens/features.bin byte-identical: NO"
  fi
  echo "run   $(python "$LOG" "$A" "$B")"
} > "$R/market.txt"
