#!/usr/bin/env bash
# Every GPU figure of issue 28 in one call on one GPU node (about 9 minutes on an H200):
#   tools/gpu_measure.sh OUT_DIR
# Each step has its own time limit and the folder is packed into OUT_DIR/results.tgz after each
# one, so a step that fails or overruns costs only itself. Steps, most needed first:
#  1. bench_gpu_trainer: cases C, B, A with training.compile_mode=auto (CUDA graphs on one GPU):
#     the bare step and the real Trainer (reading a step late and at once), GPU busy share
#  2. bench_gpu: the same cases with plain torch.compile (mode default), the baseline
#  3. bench_gpu: case A at batch 64, default and reduce-overhead (the 40% MFU target)
#  4. gpu_check: case C stopped, resumed and compared with an uninterrupted run; CPU load;
#     first losses against the CPU
#  5. bench_corpus: a 1M-candle shard prepared on the CPU, batch assembly timed on the GPU
#     against the fastest case's Trainer rate from step 1
#  6. bench_gpu: cases C and B at batch 64 with CUDA graphs (one GPU doing a 2-GPU job's batch)
#  7. bench_gpu_trainer: the same two in the Trainer
set -uo pipefail
out=${1:?usage: tools/gpu_measure.sh OUT_DIR}
cd "$(dirname "$0")/.." || exit 2
res=/tmp/gpu_measure
mkdir -p "$res" "$out"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TORCHINDUCTOR_CACHE_DIR=/tmp/inductor_cache

pack() { tar -czf "$out/results.tgz" -C "$res" . ; }
step() {  # step NAME SECONDS COMMAND...: run it under a limit, log it, pack the results
    local name=$1 limit=$2 t0=$SECONDS rc
    shift 2
    echo "== $name: $*"
    timeout "$limit" "$@" >"$res/$name.txt" 2>&1
    rc=$?
    tail -n 25 "$res/$name.txt"
    echo "== $name: exit $rc in $((SECONDS - t0)) s"
    pack
}

{ nvidia-smi; python3 -c 'import torch, sys; print("torch", torch.__version__, "cuda", torch.version.cuda,
"cudnn", torch.backends.cudnn.version(), "python", sys.version.split()[0], torch.cuda.get_device_name(0))'
  nproc; git log -1 --format='commit %H'; } >"$res/env.txt" 2>&1
cat "$res/env.txt"

step trainer 240 python3 bench/bench_gpu_trainer.py --cases C,B,A --steps 60 --json "$res/bench_gpu_trainer.json"
step baseline 120 python3 bench/bench_gpu.py --cases C,B,A --compile on --no-max-batch --compile-mode default \
    --json "$res/bench_gpu_default.json"
step case_a_b64 100 python3 bench/bench_gpu.py --cases A --compile on --no-max-batch --batch 64 \
    --compile-mode default --json "$res/bench_gpu_a64_default.json"
step case_a_b64_graphs 80 python3 bench/bench_gpu.py --cases A --compile on --no-max-batch --batch 64 \
    --compile-mode reduce-overhead --json "$res/bench_gpu_a64_graphs.json"

fastest=$(python3 -c "import json; d = json.load(open('$res/bench_gpu_trainer.json'))
print(max(c.get('trainer', {}).get('tokens_per_sec', 0) for c in d['figures']['cases'].values()))" 2>/dev/null || echo 1e6)
step gpu_check 150 python3 tools/gpu_check.py --out "$res/gpu_check" --skip-bench --skip-scorecard
step loader 60 python3 bench/bench_corpus.py --candles 1e6 --assets 100 --device cuda \
    --consumption "$fastest" --json "$res/bench_corpus_gpu.json"
step cases_cb_b64_graphs 70 python3 bench/bench_gpu.py --cases C,B --compile on --no-max-batch --batch 64 \
    --compile-mode reduce-overhead --json "$res/bench_gpu_cb64_graphs.json"
step trainer_b64 110 python3 bench/bench_gpu_trainer.py --cases C,B --steps 60 --set training.batch_size=64 \
    --json "$res/bench_gpu_trainer_b64.json"
echo "== done in $SECONDS s"
