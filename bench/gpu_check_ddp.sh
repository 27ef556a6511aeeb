#!/usr/bin/env bash
# The DDP / CUDA-graph check for a lent GPU, in one command (about 8 minutes at most):
# bench/bench_gpu_ddp.py for case C, then case B, each in its own process under `timeout`, so a
# hang in one variant costs that case's remaining variants only (its JSON is rewritten after
# every variant). Writes $OUT/ddp_<case>.json and .log (OUT defaults to ./gpu_out).
#     OUT=/some/folder bench/gpu_check_ddp.sh [extra bench_gpu_ddp.py options]
set -uo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
out="${OUT:-./gpu_out}"
python="${MARKETGPT_PYTHON:-python3}"
mkdir -p "$out"
export PYTHONPATH="$repo${PYTHONPATH:+:$PYTHONPATH}"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv >"$out/nvidia_smi.csv" 2>&1 || true
status=0
# case C is launch-bound and compiles fast; B's larger graphs take longer to compile
for spec in C:210 B:240; do
    case_name="${spec%%:*}"
    limit="${spec##*:}"
    echo "case $case_name (at most ${limit} s)"
    timeout --kill-after=15 "$limit" "$python" "$repo/bench/bench_gpu_ddp.py" --device cuda --cases "$case_name" \
        --json "$out/ddp_${case_name}.json" "$@" >"$out/ddp_${case_name}.log" 2>&1
    rc=$?
    if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
        echo "case $case_name: timed out; $out/ddp_${case_name}.json keeps the variants it finished"
    else
        echo "case $case_name: exit $rc"
    fi
    tail -n 12 "$out/ddp_${case_name}.log"
    [ "$rc" -eq 0 ] || status=$rc
done
exit "$status"
