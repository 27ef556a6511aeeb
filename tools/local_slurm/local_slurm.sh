#!/usr/bin/env bash
# A real Slurm cluster on this one machine: munge + slurmctld + one or two slurmd daemons whose
# nodes claim 2x A100 and 64 CPUs / 256 GB, so the case scripts' exact request schedules here.
# For the tests, CI, and trying the suite on a laptop without a cluster. Needs root (it installs
# Debian's packages and runs the daemons as root).
#
#   tools/local_slurm/local_slurm.sh install        # apt-get install slurmctld slurmd munge
#   tools/local_slurm/local_slurm.sh start [--nodes 1|2]
#   tools/local_slurm/local_slurm.sh status
#   tools/local_slurm/local_slurm.sh stop
#
# State lives in $LOCAL_SLURM_DIR (default /tmp/marketgpt-slurm). The config written there is
# also installed as /etc/slurm/slurm.conf, where the client commands (sbatch, squeue) look.
set -euo pipefail

STATE=${LOCAL_SLURM_DIR:-/tmp/marketgpt-slurm}
CONF_DIR=/etc/slurm
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

write_config() {
    local nodes=$1
    mkdir -p "$STATE"/{spool,log,gres} "$CONF_DIR"
    # gres.conf needs File= pointing at files that exist, or the node registers with 0 GPUs.
    : > "$STATE/gres.conf"
    local n
    for n in $(seq 1 "$nodes"); do
        touch "$STATE/gres/node${n}_gpu0" "$STATE/gres/node${n}_gpu1"
        echo "NodeName=node$n Name=gpu Type=a100 File=$STATE/gres/node${n}_gpu[0-1]" >> "$STATE/gres.conf"
        # node names resolve like on a real cluster (the DDP master is the first host of the job)
        grep -qE "^127\.0\.0\.1[[:space:]].*\bnode$n\b" /etc/hosts || echo "127.0.0.1 node$n" >> /etc/hosts
    done
    cat > "$STATE/slurm.conf" <<EOF
# Written by tools/local_slurm/local_slurm.sh: a one-machine test cluster.
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
SlurmctldPort=6817
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
SchedulerType=sched/backfill
JobRequeue=1
NodeName=node[1-$nodes] NodeHostname=$HOST NodeAddr=127.0.0.1 Port=[17001-$((17000 + nodes))] CPUs=64 RealMemory=262144 Gres=gpu:a100:2 State=UNKNOWN
PartitionName=long Nodes=ALL Default=YES MaxTime=INFINITE State=UP
PartitionName=medium Nodes=ALL MaxTime=2-00:00:00 State=UP
EOF
    [ "$nodes" -eq 1 ] && sed -i 's/NodeName=node\[1-1\]/NodeName=node1/; s/Port=\[17001-17001\]/Port=17001/' "$STATE/slurm.conf"
    cp "$STATE/slurm.conf" "$CONF_DIR/slurm.conf"
    cp "$STATE/gres.conf" "$CONF_DIR/gres.conf"
    echo "$nodes" > "$STATE/nodes"
}

cmd_start() {
    local nodes=1
    while [ $# -gt 0 ]; do
        case $1 in
            --nodes) nodes=$2; shift 2 ;;
            *) die "unknown option $1" ;;
        esac
    done
    [[ $nodes =~ ^[12]$ ]] || die "--nodes must be 1 or 2"
    need_root
    cmd_install
    cmd_stop >/dev/null 2>&1 || true
    write_config "$nodes"

    mkdir -p /run/munge /var/log/munge /var/lib/munge
    pgrep -x munged >/dev/null || munged --force
    munge -n | unmunge >/dev/null || die "munge does not work (munge -n | unmunge failed)"

    slurmctld -i -f "$CONF_DIR/slurm.conf"
    local n
    for n in $(seq 1 "$nodes"); do
        slurmd -N "node$n" -f "$CONF_DIR/slurm.conf"
    done
    wait_idle "$nodes"
}

wait_idle() {
    local nodes=$1 i idle
    for i in $(seq 1 60); do
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

cmd_stop() {
    local pidfile
    for pidfile in "$STATE"/slurmd_*.pid "$STATE"/slurmctld.pid; do
        [ -f "$pidfile" ] || continue
        kill "$(cat "$pidfile")" 2>/dev/null || true
    done
    pkill -x slurmd 2>/dev/null || true
    pkill -x slurmctld 2>/dev/null || true
    local i
    for i in $(seq 1 20); do
        pgrep -x slurmd >/dev/null || pgrep -x slurmctld >/dev/null || break
        sleep 0.5
    done
    pkill -9 -x slurmd 2>/dev/null || true
    pkill -9 -x slurmctld 2>/dev/null || true
    rm -rf "$STATE/spool"
    echo "local_slurm: stopped"
}

cmd_status() {
    pgrep -x slurmctld >/dev/null || die "slurmctld is not running (start it: $0 start)"
    sinfo -N -o "%N %P %T %C %m %G"
    squeue
}

case ${1:-} in
    install) cmd_install ;;
    start) shift; cmd_start "$@" ;;
    stop) cmd_stop ;;
    status) cmd_status ;;
    *) echo "usage: $0 {install|start [--nodes 1|2]|status|stop}" >&2; exit 2 ;;
esac
