#!/usr/bin/env bash
# A single-node SLURM cluster on this machine, for trying and testing `launcher=slurm`.
#
#   scripts/slurm_local.sh up       install Debian's slurmctld/slurmd/munge if missing, start them
#   scripts/slurm_local.sh down     stop the daemons and delete their directory
#   scripts/slurm_local.sh status   say whether the cluster answers (exit 1 if not)
#   scripts/slurm_local.sh env      print the `export SLURM_CONF=...` line for `eval`
#   scripts/slurm_local.sh clean-shm  remove MPICH's /dev/shm segments that no process maps
#   scripts/slurm_local.sh up --nodes N   a cluster of N nodes: one slurmd on each host of
#                                   the lab (scripts/lab_cluster.sh, brought up if needed)
#   scripts/slurm_local.sh down|status|env --lab   the same commands for that cluster
#   scripts/slurm_local.sh start-node NODE --lab   start that node's slurmd again (after it was
#                                   killed, as a lost node that comes back)
#
# Everything (slurm.conf, munge key and socket, state, spool, logs, pid files) lives in one
# directory, $SLURM_LOCAL_DIR (default /tmp/adpsgd-slurm); nothing under /etc is touched, so
# the SLURM commands find this cluster through SLURM_CONF. The daemons talk over 127.0.0.1
# only. `up` and `down` are idempotent. Runs as root: slurmd starts tasks as the submitting
# user. Settings that work without systemd or cgroups: ProctrackType=proctrack/linuxproc,
# TaskPlugin=task/none, no cgroup.conf; MpiDefault=pmi2 (the pip MPICH speaks SLURM's PMI-2).
#
# Job ids never repeat across bring-ups (FirstJobId from the clock): under PMI-2, MPICH names
# its shared-memory segment after the job and step id, and a rank killed with -9 leaves that
# segment in /dev/shm. A later step with the same ids would open the stale segment and fail in
# MPI_Init ("Message truncated"). `up` and `down` also remove MPICH segments that no process
# maps, as a cluster's epilog does.
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/shm_segments.sh"
NODES=0  # 0: the single-node cluster on this machine; N: N nodes on the lab's hosts
COMMAND=${1:-}
shift || true
NODE=""
if [ "$COMMAND" = start-node ] && [ $# -gt 0 ] && [[ "$1" != --* ]]; then
    NODE=$1
    shift
fi
while [ $# -gt 0 ]; do
    case "$1" in
        --nodes) NODES=${2:-}; shift 2 || true
                 [[ "$NODES" =~ ^[1-9][0-9]*$ ]] || { echo "slurm_local: error: --nodes needs a number of nodes (1 or more)" >&2; exit 2; } ;;
        --lab) NODES=lab; shift ;;
        *) echo "slurm_local: error: unknown option '$1' (--nodes N or --lab)" >&2; exit 2 ;;
    esac
done
if [ "$NODES" = 0 ]; then
    DIR=${SLURM_LOCAL_DIR:-/tmp/adpsgd-slurm}
    CTLD_PORT=6817 SLURMD_PORT=6818
else  # beside the single-node cluster: its own directory and ports
    DIR=${SLURM_LOCAL_DIR:-/tmp/adpsgd-slurm-lab}
    CTLD_PORT=6917 SLURMD_PORT=6918
    LAB_HEAD=${LAB_SUBNET:-10.213.0}.254
    # --lab: as many nodes as the cluster was made with
    [ "$NODES" != lab ] || NODES=$(cat "$DIR/nodes" 2>/dev/null || echo 0)
fi

CONF=$DIR/slurm.conf
SOCKET=$DIR/munge/munge.socket.2
# How long a requeued job waits before it may start again (SLURM's credential lifetime,
# 120 s by default): short here so that tests of requeueing stay short.
CRED_EXPIRE_S=${SLURM_LOCAL_CRED_EXPIRE_S:-5}

say() { echo "slurm_local: $*"; }
die() { echo "slurm_local: error: $*" >&2; exit 1; }

answers() {  # the controller replies and every node is usable
    [ -f "$CONF" ] || return 1
    local states state
    states=$(SLURM_CONF=$CONF timeout 10 sinfo -h -N -o %t 2>/dev/null) || return 1
    [ -n "$states" ] || return 1
    for state in $states; do
        case "$state" in idle*|mix*|alloc*|comp*) ;; *) return 1 ;; esac
    done
}

lab_hosts() {  # the lab's hosts that are nodes of this cluster, in order
    head -n "$NODES" "${LAB_DIR:-/run/adpsgd-lab}/hosts" 2>/dev/null
}

lab_address() {  # a lab host's address, from its hosts file
    awk -v h="$1" '$2 == h {print $1}' "/etc/netns/$1/hosts"
}

alive() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

remove_stale_mpi_segments() {  # MPICH's /dev/shm segments that no process maps, older than 1 min
    local removed
    removed=$(remove_unmapped_segments -name 'mpich_*' -mmin +1)
    [ "$removed" -eq 0 ] || say "removed $removed stale MPICH segment(s) from /dev/shm (killed ranks leave them)"
}

install_packages() {
    local missing=()
    command -v slurmctld >/dev/null || missing+=(slurmctld)
    command -v slurmd >/dev/null || missing+=(slurmd)
    command -v sbatch >/dev/null || missing+=(slurm-client)
    command -v munged >/dev/null || missing+=(munge)
    # SLURM's PMIx plugin (srun --mpi=pmix: an elastic job's Open MPI ranks) opens libpmix.so
    dpkg -s libpmix-dev >/dev/null 2>&1 || missing+=(libpmix-dev)
    [ ${#missing[@]} -eq 0 ] && return 0
    [ "$(id -u)" -eq 0 ] || die "missing ${missing[*]}; install them as root: apt-get install ${missing[*]}"
    command -v apt-get >/dev/null || die "missing ${missing[*]} and no apt-get to install them (Debian or Ubuntu needed)"
    say "installing ${missing[*]} from Debian's packages"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >/dev/null
    # The packages try to start their systemd services; on a machine without systemd that
    # fails harmlessly, and the daemons below run from $DIR instead.
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null \
        || die "apt-get install ${missing[*]} failed"
}

write_config() {
    local node_line host nodes controller partition node
    host=$(hostname -s)
    # The node as slurmd sees it (CPUs, sockets, cores, memory): a node declared larger than
    # the machine would be drained.
    node_line=$(slurmd -C | head -n1)
    [[ "$node_line" == NodeName=* ]] || die "slurmd -C printed no node line: $node_line"
    if [ "$NODES" = 0 ]; then
        controller="$host(127.0.0.1)"
        nodes="$node_line NodeAddr=127.0.0.1 State=UNKNOWN"
        partition=$host
    else  # every lab host is a node at its address (they share this machine's cores)
        controller="$host($LAB_HEAD)"
        nodes=""
        for node in $(lab_hosts); do
            nodes+="${node_line/NodeName=$host/NodeName=$node} NodeAddr=$(lab_address "$node") State=UNKNOWN"$'\n'
        done
        partition=$(lab_hosts | paste -sd, -)
    fi
    cat > "$CONF" <<EOF
# SLURM written by scripts/slurm_local.sh for adpsgd; see docs/slurm.md.
ClusterName=adpsgd-local
MailProg=/bin/true
SlurmctldHost=$controller
SlurmctldPort=$CTLD_PORT
SlurmdPort=$SLURMD_PORT
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$SOCKET,cred_expire=$CRED_EXPIRE_S
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool/%n
# Per node: the lab's hosts share /tmp, and SLURM's PMIx plugin makes its step directories there
TmpFS=$DIR/tmp/%n
SlurmctldPidFile=$DIR/run/slurmctld.pid
SlurmdPidFile=$DIR/run/slurmd.%n.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd.%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
$( [ "$NODES" = 0 ] || echo "TaskProlog=$DIR/task_prolog.sh" )
MpiDefault=pmi2
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
ReturnToService=2
JobRequeue=1
FirstJobId=$(( $(date +%s) % 60000000 + 1 ))
MinJobAge=600
KillWait=10
SchedulerParameters=sched_interval=2
$nodes
PartitionName=local Nodes=$partition Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
EOF
    if [ "$NODES" != 0 ]; then
        # The lab's hosts share one kernel, so MPI's network layer must be told to cross the
        # links: MPICH over libfabric's tcp provider on eth0 (UCX, which the lab's ssh entry
        # uses under mpiexec, sees one machine, and its addresses across the hosts did not
        # pass through SLURM's PMI-2: "value not properly terminated in client request").
        cat > "$DIR/task_prolog.sh" <<'EOF'
#!/bin/sh
echo "export MPIR_CVAR_CH4_NETMOD=${MPIR_CVAR_CH4_NETMOD:-ofi}"
echo "export FI_PROVIDER=${FI_PROVIDER:-tcp}"
echo "export FI_TCP_IFACE=eth0"
EOF
        chmod +x "$DIR/task_prolog.sh"
        echo "$NODES" > "$DIR/nodes"
    fi
}

start_slurmd() {
    if [ "$NODES" = 0 ]; then
        mkdir -p "$DIR/spool/$(hostname -s)" "$DIR/tmp/$(hostname -s)"
        SLURM_CONF=$CONF slurmd -f "$CONF" || die "slurmd did not start; see $DIR/log/slurmd.$(hostname -s).log"
        return
    fi
    local node mounts
    mounts=$(cgroup_mounts)
    for node in $(lab_hosts); do  # inside the host: its address, its hostname
        mkdir -p "$DIR/spool/$node" "$DIR/tmp/$node"
        bash "$HERE/lab_cluster.sh" ssh "$node" "$mounts SLURM_CONF=$CONF slurmd -f $CONF -N $node" \
            || die "slurmd did not start on $node; see $DIR/log/slurmd.$node.log"
    done
}

start_node() {  # a lab node's slurmd again (after it was killed: a node lost and back)
    local node=$1
    [ "$NODES" != 0 ] || die "start-node is for the cluster on the lab (add --lab)"
    [ -n "$node" ] && lab_hosts | grep -qx "$node" \
        || die "'$node' is not a node of the lab's cluster ($(lab_hosts | paste -sd' ' -))"
    if alive "$DIR/run/slurmd.$node.pid"; then
        say "slurmd on $node runs already"
        return 0
    fi
    bash "$HERE/lab_cluster.sh" ssh "$node" "$(cgroup_mounts) SLURM_CONF=$CONF slurmd -f $CONF -N $node" \
        || die "slurmd did not start on $node; see $DIR/log/slurmd.$node.log"
    say "slurmd on $node started"
}

cgroup_mounts() {  # shell commands that mount this machine's cgroup file systems again
    # Entering a lab host mounts a fresh /sys (its network devices), without the cgroup file
    # systems that slurmd checks against /proc/self/cgroup: mount them as they are here.
    awk '$2 ~ "^/sys/fs/cgroup" && ($3 == "tmpfs" || $3 ~ /^cgroup/) {
             printf "mkdir -p %s && mount -t %s -o %s %s %s && ", $2, $3, $4, $1, $2 }' /proc/self/mounts
}

bring_up_lab() {  # the lab, with at least NODES hosts
    local have
    have=$(wc -l < "${LAB_DIR:-/run/adpsgd-lab}/hosts" 2>/dev/null || echo 0)
    if [ "$have" -lt "$NODES" ] || ! bash "$HERE/lab_cluster.sh" status >/dev/null 2>&1; then
        bash "$HERE/lab_cluster.sh" up "$(( have > NODES ? have : NODES ))" >/dev/null \
            || die "the lab did not come up (scripts/lab_cluster.sh up $NODES)"
    fi
}

start_munge() {
    alive "$DIR/run/munged.pid" && return 0
    [ -f "$DIR/munge/munge.key" ] || mungekey --create --keyfile="$DIR/munge/munge.key" 2>/dev/null \
        || dd if=/dev/urandom of="$DIR/munge/munge.key" bs=1024 count=1 status=none
    chmod 0400 "$DIR/munge/munge.key"
    # --force: munged refuses directories it considers insecure (/tmp is world-writable).
    munged --force --key-file="$DIR/munge/munge.key" --socket="$SOCKET" \
        --pid-file="$DIR/run/munged.pid" --log-file="$DIR/log/munged.log" \
        --seed-file="$DIR/munge/munged.seed" || die "munged did not start; see $DIR/log/munged.log"
}

usage_note() {
    if [ "$NODES" = 0 ]; then
        cat <<EOF
slurm_local: single-node SLURM is up (node $(hostname -s), partition local, $(nproc) CPUs)
  export SLURM_CONF=$CONF
  sinfo; squeue
  adpsgd-run recipe=digit_images algo=ssgd launcher=slurm launcher.nodes=1 launcher.procs_per_node=2
  scripts/slurm_local.sh down    # stop it and delete $DIR
EOF
    else
        cat <<EOF
slurm_local: SLURM on the lab is up ($NODES nodes: $(lab_hosts | paste -sd' ' -), partition local)
  export SLURM_CONF=$CONF
  sinfo; squeue
  adpsgd-run recipe=digit_images algo=ssgd launcher=slurm launcher.nodes=$NODES launcher.procs_per_node=1
  scripts/slurm_local.sh down --lab    # stop it and delete $DIR (the lab stays: lab_cluster.sh down)
EOF
    fi
}

up() {
    if [ "$NODES" != 0 ] && [ -f "$DIR/nodes" ] && [ "$(cat "$DIR/nodes")" != "$NODES" ]; then
        down  # another number of nodes: start over
    elif [ -f "$CONF" ] && ! grep -q '^TmpFS=' "$CONF"; then
        down  # written by an older version of this script, without the PMIx plugin's needs
    fi
    if answers; then
        usage_note
        return 0
    fi
    install_packages
    [ "$(id -u)" -eq 0 ] || die "run as root: slurmd starts each job's tasks as the user who submitted it"
    [ "$NODES" = 0 ] || bring_up_lab
    stop_daemons  # leftovers of a half-started cluster
    remove_stale_mpi_segments
    mkdir -p "$DIR"/{state,spool,log,run,munge}
    chmod 0700 "$DIR/munge"
    write_config
    start_munge
    SLURM_CONF=$CONF slurmctld -f "$CONF" || die "slurmctld did not start; see $DIR/log/slurmctld.log"
    start_slurmd
    for _ in $(seq 60); do
        if answers; then
            usage_note
            return 0
        fi
        sleep 0.5
    done
    die "the nodes did not become idle in 30 s: $(SLURM_CONF=$CONF sinfo -h -N -o '%N %t %E' 2>&1 | paste -sd';' -); logs in $DIR/log"
}

stop_daemons() {
    local pidfile pid
    for pidfile in "$DIR"/run/slurmd*.pid "$DIR/run/slurmctld.pid" "$DIR/run/munged.pid"; do
        alive "$pidfile" || continue
        pid=$(cat "$pidfile")
        kill "$pid" 2>/dev/null || true
        for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
        kill -9 "$pid" 2>/dev/null || true
    done
}

down() {
    # Job steps started by slurmd (slurmstepd) outlive it; end them before the daemons.
    if answers; then
        SLURM_CONF=$CONF scancel --full --quiet --signal=KILL --user="$(id -un)" 2>/dev/null || true
        SLURM_CONF=$CONF scancel --quiet --user="$(id -un)" 2>/dev/null || true
        sleep 1
    fi
    stop_daemons
    remove_stale_mpi_segments
    rm -rf "$DIR"
    say "stopped; removed $DIR"
}

case "$COMMAND" in
    up) up ;;
    down) down ;;
    status) if answers; then say "up: export SLURM_CONF=$CONF"; else say "not running"; exit 1; fi ;;
    clean-shm) remove_stale_mpi_segments ;;
    start-node) start_node "${NODE:-}" ;;
    env) answers || die "not running; start it with scripts/slurm_local.sh up"; echo "export SLURM_CONF=$CONF" ;;
    *) echo "usage: $0 up [--nodes N]|down|status|env|clean-shm [--lab] | start-node NODE --lab" >&2; exit 2 ;;
esac
