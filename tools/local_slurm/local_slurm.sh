#!/usr/bin/env bash
# A real Slurm cluster on this one machine: munge + slurmctld + one or two slurmd daemons whose
# nodes claim 2x A100 and 64 CPUs / 256 GB, so the case scripts' exact request schedules here.
# For the tests, CI, and trying the suite on a laptop without a cluster. Needs root (it installs
# Debian's packages and runs the daemons as root).
#
#   tools/local_slurm/local_slurm.sh install        # apt-get install slurmctld slurmd munge
#   tools/local_slurm/local_slurm.sh start [--nodes 1|2] [--own-conf]
#   tools/local_slurm/local_slurm.sh status
#   tools/local_slurm/local_slurm.sh stop
#
# It never touches a Slurm it did not set up:
# - the config goes to $STATE/slurm.conf and is installed as /etc/slurm/slurm.conf (where the
#   client commands look) only when that file is missing or carries this tool's marker line
#   (its first line). Any other slurm.conf belongs to the machine's own Slurm: start refuses.
#   With --own-conf (or LOCAL_SLURM_OWN_CONF=1) it leaves /etc/slurm alone and runs from
#   $STATE/slurm.conf on other ports; commands then need `export SLURM_CONF=$STATE/slurm.conf`
#   ($STATE/slurm_conf names the config in use, for the tests);
# - stop signals only the daemons it started, by the pid files in $STATE;
# - the node names go into /etc/hosts once, on lines marked "# marketgpt-local-slurm", which
#   stop removes.
#
# Environment: LOCAL_SLURM_DIR (state, default /tmp/marketgpt-slurm), LOCAL_SLURM_CONF_DIR
# (default /etc/slurm) and LOCAL_SLURM_HOSTS (default /etc/hosts).
set -euo pipefail

STATE=${LOCAL_SLURM_DIR:-/tmp/marketgpt-slurm}
CONF_DIR=${LOCAL_SLURM_CONF_DIR:-/etc/slurm}
HOSTS=${LOCAL_SLURM_HOSTS:-/etc/hosts}
MARKER="# Written by tools/local_slurm/local_slurm.sh: a one-machine test cluster."
HOSTS_MARK="# marketgpt-local-slurm"
HOST=$(hostname -s)

die() { echo "local_slurm: $*" >&2; exit 1; }
need_root() { [ "$(id -u)" -eq 0 ] || die "needs root (it installs packages and runs slurmctld/slurmd as root); use sudo"; }

cmd_install() {
    need_root
    if command -v slurmctld >/dev/null && command -v slurmd >/dev/null && command -v munged >/dev/null \
        && command -v sbatch >/dev/null; then
        return 0
    fi
    echo "local_slurm: installing slurmctld slurmd slurm-client munge (Debian packages)"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq slurmctld slurmd slurm-client munge >/dev/null
}

# Whether $1 is missing or was written by this tool (its first line is the marker).
ours() { [ ! -e "$1" ] || [ "$(head -n 1 "$1")" = "$MARKER" ]; }

# The config dir start may write: $CONF_DIR when it is free or ours, else refuse. A gres.conf
# beside a slurm.conf of ours is ours too (earlier versions wrote it without the marker).
check_conf_dir() {
    local f files=("$CONF_DIR/slurm.conf")
    [ -e "$CONF_DIR/slurm.conf" ] || files+=("$CONF_DIR/gres.conf")
    for f in ${files[@]+"${files[@]}"}; do
        ours "$f" || die "refusing to start: $f was not written by this tool (its first line is not
  '$MARKER'), so it belongs to this machine's own Slurm, which this tool never touches.
  To run the test cluster beside it with its own config (other ports, nothing under $CONF_DIR):
    $0 start --own-conf        (or LOCAL_SLURM_OWN_CONF=1, e.g. for the tests)
    export SLURM_CONF=$STATE/slurm.conf"
    done
}

# "127.0.0.1 node1 node2  # marketgpt-local-slurm" in $HOSTS, once: node names resolve as on a
# real cluster (the DDP master is the first host of the job).
add_hosts() {
    local names=$1
    grep -qF "$HOSTS_MARK" "$HOSTS" 2>/dev/null && remove_hosts
    echo "127.0.0.1 $names  $HOSTS_MARK" >> "$HOSTS"
}

remove_hosts() {
    [ -f "$HOSTS" ] && grep -qF "$HOSTS_MARK" "$HOSTS" || return 0
    local kept
    kept=$(grep -vF "$HOSTS_MARK" "$HOSTS" || true)
    # rewritten in place (/etc/hosts is often a bind mount that cannot be replaced)
    printf '%s\n' "$kept" > "$HOSTS"
}

write_config() {
    local nodes=$1 conf=$2 port=$3 first=$(($3 + 10184))  # slurmd ports: 17001.. (own config: 27001..)
    mkdir -p "$STATE"/{spool,log,gres}
    # gres.conf needs File= pointing at files that exist, or the node registers with 0 GPUs.
    echo "$MARKER" > "$STATE/gres.conf"
    local n names=""
    for n in $(seq 1 "$nodes"); do
        touch "$STATE/gres/node${n}_gpu0" "$STATE/gres/node${n}_gpu1"
        echo "NodeName=node$n Name=gpu Type=a100 File=$STATE/gres/node${n}_gpu[0-1]" >> "$STATE/gres.conf"
        names+="${names:+ }node$n"
    done
    add_hosts "$names"
    local node_line="NodeName=node[1-$nodes] NodeHostname=$HOST NodeAddr=127.0.0.1 Port=[$first-$((first + nodes - 1))]"
    [ "$nodes" -eq 1 ] && node_line="NodeName=node1 NodeHostname=$HOST NodeAddr=127.0.0.1 Port=$first"
    cat > "$STATE/slurm.conf" <<EOF
$MARKER
ClusterName=marketgpt-local
SlurmctldHost=$HOST(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
# A requeued job restarts after ~20 s instead of ~120 s.
AuthInfo=cred_expire=10
StateSaveLocation=$STATE/spool/ctld
SlurmdSpoolDir=$STATE/spool/%n
SlurmctldPidFile=$STATE/slurmctld.pid
SlurmdPidFile=$STATE/slurmd_%n.pid
SlurmctldLogFile=$STATE/log/slurmctld.log
SlurmdLogFile=$STATE/log/slurmd_%n.log
SlurmctldPort=$port
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
GresTypes=gpu
# Nodes report the CPUs and memory written here, not the machine's, so the case scripts'
# request (2 tasks x 32 CPUs, 128G, gpu:a100:2) schedules unmodified on a small machine.
SlurmdParameters=config_overrides
ReturnToService=2
MinJobAge=300
KillWait=10
# A node whose slurmd stops answering (bench/rehearsal/chaos.py kills one) is down in 30 s, not 5 min.
SlurmdTimeout=30
SchedulerType=sched/backfill
JobRequeue=1
$node_line CPUs=64 RealMemory=262144 Gres=gpu:a100:2 State=UNKNOWN
PartitionName=long Nodes=ALL Default=YES MaxTime=INFINITE State=UP
PartitionName=medium Nodes=ALL MaxTime=2-00:00:00 State=UP
EOF
    if [ "$conf" != "$STATE/slurm.conf" ]; then
        mkdir -p "$CONF_DIR"
        cp "$STATE/slurm.conf" "$CONF_DIR/slurm.conf"
        cp "$STATE/gres.conf" "$CONF_DIR/gres.conf"
    fi
    echo "$nodes" > "$STATE/nodes"
    echo "$conf" > "$STATE/slurm_conf"
}

cmd_start() {
    local nodes=1 own=${LOCAL_SLURM_OWN_CONF:-0}
    while [ $# -gt 0 ]; do
        case $1 in
            --nodes) [ $# -ge 2 ] || die "--nodes needs 1 or 2"; nodes=$2; shift 2 ;;
            --own-conf) own=1; shift ;;
            *) die "unknown option $1" ;;
        esac
    done
    [[ $nodes =~ ^[12]$ ]] || die "--nodes must be 1 or 2"
    local conf=$CONF_DIR/slurm.conf port=6817
    if [ "$own" = 1 ]; then
        conf=$STATE/slurm.conf port=16817  # beside a real slurmctld, which may hold 6817
    else
        check_conf_dir
    fi
    need_root
    cmd_install
    cmd_stop >/dev/null
    write_config "$nodes" "$conf" "$port"
    export SLURM_CONF=$conf

    mkdir -p /run/munge /var/log/munge /var/lib/munge
    if ! pgrep -x munged >/dev/null; then
        munged --force
        cp /run/munge/munged.pid "$STATE/munged.pid" 2>/dev/null || true
    fi
    munge -n | unmunge >/dev/null || die "munge does not work (munge -n | unmunge failed)"

    slurmctld -i -f "$conf"
    local n
    for n in $(seq 1 "$nodes"); do
        slurmd -N "node$n" -f "$conf"
    done
    wait_idle "$nodes"
    [ "$conf" = "$CONF_DIR/slurm.conf" ] || echo "local_slurm: commands need: export SLURM_CONF=$conf"
}

wait_idle() {
    local nodes=$1 idle
    for _ in $(seq 1 60); do
        idle=$(sinfo -h -N -t idle -o "%N" 2>/dev/null | sort -u | wc -l)
        if [ "$idle" -ge "$nodes" ]; then
            echo "local_slurm: $nodes node(s) idle in partition long"
            sinfo -N -o "%N %P %T %C %m %G"
            return 0
        fi
        sleep 1
    done
    sinfo -N -o "%N %T %E" >&2 || true
    tail -n 20 "$STATE"/log/*.log >&2 || true
    die "nodes did not become idle within 60 s (logs in $STATE/log)"
}

# The pid in pid file $1 when that process is still the daemon the file is named for.
daemon_pid() {
    local file=$1 name pid
    name=$(basename "$file" .pid)
    name=${name%%_*}  # slurmd_node1 -> slurmd
    pid=$(cat "$file" 2>/dev/null) || return 1
    [[ $pid =~ ^[0-9]+$ ]] && [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = "$name" ] && echo "$pid"
}

cmd_stop() {
    local file pid pids=()
    for file in "$STATE"/slurmd_*.pid "$STATE"/slurmctld.pid "$STATE"/munged.pid; do
        [ -f "$file" ] || continue
        if pid=$(daemon_pid "$file"); then
            kill "$pid" 2>/dev/null && pids+=("$pid")
        fi
        rm -f "$file"
    done
    for _ in $(seq 1 20); do
        local alive=0
        for pid in ${pids[@]+"${pids[@]}"}; do [ -d "/proc/$pid" ] && alive=1; done
        [ "$alive" = 0 ] && break
        sleep 0.5
    done
    for pid in ${pids[@]+"${pids[@]}"}; do kill -9 "$pid" 2>/dev/null || true; done
    rm -rf "$STATE/spool"
    remove_hosts
    echo "local_slurm: stopped"
}

cmd_status() {
    if ! daemon_pid "$STATE/slurmctld.pid" >/dev/null; then
        die "the test cluster's slurmctld is not running (start it: $0 start)"
    fi
    SLURM_CONF=$(cat "$STATE/slurm_conf")
    export SLURM_CONF
    echo "local_slurm: running; SLURM_CONF=$SLURM_CONF"
    sinfo -N -o "%N %P %T %C %m %G"
    squeue
}

# Sourced (the tests call its functions), it only defines them.
[ "${BASH_SOURCE[0]}" = "$0" ] || return 0

case ${1:-} in
    install) cmd_install ;;
    start) shift; cmd_start "$@" ;;
    stop) cmd_stop ;;
    status) cmd_status ;;
    *) echo "usage: $0 {install|start [--nodes 1|2] [--own-conf]|status|stop}" >&2; exit 2 ;;
esac
