#!/usr/bin/env bash
# quickstart.sh: the one command that sets everything up and trains a first model.
#
# On a fresh machine with no network beyond the local package index: creates .venv (unless a
# virtual environment is active), installs torch==2.13.0 (the CPU wheel on local disk; an
# unpinned torch would download a multi-GB CUDA build) and this package, then trains case C's
# model shape (d_model 256, 6 layers, 8 heads, context 128, vocab 1024) on the real OHLCV
# sample shipped in the package, with fewer epochs and capped steps so it takes about
# 5 minutes on 2 CPU cores. At the end it prints the run folder and the test results next to
# the naive baselines.
#
#   ./quickstart.sh                       # the defaults below
#   ./quickstart.sh --set training.epochs=2   # extra --set overrides are passed through
#
# Environment: MARKETGPT_VENV (default .venv), PYTHON (default python3).
set -euo pipefail
cd "$(dirname "$0")"

if [[ -n "${VIRTUAL_ENV:-}" ]]; then
    echo "==> Using the active virtual environment $VIRTUAL_ENV"
    py=python
else
    venv="${MARKETGPT_VENV:-.venv}"
    if [[ ! -x "$venv/bin/python" ]]; then
        echo "==> Creating the virtual environment $venv"
        "${PYTHON:-python3}" -m venv "$venv"
    fi
    py="$venv/bin/python"
fi

if ! "$py" -c 'import sys, torch; sys.exit(torch.__version__.split("+")[0] != "2.13.0")' 2>/dev/null; then
    echo "==> Installing torch==2.13.0 (CPU build)"
    "$py" -m pip install --quiet --disable-pip-version-check torch==2.13.0
fi
if ! "$py" -m pip show --quiet marketgpt >/dev/null 2>&1; then
    echo "==> Installing marketgpt and its dependencies"
    "$py" -m pip install --quiet --disable-pip-version-check -e .
fi

echo "==> Training case C's model shape on the shipped sample (about 5 minutes on 2 CPU cores, then a small scorecard)"
start=$(date +%s)
"$py" -m common.cli train --config case_c_crypto/configs/crypto_prototype.json \
    --set 'experiment="quickstart"' \
    --set 'data.source="sample"' --set 'data.interval="1d"' \
    --set training.epochs=4 --set training.max_steps_per_epoch=40 --set training.batch_size=32 \
    --set training.learning_rate=3e-3 --set training.warmup_steps=20 \
    --set training.eval_max_batches=20 --set training.log_every_steps=10 \
    "$@"
echo "==> Done in $(( $(date +%s) - start )) s. Inspect it with, e.g.:"
echo "    jq '.epochs[] | {epoch, train_loss, val_loss}' case_c_crypto/checkpoints/quickstart_*/training_log.json"
echo "    jq '.test_accuracy, .baselines' case_c_crypto/checkpoints/quickstart_*/test_results.json"
