#!/bin/bash
# Submit several cases at once (each one its own 2-GPU job), as the training guide describes:
#   1. checks that every case script and config exists, that the configs (with --set) are
#      valid and that Slurm answers and knows the scripts' partitions;
#   2. shows the cluster state (sinfo and squeue of those partitions);
#   3. asks for confirmation (-y skips it; with no terminal and no -y nothing is submitted);
#   4. submits each case's slurm_scripts/train_*_a100.sh with sbatch;
#   5. writes monitor_training.sh (queue state, `marketgpt status`, the last log lines);
#   6. prints the job ids and the commands to monitor and cancel them.
#
#   ./launch_parallel_training.sh                    # cases A and B (4 GPUs in all)
#   ./launch_parallel_training.sh --cases a,b,c      # any of a, b, c
#   ./launch_parallel_training.sh --dry-run          # check and show, submit nothing
#   ./launch_parallel_training.sh -y --set training.epochs=5   # no question; --set goes to every case
#
# The cluster environment (module load, conda activate) comes from common/slurm/cluster_env.sh.
set -uo pipefail
# Every possibly-empty array is expanded as ${a[@]+"${a[@]}"}: bash < 4.4 (RHEL/CentOS 7)
# calls a plain "${a[@]}" of an empty array unbound under set -u.

REPO=$(cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")" && pwd)
cd "$REPO" || exit 1

usage() { sed -n '2,/^set /p' "$0" | sed '$d; s/^# \{0,1\}//'; }
die() { echo "launch_parallel_training.sh: $*" >&2; exit 2; }

cases_arg=a,b yes=0 dry_run=0 sets=()
while [ $# -gt 0 ]; do
    case $1 in
        -y|--yes) yes=1; shift ;;
        --dry-run) dry_run=1; shift ;;
        --cases) [ $# -ge 2 ] || die "--cases needs a list, e.g. --cases a,b,c"; cases_arg=$2; shift 2 ;;
        --cases=*) cases_arg=${1#--cases=}; shift ;;
        --set) [ $# -ge 2 ] || die "--set needs KEY=VALUE"; sets+=(--set "$2"); shift 2 ;;
        -h|--help) usage; exit 0 ;;
        *) die "unknown option '$1' (see --help)" ;;
    esac
done

declare -A SCRIPT=([a]=case_a_full_market/slurm_scripts/train_full_a100.sh
                   [b]=case_b_reduced/slurm_scripts/train_reduced_a100.sh
                   [c]=case_c_crypto/slurm_scripts/train_crypto_a100.sh)
declare -A CONFIG=([a]=case_a_full_market/configs/full_market_config.json
                   [b]=case_b_reduced/configs/reduced_config.json
                   [c]=case_c_crypto/configs/crypto_prototype.json)

in_list() {  # in_list WORD [ITEM...]: whether WORD is one of the items
    local word=$1 item
    shift
    for item in "$@"; do [ "$item" = "$word" ] && return 0; done
    return 1
}

# ---------------------------------------------------------------- 1. checks
cases=()
IFS=, read -r -a requested <<<"$cases_arg"
for c in ${requested[@]+"${requested[@]}"}; do
    case ${c,,} in
        a|case_a_full_market) c=a ;;
        b|case_b_reduced) c=b ;;
        c|case_c_crypto) c=c ;;
        *) die "unknown case '$c' in --cases $cases_arg (use a, b, c, e.g. --cases a,b)" ;;
    esac
    in_list "$c" ${cases[@]+"${cases[@]}"} || cases+=("$c")
done
[ ${#cases[@]} -gt 0 ] || die "--cases is empty (use a, b, c)"

for c in ${cases[@]+"${cases[@]}"}; do
    [ -f "${SCRIPT[$c]}" ] || die "missing ${SCRIPT[$c]}"
    [ -f "${CONFIG[$c]}" ] || die "missing ${CONFIG[$c]}"
done
if ! command -v sbatch >/dev/null || ! sinfo -h >/dev/null 2>&1; then
    die "Slurm does not answer (sbatch/sinfo missing or slurmctld down): run this on the cluster's login node"
fi
# module load / conda activate scripts often reference unset variables: no set -u while they run
set +u
# shellcheck source=common/slurm/cluster_env.sh
source "$REPO/common/slurm/cluster_env.sh" || exit 2
set -u

echo "==> Checking the configs"
partitions=()
for c in ${cases[@]+"${cases[@]}"}; do
    # the config with every --set, the case and the partition, exactly as `marketgpt submit` checks them
    if ! check=$("$PYTHON" -m common.cli submit --case "$c" --config "${CONFIG[$c]}" --dry-run ${sets[@]+"${sets[@]}"} 2>&1); then
        echo "$check" | grep -v '^ ' >&2
        die "case $c: fix the error above; nothing was submitted"
    fi
    p=$(sed -n 's/^#SBATCH --partition=\([^ ]*\).*/\1/p' "${SCRIPT[$c]}")
    if [ -z "$p" ] || [ -z "$(sinfo -h -p "$p" -o %P 2>/dev/null)" ]; then
        die "${SCRIPT[$c]} asks for partition '$p', which this cluster does not have ($(sinfo -h -o %R | sort -u | xargs))"
    fi
    echo "    ${SCRIPT[$c]}  (${CONFIG[$c]}, partition ${p:-default})"
    in_list "$p" ${partitions[@]+"${partitions[@]}"} || partitions+=("$p")
done

# ---------------------------------------------------------------- 2. cluster state
plist=$(IFS=,; echo "${partitions[*]-}")
echo "==> Cluster: sinfo -p $plist"
sinfo -p "$plist" -o "%P %D %N %G %C %m"
echo "==> Queue: squeue -p $plist"
squeue -p "$plist"

commands=()
for c in ${cases[@]+"${cases[@]}"}; do
    commands+=("sbatch ${SCRIPT[$c]}$([ ${#sets[@]} -eq 0 ] || printf ' %q' ${sets[@]+"${sets[@]}"})")
done
if [ "$dry_run" = 1 ]; then
    echo "==> Dry run: would submit ${#cases[@]} job(s):"
    printf '    %s\n' ${commands[@]+"${commands[@]}"}
    exit 0
fi

# ---------------------------------------------------------------- 3. confirmation
if [ "$yes" = 0 ]; then
    if [ ! -t 0 ]; then
        echo "No terminal to ask for confirmation and no -y: nothing submitted (rerun with -y to submit)." >&2
        exit 1
    fi
    read -r -p "Submit ${#cases[@]} job(s) (${cases[*]-})? [y/N] " answer
    [[ $answer =~ ^[Yy] ]] || { echo "Nothing submitted."; exit 1; }
fi

# ---------------------------------------------------------------- 4. submit
ids=() logs=()
for c in ${cases[@]+"${cases[@]}"}; do
    if ! out=$(sbatch --parsable "${SCRIPT[$c]}" ${sets[@]+"${sets[@]}"} 2>&1); then
        echo "$out" >&2
        [ ${#ids[@]} -eq 0 ] || echo "Already submitted: ${ids[*]-} (scancel them if you want to start over)" >&2
        die "sbatch ${SCRIPT[$c]} failed"
    fi
    id=${out%%;*}
    prefix=$(sed -n 's/^LOG_PREFIX=//p' "${SCRIPT[$c]}")
    ids+=("$id")
    logs+=("${SCRIPT[$c]%%/*}/logs/${prefix}_${id}.out")
    echo "Submitted case $c: job $id"
done

# ---------------------------------------------------------------- 5. monitoring script
job_list=$(IFS=,; echo "${ids[*]-}")
monitor=monitor_training.sh
cat >"$monitor" <<EOF
#!/bin/bash
# Written by launch_parallel_training.sh on $(date '+%F %T') for jobs $job_list.
# ./$monitor            one look: queue state, every run, the last lines of each log
# ./$monitor --watch    the same every 60 s (Ctrl-C to stop)
REPO=\$(cd "\$(dirname "\$(readlink -f "\${BASH_SOURCE[0]}")")" && pwd)
cd "\$REPO" || exit 1
# shellcheck source=common/slurm/cluster_env.sh
source "\$REPO/common/slurm/cluster_env.sh" || exit 1
show() {
    echo "== \$(date '+%F %T') jobs $job_list"
    squeue -t all -j "$job_list" -o "%i %P %j %u %T %M %D %R" 2>/dev/null || echo "(the jobs have left the queue)"
    echo; "\$PYTHON" -m common.cli status
    for log in ${logs[*]-}; do
        echo; echo "-- \$log"; tail -n 4 "\$log" 2>/dev/null || echo "(no log yet: the job has not started)"
    done
}
if [ "\${1:-}" = --watch ]; then while :; do clear; show; sleep 60; done; else show; fi
EOF
chmod +x "$monitor"

# ---------------------------------------------------------------- 6. summary
echo
echo "Jobs: $job_list"
echo "Monitor:  ./$monitor   (or ./$monitor --watch)"
echo "          squeue -j $job_list"
for log in ${logs[@]+"${logs[@]}"}; do echo "          tail -f $log"; done
echo "Cancel:   scancel ${ids[*]-}   (each leaves a checkpoint; submit again to resume)"
