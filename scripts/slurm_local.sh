#!/usr/bin/env bash
# A single-node SLURM cluster on this machine, for trying and testing `launcher=slurm`.
#
#   scripts/slurm_local.sh up       install Debian's slurmctld/slurmd/munge if missing, start them
#   scripts/slurm_local.sh down     stop the daemons and delete their directory
#   scripts/slurm_local.sh status   say whether the cluster answers (exit 1 if not)
#   scripts/slurm_local.sh env      print the `export SLURM_CONF=...` line for `eval`
#   scripts/slurm_local.sh clean-shm  remove MPICH's /dev/shm segments that no process maps
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

DIR=${SLURM_LOCAL_DIR:-/tmp/adpsgd-slurm}
CONF=$DIR/slurm.conf
SOCKET=$DIR/munge/munge.socket.2
# How long a requeued job waits before it may start again (SLURM's credential lifetime,
# 120 s by default): short here so that tests of requeueing stay short.
CRED_EXPIRE_S=${SLURM_LOCAL_CRED_EXPIRE_S:-5}

say() { echo "slurm_local: $*"; }
die() { echo "slurm_local: error: $*" >&2; exit 1; }

answers() {  # the controller replies and the node is usable
    [ -f "$CONF" ] || return 1
    local state
    state=$(SLURM_CONF=$CONF timeout 10 sinfo -h -N -o %t 2>/dev/null | head -n1) || return 1
    case "$state" in idle*|mix*|alloc*|comp*) return 0 ;; *) return 1 ;; esac
}

alive() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

remove_stale_mpi_segments() {  # MPICH's /dev/shm segments that no process maps, older than 1 min
    local segment removed=0
    while IFS= read -r segment; do
        grep -qsF "$segment" /proc/[0-9]*/maps && continue
        rm -f "$segment" && removed=$((removed + 1))
    done < <(find /dev/shm -maxdepth 1 -name 'mpich_*' -mmin +1 2>/dev/null)
    [ "$removed" -eq 0 ] || say "removed $removed stale MPICH segment(s) from /dev/shm (killed ranks leave them)"
}

install_packages() {
    local missing=()
    command -v slurmctld >/dev/null || missing+=(slurmctld)
    command -v slurmd >/dev/null || missing+=(slurmd)
    command -v sbatch >/dev/null || missing+=(slurm-client)
    command -v munged >/dev/null || missing+=(munge)
    [ ${#missing[@]} -eq 0 ] && return 0
    [ "$(id -u)" -eq 0 ] || die "missing ${missing[*]}; install them as root: apt-get install ${missing[*]}"
    command -v apt-get >/dev/null || die "missing ${missing[*]} and no apt-get to install them (Debian or Ubuntu needed)"
    say "installing ${missing[*]} from Debian's packages"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >/dev/null
    # The packages try to start their systemd services; on a machine without systemd that
    # fails harmlessly, and the daemons below run from $DIR instead.
    apt-get install -y -qq --no-install-recommends slurmctld slurmd slurm-client munge >/dev/null \
        || die "apt-get install slurmctld slurmd slurm-client munge failed"
}

write_config() {
    local node_line host
    host=$(hostname -s)
    # The node as slurmd sees it (CPUs, sockets, cores, memory): a node declared larger than
    # the machine would be drained.
    node_line=$(slurmd -C | head -n1)
    [[ "$node_line" == NodeName=* ]] || die "slurmd -C printed no node line: $node_line"
    cat > "$CONF" <<EOF
# Single-node SLURM written by scripts/slurm_local.sh for adpsgd; see docs/slurm.md.
ClusterName=adpsgd-local
MailProg=/bin/true
SlurmctldHost=$host(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$SOCKET,cred_expire=$CRED_EXPIRE_S
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool
SlurmctldPidFile=$DIR/run/slurmctld.pid
SlurmdPidFile=$DIR/run/slurmd.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
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
$node_line NodeAddr=127.0.0.1 State=UNKNOWN
PartitionName=local Nodes=$host Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
EOF
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
    cat <<EOF
slurm_local: single-node SLURM is up (node $(hostname -s), partition local, $(nproc) CPUs)
  export SLURM_CONF=$CONF
  sinfo; squeue
  adpsgd-run recipe=digit_images algo=ssgd launcher=slurm launcher.nodes=1 launcher.procs_per_node=2
  scripts/slurm_local.sh down    # stop it and delete $DIR
EOF
}

up() {
    if answers; then
        usage_note
        return 0
    fi
    install_packages
    [ "$(id -u)" -eq 0 ] || die "run as root: slurmd starts each job's tasks as the user who submitted it"
    stop_daemons  # leftovers of a half-started cluster
    remove_stale_mpi_segments
    mkdir -p "$DIR"/{state,spool,log,run,munge}
    chmod 0700 "$DIR/munge"
    write_config
    start_munge
    SLURM_CONF=$CONF slurmctld -f "$CONF" || die "slurmctld did not start; see $DIR/log/slurmctld.log"
    SLURM_CONF=$CONF slurmd -f "$CONF" || die "slurmd did not start; see $DIR/log/slurmd.log"
    for _ in $(seq 60); do
        if answers; then
            usage_note
            return 0
        fi
        sleep 0.5
    done
    die "the node did not become idle in 30 s: $(SLURM_CONF=$CONF sinfo -h -N -o '%N %t %E' 2>&1 | head -n1); logs in $DIR/log"
}

stop_daemons() {
    local pidfile pid
    for name in slurmd slurmctld munged; do
        pidfile=$DIR/run/$name.pid
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

case "${1:-}" in
    up) up ;;
    down) down ;;
    status) if answers; then say "up: export SLURM_CONF=$CONF"; else say "not running"; exit 1; fi ;;
    clean-shm) remove_stale_mpi_segments ;;
    env) answers || die "not running; start it with scripts/slurm_local.sh up"; echo "export SLURM_CONF=$CONF" ;;
    *) echo "usage: $0 up|down|status|env|clean-shm" >&2; exit 2 ;;
esac
