#!/usr/bin/env bash
# quickstart.sh: the one command that sets everything up and trains a first model.
#
# On a fresh machine with no network beyond the local package index: creates .venv (unless a
# virtual environment is active), installs torch==2.13.0 (the CPU wheel on local disk; an
# unpinned torch would download a multi-GB CUDA build) and this package, then trains on the
# real OHLCV sample shipped in the package (daily candles, all its assets) with the small-data
# settings of docs/generalization.md: case C's config with a smaller model (d_model 128,
# 4 layers, context 64, 0.93M parameters), strided epochs, 32 move bins, dropout 0.2, weight
# decay 0.1, lr 1e-3, 12 epochs x 40 steps with early stopping. About 2.5 minutes on 2 idle
# CPU cores (longer when they are busy), a small scorecard included. At the end it prints the run
# folder and the test results next to the naive baselines, with the token-level skill against
# the unigram and its interval.
#
#   ./quickstart.sh                       # the defaults below
#   ./quickstart.sh --set training.epochs=2   # extra --set overrides are passed through
#   ./quickstart.sh test                  # the test suite instead, in the same environment
#   ./quickstart.sh test tests/test_model.py -x   # arguments after `test` go to pytest
#
# `test` installs the package with its test extra into the same environment and runs pytest
# there, with that environment first on PATH (the Slurm tests' jobs and every subprocess then
# run its python). Either command may come first on a fresh clone.
#
# Environment: MARKETGPT_VENV (default .venv), PYTHON (default python3).
set -euo pipefail
cd "$(dirname "$0")"
mode="train"
if [[ "${1:-}" == "test" ]]; then
    mode="test"
    shift
fi

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

if [[ "$mode" == "test" ]]; then
    # the test extra (setup.cfg): pytest, pytest-socket (setup.cfg's --disable-socket needs it), ...,
    # and the code checks' ruff and mypy
    if ! "$py" -c 'import pytest, pytest_socket, xdist, hypothesis, responses, onnx, onnxruntime, wandb, mlflow, ruff, mypy' \
        2>/dev/null; then
        echo "==> Installing the test dependencies"
        "$py" -m pip install --quiet --disable-pip-version-check -e '.[test]'
    fi
    # tests/test_laptop_install.py installs the package as docs/remote.md's torch-free lines say, in a
    # fresh venv with pip reading only this folder: the wheels of those lines, downloaded once here
    wheelhouse=.cache/wheelhouse
    wanted="setuptools>=64 wheel numpy pandas pyarrow matplotlib onnxruntime"
    if [[ "$(cat "$wheelhouse/COMPLETE" 2>/dev/null)" != "$wanted" ]]; then
        echo "==> Downloading the torch-free install's wheels into $wheelhouse"
        rm -rf "$wheelhouse"
        # shellcheck disable=SC2086  # one argument per requirement
        "$py" -m pip download --quiet --disable-pip-version-check --only-binary=:all: -d "$wheelhouse" $wanted
        echo "$wanted" >"$wheelhouse/COMPLETE"
    fi
    bin=$("$py" -c 'import os, sys; print(os.path.dirname(sys.executable))')
    export PATH="$bin:$PATH"
    echo "==> Running the tests with $bin/python"
    exec "$bin/python" -m pytest "$@"
fi

echo "==> Training on the shipped sample with the small-data settings (about 2.5 minutes on 2 idle CPU cores, a small scorecard included)"
start=$(date +%s)
# the same settings as SMALL_DATA in bench/bench_generalization.py (a test keeps them equal); case C's
# cross-section and rotary positions stay off here: on the sample at this budget they do not pay
# (bench/results/2026-12-05-defaults)
"$py" -m common.cli train --config case_c_crypto/configs/crypto_prototype.json \
    --set 'experiment="quickstart"' \
    --set 'data.source="sample"' --set 'data.interval="1d"' --set 'data.universe_counts={}' \
    --set model.d_model=128 --set model.num_layers=4 --set model.num_heads=4 --set model.d_ff=512 \
    --set model.context_length=64 --set 'model.head="flat"' --set data.epoch_stride=16 --set tokenizer.ret_bins=32 \
    --set model.dropout=0.2 --set model.market_context=false --set 'model.positional="learned"' \
    --set training.weight_decay=0.1 --set training.learning_rate=1e-3 \
    --set training.warmup_steps=50 --set training.batch_size=32 --set training.epochs=12 \
    --set training.max_steps_per_epoch=40 --set training.early_stopping_patience=4 \
    --set training.log_every_steps=10 \
    "$@"
echo "==> Done in $(( $(date +%s) - start )) s. Inspect it with, e.g.:"
echo "    jq '.epochs[] | {epoch, train_loss, val_loss}' case_c_crypto/checkpoints/quickstart_*/training_log.json"
echo "    jq '.test_loss, .baselines, .token_skill' case_c_crypto/checkpoints/quickstart_*/test_results.json"
