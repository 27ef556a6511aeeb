#!/usr/bin/env bash
# The sweep's GPU grid on the rich synthetic market (docs/scaling.md): shapes from 0.2M to 26.4M
# parameters (64x2 ... 512x8) x 1%, 10% and all of 1e8 training tokens (400 assets x 360,000
# hourly candles, 70% of them the training split), the points one after another on this node's
# GPU. On a machine where torch sees no CUDA GPU it says so and exits 0.
set -euo pipefail
cd "$(dirname "$0")/.."
python="${MARKETGPT_PYTHON:-python3}"
if ! "$python" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
    echo "bench/sweep_gpu.sh: torch sees no CUDA GPU on $(hostname); this grid needs one (nothing was run)"
    exit 0
fi
market='{"assets": 400, "candles": 360000, "process": "rich", "categories": ["crypto"], "seed": 1, "daily_vol": 0.04}'
exec "$python" -m common.cli sweep --config case_c_crypto/configs/sweep_rich.json --local --name rich_gpu \
    --sizes 64x2,128x4,256x6,512x8 --fractions 0.01,0.1,1 \
    --set "data.synthetic=$market" \
    --set training.device=cuda --set training.compile=true --set training.batch_size=64 \
    --set training.epochs=20 --set training.max_steps_per_epoch=2000 --set training.eval_max_batches=200 \
    "$@"
