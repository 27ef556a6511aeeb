# shellcheck shell=bash
# What every case_*/slurm_scripts/train_*_a100.sh does once sbatch has started it. Sourced, not
# run: the case script sets CASE, CONFIG, LOG_PREFIX and REPO, then calls `marketgpt_train "$@"`.
#
#   1. logs:    stdout/stderr go to $REPO/$CASE/logs/<LOG_PREFIX>_<JOBID>.out/.err, appended, so
#               `tail -f` works whichever directory sbatch was called from and across requeues;
#   2. env:     sources common/slurm/cluster_env.sh (module load, conda: the one place to adapt);
#      plan:    the first start prints `marketgpt plan` of the job's config, --set overrides and
#               GPUs at the top of the log (a plan that fails costs a warning line, not the job);
#   3. train:   srun starts one task per GPU: `python -m common.cli train --config ... --num-gpus
#               N --resume auto "$@"` (extra sbatch arguments such as --set k=v pass through);
#   4. requeue: USR2 before the time limit (#SBATCH --signal=B:USR2@...) is forwarded to the
#               tasks; the trainer saves a checkpoint and exits 75, and the job requeues itself
#               (scontrol requeue). The restarted job runs the same command, and --resume auto
#               continues this job's own run folder (its id is in training_log.json).
#               scancel (SIGTERM) also leaves a checkpoint, but never requeues.

# The cluster environment (module load, conda activate, the python to run) is set up in
# common/slurm/cluster_env.sh, the one file to adapt; every way a job starts sources it.
marketgpt_activate_env() {
    # shellcheck source=common/slurm/cluster_env.sh
    source "$REPO/common/slurm/cluster_env.sh"
}

# common/distributed/requeue.py's EXIT_REQUEUE and DEFAULT_MAX_REQUEUES (tests/test_slurm_scripts.py checks
# that they agree): exit 75 = saved a checkpoint, run me again; requeue at most 20 times.
MARKETGPT_EXIT_REQUEUE=75
MARKETGPT_REQUEUE_CAP=${MARKETGPT_MAX_REQUEUES:-20}

# Send everything this job prints to the case's logs/ folder, appended (a requeued job adds
# to the same files). sbatch's own #SBATCH --output file (in the directory sbatch was called
# from) then only catches what Slurm itself prints, such as "JOB 123 CANCELLED AT ...";
# whatever it holds is moved into the .err file when the job ends.
_marketgpt_redirect_logs() {
    local logs="$REPO/$CASE/logs"
    mkdir -p "$logs" || return 1
    MARKETGPT_LOG_FILE="$logs/${LOG_PREFIX}_${SLURM_JOB_ID}.out"
    export MARKETGPT_LOG_FILE  # recorded in training_log.json: `marketgpt status` shows its last line
    _marketgpt_sbatch_out=$(scontrol show job "$SLURM_JOB_ID" 2>/dev/null | sed -n 's/^ *StdOut=//p')
    exec >>"$MARKETGPT_LOG_FILE" 2>>"${MARKETGPT_LOG_FILE%.out}.err"
}

_marketgpt_collect_sbatch_out() {
    local f=${_marketgpt_sbatch_out:-}
    [ -n "$f" ] && [ -f "$f" ] && [ "$f" != "$MARKETGPT_LOG_FILE" ] || return 0
    if [ -s "$f" ]; then
        { echo "--- from $f (Slurm's own messages):"; cat "$f"; } >&2
    fi
    rm -f "$f"
}

# Signals reach this shell while it waits for srun (which runs in the background, so the trap
# runs at once). USR2 = "the time limit is near": forward it to the tasks. TERM = scancel, or
# the time limit itself: the tasks got it too; remember not to requeue.
_marketgpt_on_usr2() {
    _marketgpt_warned=1
    _marketgpt_interrupted=1
    echo "marketgpt: $(date '+%F %T') USR2 (time limit near or preemption): asking the tasks to checkpoint"
    [ -n "${_marketgpt_srun_pid:-}" ] && kill -USR2 "$_marketgpt_srun_pid" 2>/dev/null
}

_marketgpt_on_term() {
    _marketgpt_cancelled=1
    _marketgpt_interrupted=1
    echo "marketgpt: $(date '+%F %T') SIGTERM (scancel or time limit): the tasks save a checkpoint; this script does not requeue (after scontrol requeue, Slurm does)"
}

# `marketgpt plan` of the job's config with the --set overrides among the job's arguments (train's
# other options mean nothing to plan) and the job's nodes x GPUs, so its time estimate is this
# job's. It runs on the batch host before srun; a plan that fails or takes over 5 minutes (the
# exact count of a big cache) prints one warning line and the job trains all the same.
_marketgpt_print_plan() {
    local gpus=$1 nodes=${SLURM_JOB_NUM_NODES:-${SLURM_NNODES:-1}} prev="" arg
    shift
    local sets=()
    for arg in "$@"; do
        if [ "$prev" = --set ]; then sets+=(--set "$arg"); fi
        case $arg in --set=*) sets+=("$arg") ;; esac
        prev=$arg
    done
    timeout 300 "$PYTHON" -m common.cli plan --config "$CASE/$CONFIG" ${sets[@]+"${sets[@]}"} \
        --set "slurm.nodes=$nodes" --set "slurm.gpus_per_node=$gpus" ||
        echo "marketgpt: warning: \`marketgpt plan\` failed (exit $?; 124: over 5 minutes;" \
            "its message is in the .err log); training goes on"
}

marketgpt_train() {
    if [ -z "${SLURM_JOB_ID:-}" ]; then
        echo "marketgpt: submit this script with sbatch (e.g. sbatch $CASE/slurm_scripts/$(basename "$0"))" >&2
        return 2
    fi
    _marketgpt_redirect_logs || { echo "marketgpt: cannot write $REPO/$CASE/logs" >&2; return 1; }
    local restarts=${SLURM_RESTART_COUNT:-0}
    echo "===== $(date '+%F %T') job $SLURM_JOB_ID ($SLURM_JOB_NAME) on $(hostname -s), restart $restarts ====="
    cd "$REPO" || return 1
    marketgpt_activate_env || return 1

    # Slurm sets CUDA_VISIBLE_DEVICES per job from the GRES; never overwrite it, never count
    # GPUs from it (it can be empty). SLURM_GPUS_ON_NODE is the job's GPU count per node.
    local gpus=${SLURM_GPUS_ON_NODE:-${SLURM_NTASKS_PER_NODE:-1}}
    export PYTORCH_CUDA_ALLOC_CONF=${PYTORCH_CUDA_ALLOC_CONF:-max_split_size_mb:512}
    export OMP_NUM_THREADS=${OMP_NUM_THREADS:-${SLURM_CPUS_PER_TASK:-1}}
    export PYTHONUNBUFFERED=1
    echo "python: $PYTHON | GPUs per node: $gpus | tasks: ${SLURM_NTASKS:-1} x ${SLURM_CPUS_PER_TASK:-?} CPUs"
    # once per job: a requeued job appends to the same log, which starts with the plan already
    [ "$restarts" = 0 ] && _marketgpt_print_plan "$gpus" "$@"

    _marketgpt_warned=0 _marketgpt_cancelled=0 _marketgpt_interrupted=0 _marketgpt_srun_pid=
    trap _marketgpt_on_usr2 USR2
    trap _marketgpt_on_term TERM
    # srun takes the job's tasks (--ntasks-per-node = GPUs); --cpus-per-task is passed on
    # explicitly because srun 22.05+ no longer inherits it from sbatch. No --kill-on-bad-exit:
    # a rank that exits 75 first must not kill rank 0 while it finishes its log; a rank that
    # dies makes the others stop by themselves (common/distributed/ddp.py).
    srun --cpus-per-task="${SLURM_CPUS_PER_TASK:-1}" \
        "$PYTHON" -m common.cli train --config "$CASE/$CONFIG" --num-gpus "$gpus" --resume auto "$@" &
    _marketgpt_srun_pid=$!
    local rc=0 status
    while :; do
        _marketgpt_interrupted=0
        wait "$_marketgpt_srun_pid"
        status=$?
        [ "$status" = 127 ] && break  # srun's status was already collected (a signal just after it ended)
        rc=$status
        # a trapped signal interrupts `wait` (status 128+n) while srun goes on: wait again
        [ "$_marketgpt_interrupted" = 1 ] || break
    done
    echo "marketgpt: $(date '+%F %T') training exited with code $rc"

    # Requeue after the checkpoint-and-stop exit (75), after a USR2 that reached the tasks
    # before the trainer could catch it, or after a rank was killed (srun's 137: SIGKILL from the
    # OOM killer, the node or an operator, not an error in the run: it resumes from its last
    # checkpoint); never after scancel, never beyond the cap.
    local killed=0
    if [ "$rc" = 137 ]; then
        killed=1
        echo "marketgpt: a rank was killed (SIGKILL: the OOM killer, the node or an operator); the job resumes from its last checkpoint"
    fi
    if [ "$_marketgpt_cancelled" = 0 ] && { [ "$rc" = "$MARKETGPT_EXIT_REQUEUE" ] || [ "$killed" = 1 ] || { [ "$_marketgpt_warned" = 1 ] && [ "$rc" != 0 ]; }; }; then
        local cap=$MARKETGPT_REQUEUE_CAP
        if [ "$restarts" -ge "$cap" ]; then
            echo "marketgpt: not requeued: already restarted $restarts times (MARKETGPT_MAX_REQUEUES=$cap); resubmit to continue"
        else
            _marketgpt_collect_sbatch_out
            echo "marketgpt: $(date '+%F %T') requeueing job $SLURM_JOB_ID; it resumes from the checkpoint"
            if scontrol requeue "$SLURM_JOB_ID"; then
                return 0
            fi
            echo "marketgpt: scontrol requeue failed; resubmit the same script to resume" >&2
        fi
    elif [ "$rc" = "$MARKETGPT_EXIT_REQUEUE" ]; then
        echo "marketgpt: stopped with a checkpoint; submit the same script again to resume"
    fi
    _marketgpt_collect_sbatch_out
    return "$rc"
}
